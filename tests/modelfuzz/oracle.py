"""Run one spec eagerly, through ORTModule and against a float64 referee; classify the result.

Every run takes ``spec["steps"]`` training steps (forward with fresh copies of the inputs ->
the outputs weighted by fixed random weights and summed -> backward -> plain SGD step; SGD,
not Adam: Adam turns rounding noise into full-size steps) and, with ``eval_after``, one eval
forward under no_grad. A run is a *trace*: every observable tensor by name ("s0 out0",
"s0 grad input", "s1 grad layers.0.weight", "s0 buf layers.2.running_mean", "param ...",
"eval out0"). Traces are compared name by name, each tensor relative to its own size:

    err = max|got - ref| / max(max|ref|, floor * the largest max|ref| of its category)

(the floor — FLOOR64 for the float64 oracle, FLOOR32 for the float32 one — keeps a gradient
that is mathematically zero, and computed as rounding noise, from counting as wrong: with one
key, attention's key-projection gradient is exactly 0 in eager's softmax backward and 1e-8 of
the largest gradient in ortmod's fused kernel, seed 2193.)

Two oracles (a kink — relu, a max-pool tie, clamp, abs — turns a rounding difference into a
different gradient element, so "eager fp32 is closer to fp64 than ortmod fp32" proves nothing):

1. float64, exact: ortmod on the float64 copy of the model against eager float64. Every error
   must be <= TOL64. A larger one is checked against eager float64 run other ways (mkldnn off,
   one thread, weights perturbed by an ulp): only an error far outside that spread is
   MISMATCH64 (a kernel computing float64 in float32 lands here).
2. float32 noise band (float32 specs): ortmod fp32 against the fp64 referee, judged against
   the spread of eager fp32 run several equivalent ways — default, mkldnn off, one thread,
   channels_last (4-d inputs) and two runs with weights and input perturbed by an ulp (which
   measures how much the model amplifies rounding: a kink near a tie flips there too). A
   quantity is MISMATCH32 only when ortmod's error is > BAND_FACTOR x the band's worst and
   > TOL32.

Rounding, judged by how it scales (rounding_explains): a float64 error within eager float32's
error on the same quantity x 2**-29, or a float32 error within ortmod float64's own x 2**29, is
rounding (a mathematically-zero gradient computed as noise). The float32 band includes eager
with its norms written as plain ops (_decompose_norms). A referee category of all exact zeros
is measured against the outputs' size (scales). A model whose eager float32 forward is off the
referee by more than CHAOS32 of its own size is chaotic in float32: the float32 oracle abstains
(``chaotic32`` in the record), the float64 one still judges.

Statuses: ok; refused (an ortmod exception class: counted by message, not a failure);
mismatch64 / mismatch32 (silently wrong); error (an exception that is not ortmod's, from an
ORTModule run); invalid (eager itself cannot run the spec, or its referee is not finite: the
generator's problem, not ortmod's). crash and hang are the parent's (tests/modelfuzz/runner.py):
a worker that dies in an eager phase (see ``phase``) is an eager-crash, PyTorch's own, reported
apart and not counted as ortmod's failure.
"""
import contextlib
import copy
import os
import re
import time
import warnings

import torch

from . import spec as S

LR = 0.05
TOL64 = 1e-9
TOL32 = 1e-4
BAND_FACTOR = 10.0
FLOOR64, FLOOR32 = 1e-4, 1e-3
# float32's epsilon over float64's: a rounding error grows by it from float64 to float32
EPS_RATIO = float(torch.finfo(torch.float32).eps / torch.finfo(torch.float64).eps)     # 2**29
# rounding residues are random: the largest of a tensor's at one precision can be 10x below the
# other's scaled by EPS_RATIO by luck (seed 21214's shrunk case: 12x)
ROUNDING_FACTOR = 100.0
# eager float32's own forward error (relative, against the float64 referee) past which a model is
# chaotic in float32: rounding decides its outputs at their own scale, and the float32 oracle
# abstains (the float64 one still judges). Seed 70119: a LayerNorm with eps 1e-12, a RMSNorm over
# one channel (a sign) and BatchNorm running statistics of that; eager float32's training
# output is 6.7x its size off the referee.
CHAOS32 = 0.5
CATEGORIES = ("out", "grad", "buf", "param", "eval")
# below this fraction of the run's size a referee category is float64 rounding residue (scales)
NOISE64 = 1e-12

