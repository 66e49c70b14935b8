"""Run one case eagerly and through ORTModule, side by side, and classify the result.

A case is a module (already constructed, in its dtype and train/eval mode) and its forward
inputs. Three copies start from identical weights: eager, ORTModule, and — for float32 cases —
an eager float64 copy, the referee. Each takes two steps:

    forward (fresh copies of the inputs) -> weighted sum of the float outputs -> backward
    -> torch.optim.SGD step (plain SGD: Adam would turn rounding noise in a mathematically-zero
    gradient into a full-size step and make the second step meaningless)

Everything observable is recorded per step under a readable name ("step1 grad weight",
"step0 output[0]", "step1 buffer running_mean") and compared ortmod-vs-eager, each tensor
relative to its own size. When a float32 value disagrees, the float64 run decides: if ortmod's
error against it is no worse than twice eager's own, both are rounding the same exact answer
differently (summation order) and it is not a mismatch.

Eval cases run the forward under torch.no_grad() (validation, the usual reason for eval) and
compare outputs and buffers over two calls. Eval *with* gradients is a pattern of its own
(tests/conformance/patterns.py).

Statuses: PASS, MISMATCH (something differs and nothing raised: the defect that matters most),
CLEAN-ERROR (ortmod, or its export, raised), SKIP (eager itself fails on the case). CRASH/HANG
are decided by the parent process (tests/conformance/runner.py), which sees the worker die.
"""
import copy
import time
import warnings

import torch
import torch.utils._pytree as pytree

import ortmod
from ortmod import _pipeline as _ortmod_pipeline

from .runner import CLEAN_ERROR, MISMATCH, PASS, SKIP

# Per dtype: (rtol relative to the tensor's own max |value|, absolute floor). The floor absorbs
# rounding noise in values that are mathematically zero (a gradient that cancels exactly).
TOLERANCE = {torch.float32: (1e-4, 1e-6), torch.float64: (1e-7, 1e-10)}
REFEREE_FACTOR = 2.0     # ortmod may be this many times further from float64 than eager is
STEPS = 2
LR = 0.1


class Case:
    """What run_case needs. ``inputs`` is (args, kwargs); tensors in it are templates, copied per side.

    ``training`` is the module's mode; ``backprop`` (default: the same) whether the steps take
    gradients and SGD steps, or run the forward under torch.no_grad()."""

    def __init__(self, case_id, module, inputs, dtype, training, desc="", backprop=None):
        self.id, self.module, self.inputs = case_id, module, inputs
        self.dtype, self.training, self.desc = dtype, training, desc
        self.backprop = training if backprop is None else backprop


# --------------------------------------------------------------------------- engine-ran check
#
# ORTModule runs the engine through _function.run_training / run_inference (imported into
# ortmod._pipeline). Counting those calls proves that a wrapped call really ran the engine and
# did not quietly run the module in PyTorch.

ENGINE_CALLS = [0]


def _counting(fn):
    def wrapper(*args, **kwargs):
        ENGINE_CALLS[0] += 1
        return fn(*args, **kwargs)
    wrapper.__wrapped__ = fn
    return wrapper


if not hasattr(_ortmod_pipeline.run_training, "__wrapped__"):
    _ortmod_pipeline.run_training = _counting(_ortmod_pipeline.run_training)
    _ortmod_pipeline.run_inference = _counting(_ortmod_pipeline.run_inference)


# --------------------------------------------------------------------------- copying inputs

def copy_tensor(t, dtype=None):
    """A new leaf with t's values, layout (strides, storage offset) and requires_grad.

    The layout is kept because non-contiguous and channels-last inputs are cases of their own;
    ``dtype`` (the float64 referee) converts floating tensors and drops the layout."""
    with torch.no_grad():
        if dtype is not None and t.is_floating_point():
            c = t.detach().to(dtype)
        else:
            c = torch.empty(0, dtype=t.dtype, device=t.device)
            c.set_(t.untyped_storage().clone(), t.storage_offset(), t.size(), t.stride())
    return c.requires_grad_(t.requires_grad and c.is_floating_point())


def copy_inputs(inputs, dtype=None):
    return pytree.tree_map_only(torch.Tensor, lambda t: copy_tensor(t, dtype), inputs)