OK, REFUSED, MISMATCH64, MISMATCH32, ERROR, INVALID, CRASH, HANG, EAGER_CRASH = (
    "ok", "refused", "mismatch64", "mismatch32", "error", "invalid", "crash", "hang", "eager-crash")
FAILURES = (MISMATCH64, MISMATCH32, ERROR, CRASH, HANG)

_ENGINE_CALLS = [0]


def _count_engine_calls():
    """Wrap ortmod's run_training/run_inference so a wrapped call is proven to run the engine
    (never quietly PyTorch)."""
    from ortmod import _pipeline as m
    if hasattr(m.run_training, "__wrapped__"):
        return

    def counting(fn):
        def wrapper(*a, **k):
            _ENGINE_CALLS[0] += 1
            return fn(*a, **k)
        wrapper.__wrapped__ = fn
        return wrapper
    m.run_training = counting(m.run_training)
    m.run_inference = counting(m.run_inference)


def ortmod_errors():
    import ortmod
    return (ortmod.ExportError, ortmod.UnsupportedModelError, ortmod.UnsupportedDataError,
            ortmod.UnsupportedDeviceError, ortmod.EngineError)


class RunFailed(Exception):
    def __init__(self, where, exc):
        super().__init__(f"{where}: {type(exc).__name__}: {exc}")
        self.where, self.exc = where, exc


# --------------------------------------------------------------------------- one run

def _out_weights(spec, outs):
    g = torch.Generator().manual_seed(spec["seed"] + 7)
    ws = []
    for o in outs:
        ws.append(None if o.dim() == 0 else torch.randn(o.shape, generator=g, dtype=torch.float64))
    return ws


def _flat(res):
    return list(res) if isinstance(res, (tuple, list)) else [res]


def trace(model, args, spec, *, ort=False, channels_last=False, fault=None):
    """The trace of ``model`` (changed in place: its steps are taken) on ``args``."""
    inner = model
    if channels_last:
        inner.to(memory_format=torch.channels_last)
    if ort:
        import ortmod
        model = ortmod.ORTModule(inner, ortmod.DebugOptions(capture=spec["capture"]))
    else:
        _same_layout_grads(inner)
    params = list(inner.parameters())
    opt = torch.optim.SGD(params, lr=LR) if params else None
    grad_input = spec["input"].get("grad", False) and args[0].is_floating_point()
    out = {}
    weights = None
    for s in range(spec.get("steps", 2)):
        a = [t.clone() for t in args]
        if channels_last and a[0].dim() == 4:
            a[0] = a[0].contiguous(memory_format=torch.channels_last)
        if grad_input:
            a[0].requires_grad_(True)
        before = _ENGINE_CALLS[0]
        if (fault == "crash" and ort) or (fault == "eager_crash" and not ort):
            os.abort()
        if fault == "hang" and ort:
            time.sleep(10 ** 6)
        if fault == "raise" and ort:
            raise KeyError("injected")
        outs = _flat(model(*a))
        if ort and _ENGINE_CALLS[0] == before:
            raise AssertionError("ORTModule's call did not run the engine")
        if weights is None:
            weights = _out_weights(spec, outs)
        loss = 0
        for i, (o, w) in enumerate(zip(outs, weights)):
            out[f"s{s} out{i}"] = o.detach().clone()
            loss = loss + (o if w is None else (o * w.to(o.dtype)).sum())
        if isinstance(loss, torch.Tensor) and loss.requires_grad:    # else nothing to differentiate
            loss.backward()
        if grad_input:
            out[f"s{s} grad input"] = a[0].grad.clone()
        for n, p in inner.named_parameters():
            out[f"s{s} grad {n}"] = None if p.grad is None else p.grad.clone()
        if opt is not None:
            opt.step()
            opt.zero_grad(set_to_none=True)
        for n, b in inner.named_buffers():
            out[f"s{s} buf {n}"] = b.clone()
    for n, p in inner.named_parameters():
        out[f"param {n}"] = p.detach().clone()
    if spec.get("eval_after"):
        model.eval()
        with torch.no_grad():
            for i, o in enumerate(_flat(model(*[t.clone() for t in args]))):
                out[f"eval out{i}"] = o.detach().clone()
    dt = next(inner.parameters()).dtype if fault in ("grad64", "grad32") else None
    if ort and (fault, dt) in (("grad64", torch.float64), ("grad32", torch.float32)):
        # test hook (tests/test_model_fuzz.py): ortmod made wrong on purpose, by a little
        key = next(k for k, v in out.items() if " grad " in k and v is not None)
        out[key] = out[key] * (1 + (1e-6 if fault == "grad64" else 3e-2))
    return out