# --------------------------------------------------------------------------- comparing

def tensor_diff(got, want, dtype):
    """None when ``got`` matches ``want``; else a dict saying how it differs."""
    if got.shape != want.shape:
        return {"kind": "shape", "note": f"shape {tuple(got.shape)} (ortmod) vs {tuple(want.shape)} (eager)"}
    if got.dtype != want.dtype:
        return {"kind": "dtype", "note": f"dtype {got.dtype} (ortmod) vs {want.dtype} (eager)"}
    got, want = got.detach(), want.detach()
    if not want.is_floating_point():
        if torch.equal(got, want):
            return None
        bad = (got != want).sum().item()
        d = (got.double() - want.double()).abs().max().item()
        return {"kind": "value", "max_abs": d, "scale": want.double().abs().max().item() if want.numel() else 0.0,
                "note": f"{bad}/{want.numel()} elements differ (exact comparison)"}
    g, w = got.double(), want.double()
    fin_w, fin_g = torch.isfinite(w), torch.isfinite(g)
    same_special = (g[~fin_w] == w[~fin_w]) | (torch.isnan(g[~fin_w]) & torch.isnan(w[~fin_w]))
    if not torch.equal(fin_w, fin_g) or not bool(same_special.all()):
        return {"kind": "nonfinite", "note": f"inf/nan pattern differs: ortmod {(~fin_g).sum().item()}, "
                                             f"eager {(~fin_w).sum().item()} non-finite elements"}
    if not bool(fin_w.any()):
        return None
    rtol, floor = TOLERANCE.get(dtype, TOLERANCE[torch.float32])
    scale = w[fin_w].abs().max().item()
    d = (g[fin_w] - w[fin_w]).abs()
    bad = d > floor + rtol * scale
    if not bool(bad.any()):
        return None
    return {"kind": "value", "max_abs": d.max().item(), "scale": scale,
            "note": f"{bad.sum().item()}/{w.numel()} elements beyond tolerance"}


def _max_err(x, ref):
    x, ref = x.detach().double(), ref.detach().double()
    fin = torch.isfinite(ref) & torch.isfinite(x)
    return (x[fin] - ref[fin]).abs().max().item() if bool(fin.any()) else 0.0


def value_diff(got, want, dtype):
    """Like tensor_diff for any recorded value: tensors, None (no gradient), Python values."""
    if isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor):
        return tensor_diff(got, want, dtype)
    if isinstance(want, torch.Tensor) or isinstance(got, torch.Tensor):
        show = lambda v: "a tensor" if isinstance(v, torch.Tensor) else repr(v)  # noqa: E731
        return {"kind": "presence", "note": f"ortmod has {show(got)}, eager has {show(want)}"}
    if got != want:
        return {"kind": "value", "note": f"ortmod {got!r} vs eager {want!r}"}
    return None


def referee_accepts(diff, got, want, ref, dtype):
    """float32 only: is ortmod as close to the float64 answer as eager is?"""
    if (diff["kind"] != "value" or dtype != torch.float32 or not isinstance(ref, torch.Tensor)
            or not want.is_floating_point() or ref.shape != want.shape):
        return False
    err_ortmod, err_eager = _max_err(got, ref), _max_err(want, ref)
    floor = TOLERANCE[torch.float32][1]
    diff["referee"] = {"ortmod_vs_fp64": err_ortmod, "eager_vs_fp64": err_eager}
    return err_ortmod <= REFEREE_FACTOR * err_eager + floor


# --------------------------------------------------------------------------- one side

class EagerFailed(Exception):
    """Eager PyTorch raised: the case is not one ortmod can be held to."""


class OrtmodFailed(Exception):
    def __init__(self, where, exc):
        super().__init__(f"{where}: {type(exc).__name__}: {exc}")
        self.where, self.exc = where, exc