def _same_layout_grads(model):
    """Work around PyTorch bugs in the eager runs: torch 2.13's CPU norm backwards give wrong
    input gradients for some layouts of their output gradient:
    - batch_norm, when the gradient has another layout than its input — as a
      flatten(2).transpose(1, 2) after it hands back for batch 1 (strides (2, 1, 6, 2) read as
      channels-last): 4.4 off in float64, where ortmod is right (seed 1150 of the first run);
    - instance_norm with batch 1, when the gradient is channels-last (or reads as it), whatever
      the input's layout: O(1) off in float64 (seed 40589: a channels-last RMSNorm's
      permute-back in front makes the input channels-last; handing that layout to the gradient,
      as this hook first did, made the referee wrong where ortmod and finite differences agree).
    - batch_norm in training, when its input is channels-last and the gradient contiguous
      (a (1, 9, 8) sequence transposed and unflattened to (1, 8, 9, 1): strides (8, 1, 8, 8)):
      the weight, bias and input gradients O(1) off in float64 (seed 81907; torch 2.14.1 too),
      where ortmod and finite differences agree.
    All compute right with a contiguous input and gradient (tests/test_model_fuzz.py checks
    layout pairs on small shapes), so both are made contiguous for each norm (same values)."""
    norms = (torch.nn.modules.batchnorm._BatchNorm, torch.nn.modules.instancenorm._InstanceNorm)

    def hook(mod, inp, out):
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda g: g.contiguous())
    def contiguous_input(mod, inp):
        return tuple(t.contiguous() if isinstance(t, torch.Tensor) else t for t in inp)
    for m in model.modules():
        if isinstance(m, norms):
            m.register_forward_pre_hook(contiguous_input)
            m.register_forward_hook(hook)


def _perturbed(model, args, seed, eps):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(1 + eps * torch.randn(p.shape, generator=g, dtype=p.dtype))
    a0 = args[0]
    if a0.is_floating_point():
        a0 = a0 * (1 + eps * torch.randn(a0.shape, generator=g, dtype=a0.dtype))
    return model, (a0,) + tuple(args[1:])


def _decomposed_norm_forward(self, x):
    """BatchNorm/InstanceNorm/LayerNorm as elementwise ops and reductions (the same math as the
    module: biased variance to normalize, BatchNorm's running statistics updated with the
    unbiased one)."""
    nn_ = torch.nn
    if isinstance(self, nn_.LayerNorm):
        dims = tuple(range(-len(self.normalized_shape), 0))
        stats, shape = True, None
    else:
        bn = isinstance(self, nn_.modules.batchnorm._BatchNorm)
        dims = (0,) + tuple(range(2, x.dim())) if bn else tuple(range(2, x.dim()))
        shape = [1, -1] + [1] * (x.dim() - 2)
        stats = self.training or not self.track_running_stats
    if stats:
        mean = x.mean(dims, keepdim=True)
        d = x - mean
        var = d.pow(2).mean(dims, keepdim=True)
        if shape is not None and self.training and self.track_running_stats:
            n = x.numel() // x.shape[1]
            with torch.no_grad():
                m = self.momentum
                self.running_mean.mul_(1 - m).add_(m * mean.reshape(-1))
                self.running_var.mul_(1 - m).add_(m * var.reshape(-1) * n / max(n - 1, 1))
                self.num_batches_tracked.add_(1)
        y = d / (var + self.eps).sqrt()
    else:
        y = (x - self.running_mean.view(shape)) / (self.running_var.view(shape) + self.eps).sqrt()
    w = self.weight if shape is None or self.weight is None else self.weight.view(shape)
    b = self.bias if shape is None or self.bias is None else self.bias.view(shape)
    if w is not None:
        y = y * w
    if b is not None:
        y = y + b
    return y


def _decomposable_norms(model):
    nn_ = torch.nn
    out = []
    for m in model.modules():
        if isinstance(m, (nn_.modules.batchnorm._BatchNorm, nn_.modules.instancenorm._InstanceNorm)):
            if m.momentum is None or (isinstance(m, nn_.modules.instancenorm._InstanceNorm) and m.track_running_stats):
                return []                     # cumulative averages, instance running stats: not written out
            out.append(m)
        elif isinstance(m, nn_.LayerNorm):
            out.append(m)
    return out


def _decompose_norms(model):
    """``model`` with its norms computed as plain ops: an equivalent eager run. eager's fused norm
    kernels compute a mathematically-zero weight gradient (sum(dy * xhat) where dy is constant
    over the normalized elements) as exact 0, the plain ops as rounding noise, amplified by
    1/std — the same noise ortmod's decomposed norms give: seeds 21016 (LayerNorm over 2
    elements under L1), 41077 (InstanceNorm of a constant image), 20160 (BatchNorm's weight
    gradient). The band must see that noise as eager's own."""
    import types
    for m in _decomposable_norms(model):
        m.forward = types.MethodType(_decomposed_norm_forward, m)
    return model


@contextlib.contextmanager
def _threads(n):
    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def eager_variants(model, args, spec, dtype):
    """Traces of eager ``dtype`` run in equivalent ways: {name: trace}. A variant eager itself
    cannot run is left out."""
    eps = 2.0 ** -23 if dtype == torch.float32 else 2.0 ** -52
    cast = lambda: (copy.deepcopy(model).to(dtype), tuple(a.to(dtype) if a.is_floating_point() else a for a in args))
    runs = {"mkldnn-off": lambda m, a: _with(torch.backends.mkldnn.flags(enabled=False), lambda: trace(m, a, spec)),
            "1-thread": lambda m, a: _with(_threads(1), lambda: trace(m, a, spec)),
            "perturbed-a": lambda m, a: trace(*_perturbed(m, a, spec["seed"] + 11, eps), spec),
            "perturbed-b": lambda m, a: trace(*_perturbed(m, a, spec["seed"] + 12, eps), spec)}
    if dtype == torch.float32:
        runs = {"default": lambda m, a: trace(m, a, spec), **runs}
        # torch 2.13's CPU GroupNorm backward on a channels-last input that needs no gradient
        # segfaults (nn.GroupNorm(1, 2) on a (1, 2, 1, 2) channels-last x without requires_grad)
        has_gn = any(isinstance(m, torch.nn.GroupNorm) for m in model.modules())
        if args[0].dim() == 4 and args[0].is_floating_point() and not has_gn:
            runs["channels-last"] = lambda m, a: trace(m, a, spec, channels_last=True)
    # in float64 too: a LayerNorm over a size-1 dim with eps 1e-12 (seed 81922) normalizes to an
    # exact 0 whose gradient is mathematically zero; eager's fused kernel leaves a residue amplified
    # by 1/sqrt(eps) (1e-6 of the run's gradients upstream), the plain ops leave exact zeros, as
    # ortmod does. Both are eager float64 computations of the same model: the band is their spread.
    if _decomposable_norms(model):
        runs["decomposed-norms"] = lambda m, a: trace(_decompose_norms(m), a, spec)
    out = {}
    for name, fn in runs.items():
        phase(f"eager {dtype} {name}")
        m, a = cast()
        try:
            out[name] = fn(m, a)
        except Exception:
            pass
    return out