class Side:
    """One copy of the module taking the steps; ``record`` maps names to observed values."""

    def __init__(self, name, module, dtype, backprop, ort=None):
        self.name, self.module, self.dtype, self.backprop, self.ort = name, module, dtype, backprop, ort
        self.record = {}
        params = [p for p in module.parameters() if p.requires_grad]
        self.opt = torch.optim.SGD(params, lr=LR) if backprop and params else None

    def _guard(self, where, fn):
        try:
            return fn()
        except Exception as e:
            if self.name == "eager":
                raise EagerFailed(f"{where}: {type(e).__name__}: {str(e).strip()[:200]}") from e
            raise OrtmodFailed(where, e) from e

    def forward(self, step, inputs):
        """Forward on fresh copies of ``inputs``; returns the flat output leaves."""
        self.inputs = copy_inputs(inputs, self.dtype if self.name == "fp64" else None)
        args, kwargs = self.inputs
        before = ENGINE_CALLS[0]
        with torch.enable_grad() if self.backprop else torch.no_grad():
            out = self._guard(f"step{step} forward", lambda: self.module(*args, **kwargs))
        if self.ort is not None:
            if self.ort._ortmod_fallback is not None:
                raise OrtmodFailed(f"step{step} forward", RuntimeError(f"fell back to PyTorch: {self.ort._ortmod_fallback}"))
            if ENGINE_CALLS[0] == before:
                # no exception and no engine: a silent fallback, which the policy forbids
                self.record[f"step{step} engine ran"] = False
        leaves, spec = pytree.tree_flatten(out)
        self.record[f"step{step} output structure"] = str(spec)
        for i, leaf in enumerate(leaves):
            key = f"step{step} output[{i}]"
            if isinstance(leaf, torch.Tensor):
                self.record[key] = leaf.detach().clone()
                if self.backprop:
                    self.record[key + " requires_grad"] = leaf.requires_grad
            else:
                self.record[key] = leaf
        self.leaves = leaves
        return leaves

    def backward(self, step, weights):
        """Backward of sum(w_i * output_i) for the outputs eager differentiates, then an SGD step."""
        if not self.backprop:
            self._record_state(step)
            return
        terms = []
        for i, w in weights.items():
            leaf = self.leaves[i] if i < len(self.leaves) else None     # (a structure mismatch is recorded)
            if isinstance(leaf, torch.Tensor) and leaf.requires_grad and leaf.shape == w.shape:
                terms.append((leaf * w.to(leaf.dtype)).sum())
        if terms:
            self._guard(f"step{step} backward", lambda: sum(terms).backward())
        paths, _ = pytree.tree_flatten_with_path(self.inputs)
        for path, t in paths:
            if isinstance(t, torch.Tensor) and t.requires_grad:
                self.record[f"step{step} grad input{pytree.keystr(path)}"] = t.grad
        for n, p in self.module.named_parameters():
            self.record[f"step{step} grad {n}"] = None if p.grad is None else p.grad.detach().clone()
        if self.opt is not None:
            self._guard(f"step{step} optimizer", self.opt.step)
            self.opt.zero_grad(set_to_none=True)
        self._record_state(step)

    def _record_state(self, step):
        if self.backprop:
            for n, p in self.module.named_parameters():
                self.record[f"step{step} param {n}"] = p.detach().clone()
        for n, b in self.module.named_buffers():
            self.record[f"step{step} buffer {n}"] = b.detach().clone()


def _weights(step, leaves, dtype):
    """Random weights for the float outputs that require grad (eager's), the same for every side."""
    g = torch.Generator().manual_seed(1000 + step)
    out = {}
    for i, leaf in enumerate(leaves):
        if isinstance(leaf, torch.Tensor) and leaf.is_floating_point() and leaf.requires_grad:
            out[i] = torch.randn(leaf.shape, generator=g, dtype=torch.float64).to(dtype)
    return out


# --------------------------------------------------------------------------- one case

def _first_line(exc):
    text = str(exc).strip()
    return (text.splitlines()[0] if text else "")[:300]


def _materialize_lazy(module, inputs):
    # A lazy module draws its weights at the first forward: do that once here, so that every
    # copy starts from the same weights (uninitialized copies would each draw their own).
    if any(isinstance(m, torch.nn.modules.lazy.LazyModuleMixin) and m.has_uninitialized_params()
           for m in module.modules()):
        args, kwargs = copy_inputs(inputs)
        with torch.no_grad():
            module(*args, **kwargs)