def _with(cm, fn):
    with cm:
        return fn()


# --------------------------------------------------------------------------- comparing

def _category(key):
    if key.startswith("eval"):
        return "eval"
    word = key.split()[1] if key.startswith("s") else key.split()[0]
    return "out" if word.startswith("out") else word


def scales(ref):
    """Per category, the largest max|value| of the referee's float tensors. A category whose
    referee tensors are all exactly zero (every gradient mathematically zero and computed as
    exact zeros by eager: seed 40490, L1's signs cancelling in a mean) has no size of its own to
    measure rounding against; it takes the forward outputs' (what every gradient, buffer and
    parameter update of the run is built from), so a 1e-17 residue of another summation order
    is not an infinite error."""
    sc = dict.fromkeys(CATEGORIES, 0.0)
    for k, v in ref.items():
        if v is not None and v.is_floating_point() and v.numel():
            sc[_category(k)] = max(sc[_category(k)], v.double().abs().max().item())
    # Nor does a category that is all rounding residue (below NOISE64 of the run's size): a model
    # whose every output is mathematically zero (seed 81907: BatchNorm over a constant channel,
    # eager float64 leaves 3e-15 in the outputs and 3e-14 in one gradient element, ortmod exact 0
    # and the residue in the other element) has no output size either; the parameters' is the
    # size its residues are made from.
    base = sc["out"] if sc["out"] > NOISE64 * sc["param"] else sc["param"]
    return {c: (v if v > NOISE64 * base else base) for c, v in sc.items()}


def rel_err(got, ref, floor):
    """got's error against ref relative to ref's own size (inf: a different shape, dtype class,
    integer value or inf/nan pattern; a missing gradient is as good as a zero one)."""
    if got is None or ref is None:
        other = ref if got is None else got
        if other is None or not bool(other.any()):
            return 0.0
        return float("inf")
    if got.shape != ref.shape:
        return float("inf")
    if not ref.is_floating_point():
        return 0.0 if torch.equal(got, ref) else float("inf")
    g, r = got.detach().double(), ref.detach().double()
    fr, fg = torch.isfinite(r), torch.isfinite(g)
    if not torch.equal(fr, fg) or not torch.equal(g[~fr], r[~fr]):
        return float("inf")
    if not r.numel() or not fr.any():
        return 0.0
    scale = max(r[fr].abs().max().item(), floor)
    if scale == 0.0:
        return 0.0 if not g[fr].any() else float("inf")
    return (g[fr] - r[fr]).abs().max().item() / scale


def abs_err(got, ref):
    """max|got - ref| (a missing gradient as a zero one); inf where rel_err would be inf."""
    if got is None and ref is None:
        return 0.0
    if got is None or ref is None:
        other = ref if got is None else got
        return other.detach().double().abs().max().item() if other.numel() else 0.0
    if got.shape != ref.shape or not ref.is_floating_point():
        return 0.0 if got.shape == ref.shape and torch.equal(got, ref) else float("inf")
    g, r = got.detach().double(), ref.detach().double()
    fr, fg = torch.isfinite(r), torch.isfinite(g)
    if not torch.equal(fr, fg) or not torch.equal(g[~fr], r[~fr]):
        return float("inf")
    return (g[fr] - r[fr]).abs().max().item() if fr.any() else 0.0


def rounding_explains(err, predictor, scale):
    """Whether an error ``err`` (absolute) is what rounding makes of a quantity, predicted from
    the same quantity's error at the other precision (``predictor``, absolute) scaled by the
    ratio of the two epsilons (``scale``: EPS_RATIO from float64 to float32, 1 / EPS_RATIO back).

    The principle: a rounding error grows and shrinks with the precision's epsilon; a wrong
    formula, a lost term or a constant held in float32 does not. Two uses (oracle.py's two
    oracles):
    - float64: ortmod's error on a quantity against the referee is within what eager float32's
      error on it predicts for float64 (x 2**-29). It catches a quantity that is rounding noise
      in the referee itself: a gradient that is mathematically zero (a LayerNorm over a size-1
      dim: (x - mean) is 0, eager's fused kernel leaves 1e-14, ortmod gives exact 0 — seeds
      20302, 21764, 40096), where eager float32 gives 1e-5, 2**29 larger.
    - float32: ortmod float32's error within ortmod float64's own error on it (itself within
      TOL64) x 2**29: the same computation, rounded at the other precision. It catches a
      mathematically-zero gradient that eager float32 computes as exact 0 and ortmod as noise
      (attention over one key: the query/key projections' gradients — seeds 21214, 41739,
      41776).
    A kink (relu at 0, a max-pool tie) flipping at one precision only gives errors far above
    the prediction; a float32 constant in a float64 computation gives ~1e-8 relative, above
    2**-29 x eager float32's error unless the quantity is itself that ill-conditioned (where
    no rounding oracle tells them apart)."""
    return err <= ROUNDING_FACTOR * predictor * scale


def _quantity(key):
    """A trace key without its step ("s1 grad w" -> "grad w"): the same quantity at every step."""
    return re.sub(r"^s\d+ ", "", key)


def _rounding_level(trace_, ref, key):
    """The absolute error of ``trace_`` on the quantity of ``key``, the largest over the run's steps.
    The same computation rounds alike at every step, but which step's residue comes out largest is
    luck: seed 83644 (every gradient mathematically zero by a LayerNorm's scale invariance) has eager
    float32 1e-5 off at step 0 and 1e-6 at step 1 on one weight's gradient, where ortmod float64's
    residue is 6e-13 at both."""
    q = _quantity(key)
    return max(abs_err(trace_.get(k), ref[k]) for k in ref if _quantity(k) == q)


def errors(got, ref, sc, floor):
    return {k: rel_err(got.get(k), v, floor * sc[_category(k)]) for k, v in ref.items() if k in got or v is not None}


# --------------------------------------------------------------------------- one spec

def _first_line(exc):
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{type(exc).__name__}: {msg}"[:400]


def refusal_key(exc):
    """A refusal's message with numbers and long quoted names blurred, to count by cause."""
    msg = re.split(r"\s*\[Caused by|\s*\(full error", _first_line(exc))[0]
    msg = re.sub(r"export failed for \w+:", "export failed for <module>:", msg)
    msg = re.sub(r"'[^']{30,}'", "'…'", msg)
    msg = re.sub(r"\b(Float|Double|float32|float64)\b", "<dtype>", msg)
    msg = re.sub(r"\b\d+(\.\d+)?\b", "N", msg)
    return msg[:220]


def run_spec(spec):
    """The record of one spec: {"status", "seed", "secs", ...}."""
    t0 = time.time()
    rec = {"seed": spec.get("seed"), "capture": spec.get("capture"), "dtype": spec.get("dtype")}
    try:
        _classify(spec, rec)
    finally:
        rec["secs"] = round(time.time() - t0, 2)
    return rec


PHASE_MARK = "=== modelfuzz phase "


def phase(name):
    """Say on stderr what runs now: a worker that dies says where (runner.py reads it back; a
    crash in an eager phase is eager PyTorch's, not ortmod's)."""
    import sys
    sys.stderr.write(f"{PHASE_MARK}{name}\n")
    sys.stderr.flush()


def _ort_trace(model, args, spec, dtype, rec, which):
    phase(f"ortmod {which}")
    m = copy.deepcopy(model).to(dtype)
    a = tuple(x.to(dtype) if x.is_floating_point() else x for x in args)
    try:
        return trace(m, a, spec, ort=True, fault=spec.get("_fault"))
    except ortmod_errors() as e:
        rec.setdefault("refused", {})[which] = refusal_key(e)
        rec.setdefault("refused_full", {})[which] = _first_line(e)
    except Exception as e:
        import traceback
        rec.setdefault("errors", {})[which] = _first_line(e)
        rec.setdefault("where", {})[which] = traceback.format_exc().strip().splitlines()[-3][:300]
    return None