def run_case(case):
    """Run ``case``; returns a JSON-able record (status, what differed or what raised)."""
    t0 = time.time()
    rec = {"id": case.id, "desc": case.desc, "dtype": str(case.dtype).replace("torch.", ""),
           "mode": "train" if case.training else ("eval+grad" if case.backprop else "eval")}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            _materialize_lazy(case.module, case.inputs)
        except Exception as e:
            rec.update(status=SKIP, note=f"eager fails: {type(e).__name__}: {_first_line(e)}")
            return _done(rec, t0)
        result = _run_sides(case, rec)
    return _done(result, t0)


def _done(rec, t0):
    rec["secs"] = round(time.time() - t0, 3)
    return rec


def _run_sides(case, rec):
    base = case.module
    eager = Side("eager", copy.deepcopy(base), case.dtype, case.backprop)
    try:
        wrapped = ortmod.ORTModule(copy.deepcopy(base))
    except Exception as e:
        rec.update(status=CLEAN_ERROR, error={"type": type(e).__name__, "msg": _first_line(e), "where": "ORTModule()"})
        return rec
    if wrapped._ortmod_policy:
        raise RuntimeError(f"ORTMODULE_FALLBACK_POLICY is set in the worker ({set(wrapped._ortmod_policy)}): "
                           "a fallback would hide failures")
    ort = Side("ortmod", wrapped, case.dtype, case.backprop, ort=wrapped)
    ref = None
    if case.dtype == torch.float32:
        ref = Side("fp64", copy.deepcopy(base).to(torch.float64), torch.float64, case.backprop)
    try:
        for step in range(STEPS):
            leaves = eager.forward(step, case.inputs)
            weights = _weights(step, leaves, case.dtype)
            eager.backward(step, weights)
            ort.forward(step, case.inputs)
            ort.backward(step, weights)
            if ref is not None:
                try:
                    ref.forward(step, case.inputs)
                    ref.backward(step, weights)
                except EagerFailed:
                    ref = None          # no referee for this case (float64 unsupported, ...)
    except EagerFailed as e:
        rec.update(status=SKIP, note=f"eager fails: {e}")
        return rec
    except OrtmodFailed as e:
        rec.update(status=CLEAN_ERROR, error={"type": type(e.exc).__name__, "msg": _first_line(e.exc),
                                              "where": e.where})
        # what the steps before the failing one returned reached the user with no exception
        failed = _step_of(e.where)
        diffs, refereed = _compare(eager, ort, ref, case.dtype, lambda key: _step_of(key) < failed)
        if diffs:
            rec.update(status=MISMATCH, n_diffs=len(diffs), diffs=diffs[:6], refereed=refereed)
        return rec
    diffs, refereed = _compare(eager, ort, ref, case.dtype)
    rec.update(status=MISMATCH if diffs else PASS, n_diffs=len(diffs), diffs=diffs[:6], refereed=refereed)
    return rec


def _step_of(name):
    return int(name.split()[0][len("step"):])          # "step1 grad weight" -> 1


def _compare(eager, ort, ref, dtype, keep=lambda key: True):
    """(diffs, number of values the float64 referee accepted) over the recorded names ``keep`` selects."""
    diffs, refereed = [], 0
    keys = list(eager.record) + [k for k in ort.record if k not in eager.record]
    for key in filter(keep, keys):
        want, got = eager.record.get(key, "<absent>"), ort.record.get(key, "<absent>")
        d = value_diff(got, want, dtype)
        if d is None:
            continue
        if ref is not None and isinstance(got, torch.Tensor) and \
                referee_accepts(d, got, want, ref.record.get(key), dtype):
            refereed += 1
            continue
        d["what"] = key
        diffs.append(d)
    return diffs, refereed


def describe_diff(d):
    """One line: which tensor, max abs diff against its scale, what else is known."""
    text = d["what"] + ": "
    if "max_abs" in d:
        text += f"max|diff| {d['max_abs']:.3g} (max|eager| {d['scale']:.3g}); "
    text += d.get("note", "")
    if "referee" in d:
        r = d["referee"]
        text += f"; vs fp64: ortmod {r['ortmod_vs_fp64']:.3g}, eager {r['eager_vs_fp64']:.3g}"
    return text