def _ort64_perturbed_errors(model, args, spec):
    """ortmod float64's absolute error per quantity on the model and input perturbed by an ulp,
    against eager float64 on the same perturbed copy: {key: error} ({} when either cannot run).

    The float32 rounding predictor (rounding_explains) scales ortmod float64's own error; where
    that error is exactly 0 by luck of the values (exact products at float64 that round at
    float32), the perturbed run shows the residue the same computation leaves at float64. Seed
    81193: a BatchNorm channel of zero variance over a batch of 2 (padding tokens in both rows)
    gives a mathematically zero bias gradient upstream; ortmod float32 computes it as 7.6e-6
    (rounding amplified by 1/sqrt(eps)), float64 as exact 0 on the model and 1e-14 perturbed."""
    phase("ortmod float64 perturbed")
    m, a = _perturbed(copy.deepcopy(model).double(),
                      tuple(x.double() if x.is_floating_point() else x for x in args), spec["seed"] + 13, 2.0 ** -52)
    try:
        ref = trace(copy.deepcopy(m), a, spec)
        got = trace(m, a, spec, ort=True)
    except Exception:
        return {}
    return {k: abs_err(got.get(k), v) for k, v in ref.items() if v is not None}


def _eager32(model, args, spec):
    """Eager float32's trace of a float64 spec (rounding's size at float32, oracle 1), or None
    when eager cannot run it in float32."""
    phase("eager float32 probe")
    try:
        return trace(copy.deepcopy(model).float(), tuple(a.float() if a.is_floating_point() else a for a in args), spec)
    except Exception:
        return None


def _classify(spec, rec):
    warnings.simplefilter("ignore")
    _count_engine_calls()
    try:
        model, args = S.build(spec)
    except S.InvalidSpec as e:
        rec.update(status=INVALID, note=str(e)[:300])
        return
    dtype = model_dtype = getattr(torch, spec.get("dtype", "float32"))
    phase("eager referee")
    try:
        ref = trace(copy.deepcopy(model).double(),
                    tuple(a.double() if a.is_floating_point() else a for a in args), spec, fault=spec.get("_fault"))
        eager32 = trace(copy.deepcopy(model), args, spec) if model_dtype == torch.float32 else None
    except Exception as e:
        rec.update(status=INVALID, note=f"eager fails: {_first_line(e)}")
        return
    # buffers may hold -inf on purpose (an additive attention mask)
    if not all(v is None or not v.is_floating_point() or _category(k) == "buf" or bool(torch.isfinite(v).all())
               for k, v in ref.items()):
        rec.update(status=INVALID, note="the float64 referee is not finite")
        return
    sc = scales(ref)
    problems = []

    # oracle 1: float64, exact
    ort64 = _ort_trace(model, args, spec, torch.float64, rec, "float64")
    # the quantities the float64 oracle accepts ortmod float64 on: within TOL64, within eager
    # float64's own spread, or rounding; oracle 2 scales ortmod float64's error on these
    accepted64 = set()
    if ort64 is not None:
        e64 = errors(ort64, ref, sc, FLOOR64)
        accepted64 = set(e64)
        worst = max(e64, key=e64.get)
        rec["err64"] = {"key": worst, "err": e64[worst]}
        if e64[worst] > TOL64:
            band = eager_variants(model, args, spec, torch.float64)
            bad, rounding = [], []
            for k, e in e64.items():
                if e <= TOL64:
                    continue
                b = max((rel_err(t.get(k), ref[k], FLOOR64 * sc[_category(k)]) for t in band.values()), default=0.0)
                if e > max(BAND_FACTOR * b, TOL64):
                    if eager32 is None:
                        eager32 = _eager32(model, args, spec)
                    if eager32 is not None and rounding_explains(abs_err(ort64.get(k), ref[k]),
                                                                 _rounding_level(eager32, ref, k), 1 / EPS_RATIO):
                        rounding.append(k)
                    else:
                        bad.append({"key": k, "err": e, "band": b})
            accepted64 -= {d["key"] for d in bad}
            if bad:
                bad.sort(key=lambda d: -d["err"])
                problems.append((MISMATCH64, bad))
            elif rounding:
                rec["note64"] = (f"float64 error {e64[worst]:.1e} at {worst}: {len(rounding)} quantities within "
                                 f"what eager float32's error predicts for float64 (rounding noise), the rest "
                                 f"within eager float64's own spread")
            else:
                rec["note64"] = f"float64 error {e64[worst]:.1e} at {worst} is within eager float64's own spread"

    # oracle 2: float32 noise band
    if model_dtype == torch.float32:
        ort32 = _ort_trace(model, args, spec, torch.float32, rec, "float32")
        chaos = max((e for k, e in errors(eager32, ref, sc, FLOOR32).items()
                     if _category(k) == "out"), default=0.0) if eager32 is not None else 0.0
        if ort32 is not None and chaos > CHAOS32:
            rec["chaotic32"] = chaos
            ort32 = None
        if ort32 is not None:
            band = eager_variants(model, args, spec, torch.float32)
            e32 = errors(ort32, ref, sc, FLOOR32)
            bad = []
            worst_band = 0.0
            perturbed64 = None
            for k, e in e32.items():
                b = max((rel_err(t.get(k), ref[k], FLOOR32 * sc[_category(k)]) for t in band.values()), default=0.0)
                worst_band = max(worst_band, b)
                if e > max(BAND_FACTOR * b, TOL32):
                    explained = False
                    # (seed 83009: ortmod float64 is 1.5e-8 off a mathematically zero LayerNorm bias
                    # gradient, within eager float64's spread, and its 2**29-scaled error is the
                    # float32 one: a LayerNorm row's normalized values, equal across two rows to 5e-9,
                    # round an ulp apart, and a BatchNorm over that batch of 2 amplifies it by 1e4;
                    # eager float32 rounds them alike, perturbed or not)
                    if ort64 is not None and k in accepted64:
                        err32 = abs_err(ort32.get(k), ref[k])
                        explained = rounding_explains(err32, abs_err(ort64.get(k), ref[k]), EPS_RATIO)
                        if not explained:
                            if perturbed64 is None:
                                perturbed64 = _ort64_perturbed_errors(model, args, spec)
                            explained = rounding_explains(err32, perturbed64.get(k, 0.0), EPS_RATIO)
                    if explained:
                        rec.setdefault("rounding32", []).append(k)
                    else:
                        bad.append({"key": k, "err": e, "band": b})
            worst = max(e32, key=e32.get)
            rec["err32"] = {"key": worst, "err": e32[worst], "band": worst_band,
                            "forward": max((e for k, e in e32.items() if _category(k) == "out"), default=0.0)}
            if bad:
                bad.sort(key=lambda d: -d["err"])
                problems.append((MISMATCH32, bad))
    del dtype

    if problems:
        rec.update(status=problems[0][0], diffs=problems[0][1][:5], n_diffs=len(problems[0][1]))
    elif rec.get("errors"):
        rec["status"] = ERROR
    elif rec.get("refused"):
        rec["status"] = REFUSED
    else:
        rec["status"] = OK


def signature(rec):
    """What must persist while a failing case shrinks: the status, and for an error its type,
    for a refusal its cause (a shrink must not trade one finding for another)."""
    st = rec["status"]
    if st == ERROR:
        return (st, tuple(sorted(v.split(":")[0] for v in rec["errors"].values())))
    if st == REFUSED:
        return (st, tuple(sorted(rec["refused"].values())))
    if st in (MISMATCH64, MISMATCH32):
        return (st,)
    return (st,)
