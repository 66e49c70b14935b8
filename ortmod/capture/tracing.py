"""What a trace must keep of eager's semantics, on both paths:

- **Stop-gradient.** ``StopGradientMode`` detaches what a ``torch.no_grad()`` region computes from a
  tensor that requires grad, and ``refuse_in_place_without_grad`` refuses an in-place change eager
  autograd would ignore. ``F.gaussian_nll_loss``'s in-place clamp of ``var`` is lifted first, and
  ``F.linear_cross_entropy`` traced as torch's reference path.
- **What the trace froze.** A Python value read from a tensor (``.item()``, ``int(t)``, a branch on
  a tensor) is recorded by ``TraceGuards``, made an extra graph output and checked on every call:
  the ``Guard``s (moved here from ortmod._semantics)."""
import contextlib
import math
import sys
import threading

import torch

from .compat import pytree

from . import python_op as pyop
from .errors import _is_library, user_frame
from .errors import UnsupportedModelError

# ---------------------------------------------------------------------------------------------
# stop-gradient

def _tensors(tree):
    return [t for t in pytree.tree_leaves(tree) if isinstance(t, torch.Tensor)]


class StopGradientMode(torch.overrides.TorchFunctionMode):
    """While torch traces the forward: where an op runs with grad disabled (a ``torch.no_grad()``
    block, ``inference_mode``) on a tensor that requires grad, its float outputs are passed
    through ``detach()``, so the trace holds an ``aten::detach`` at exactly the place where eager
    autograd stops the gradient. ``x.detach()`` itself is traced as it is.

    It looks at the real tensors rather than at the trace's ``requires_grad`` annotations: those
    are recorded below autograd for some ops (``aten::_convolution`` says ``requires_grad=0``
    whatever its weight), so they cannot say where a gradient stops."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.gaussian_nll_loss and torch.jit.is_tracing():
            args, kwargs = _gaussian_nll_var_lifted(args, kwargs)
        if func is getattr(torch.nn.functional, "linear_cross_entropy", None) and torch.jit.is_tracing():
            out = linear_cross_entropy_reference(args, kwargs)      # what torch traces, made eager's
        else:
            out = func(*args, **kwargs)
        if torch.is_grad_enabled() or not torch.jit.is_tracing() or pyop._inside_function():
            return out
        inputs = _tensors((args, kwargs))
        if not any(t.requires_grad for t in inputs):
            return out
        refuse_in_place_without_grad(func, args)
        return pytree.tree_map(
            lambda t: t.detach() if isinstance(t, torch.Tensor) and t.is_floating_point() else t, out)


def refuse_in_place_without_grad(func, args):
    """With gradients disabled, an in-place op on a tensor that requires grad: eager autograd
    ignores the change, a traced graph would differentiate it. Both capture paths' function modes
    refuse it by name (called from their ``__torch_function__``)."""
    name = getattr(func, "__name__", "")
    if name.endswith("_") and not name.endswith("__") and any(t.requires_grad for t in _tensors(args[:1])):
        raise UnsupportedModelError(
            f"forward calls the in-place {name} with gradients disabled on a tensor that requires grad "
            f"(at {user_frame(3)}): eager autograd ignores that change, a traced graph cannot; do it out of "
            "place, or outside torch.no_grad()")


def _gaussian_nll_var_lifted(args, kwargs):
    """F.gaussian_nll_loss clamps ``var`` to eps in place under ``torch.no_grad()``: eager autograd
    differentiates log(var) and .../var as if var were unclamped. A Python function that
    dispatches through ``__torch_function__`` runs its body with this mode disabled, so the trace
    held a plain clamp, whose gradient is 0 below eps (GaussianNLLLoss's var gradient was silently
    wrong there). ``var`` is lifted to eps beforehand with the gradient of var itself, as
    eps + (var - var.detach()); the function's own clamp then changes nothing. Its check of
    negative entries is made first, on the real var (eager raises ValueError)."""
    names = ("input", "target", "var", "full", "eps", "reduction")
    bound = dict(zip(names, args), **kwargs)
    var, eps = bound.get("var"), bound.get("eps", 1e-6)
    if not isinstance(var, torch.Tensor) or not var.requires_grad or not isinstance(eps, (int, float)):
        return args, kwargs
    if torch.any(var < 0):
        raise ValueError("var has negative entry/entries")
    bound["var"] = torch.where(var < eps, (var - var.detach()) + eps, var)
    # and the function's clamp is to the float of var's dtype just below eps there: the lifted
    # var never sits at its bound, where torch 2.14's clamp gives no gradient (2.13's all of it);
    # values unchanged. (Below eps in float64 only, a float32 var's bound rounds back to eps.)
    bound["eps"] = _float_below(eps, var.dtype)
    n = min(len(args), len(names))
    return tuple(bound.pop(k) for k in names[:n]), bound


def _float_below(x, dtype):
    """The largest number of ``dtype`` below ``x`` rounded to ``dtype``, as a Python float
    (computed without torch ops: this runs while torch traces)."""
    import struct
    import numpy as np
    if dtype == torch.bfloat16:     # float32's upper half: round to nearest even, then one step down
        bits = struct.unpack("<I", struct.pack("<f", float(x)))[0]
        bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
        as_float = lambda b: struct.unpack("<f", struct.pack("<I", b))[0]     # noqa: E731
        step = -(1 << 16) if as_float(bits) > 0 else (1 << 16)
        return as_float(bits + step) if as_float(bits) != 0 else -as_float(1 << 16)
    np_type = {torch.float64: np.float64, torch.float32: np.float32, torch.float16: np.float16}.get(dtype)
    if np_type is None:
        return math.nextafter(float(x), -math.inf)
    return float(np.nextafter(np_type(x), np_type(-np.inf)))


def linear_cross_entropy_reference(args, kwargs):
    """F.linear_cross_entropy(*args, **kwargs), computed by torch's reference path.

    With ``options`` (nn.LinearCrossEntropyLoss's chunked path) eager calls torch's custom op
    ``_linear_cross_entropy_batch_chunked``, whose autograd is torch's own autograd.Function: its
    forward computes the gradients in chunks, its backward hands them back. ortmod runs only a
    user's Functions in PyTorch; the engine computes torch's. torch documents the chunked path as
    its reference path, linear then cross_entropy (``options=None``), which it takes itself
    under torch.jit.trace; both capture paths trace that, and the engine differentiates it.
    Where they differ:
    * reduction "mean" over a total target weight of 0 (every target ignored): the chunked
      path divides each row's weight by NaN, so every gradient is NaN (the reference path's is
      0) and so is the loss (the reference path's is sum / 0: NaN, or +-inf for weights that
      cancel). Reproduced: where that total is 0, the result is NaN times the sum of the input,
      weight and bias, which sends NaN to each;
    * an input of float16 or bfloat16, or an ``acc_dtype`` other than the input's: the chunked
      path accumulates in that dtype, the reference path rounds in the input's. Refused by name."""
    F = torch.nn.functional
    options = kwargs.get("options")
    if options is None:
        return F.linear_cross_entropy(*args, **kwargs)
    input, linear_weight, target = (tuple(args) + (None,) * 3)[:3]
    reduction = kwargs.get("reduction", "mean")
    # eager's condition for the chunked op (F.linear_cross_entropy; jit tracing aside)
    chunked = (reduction in ("mean", "sum", "none") and kwargs.get("label_smoothing", 0.0) == 0.0
               and isinstance(input, torch.Tensor) and isinstance(target, torch.Tensor)
               and target.dtype == torch.int64 and isinstance(linear_weight, torch.Tensor)
               and linear_weight.dim() == 2)
    out = F.linear_cross_entropy(*args, **{**kwargs, "options": None})
    if not chunked:
        return out
    acc = getattr(options, "acc_dtype", None)
    if input.dtype not in (torch.float32, torch.float64) or acc not in (None, input.dtype):
        raise UnsupportedModelError(
            f"F.linear_cross_entropy (at {user_frame(3)}) with chunking options on a {input.dtype} input "
            f"(acc_dtype {acc}): its chunked path accumulates in another dtype, which ortmod's graph (the "
            "reference path, linear then cross_entropy in the input's dtype) does not reproduce; pass "
            "options=None, or a float32 or float64 input")
    if reduction != "mean":
        return out
    # the chunked path's d: the summed weights of the targets not ignored (its neg_weight_target);
    # an empty batch has no rows to divide (its loss is NaN, its gradients 0, as the reference's)
    ignore_index = kwargs.get("ignore_index")
    target = target.reshape(-1)
    kept = target != (-100 if ignore_index is None else ignore_index)
    weight = kwargs.get("weight")
    if weight is None:
        total = kept.sum()
    else:
        total = torch.where(kept, weight.index_select(0, torch.where(kept, target, 0)), 0).sum()
    divided_by_zero = (total == 0) & torch.ones_like(kept).any()
    everything = input.sum() + linear_weight.sum()
    bias = kwargs.get("linear_bias")
    if isinstance(bias, torch.Tensor):
        everything = everything + bias.sum()
    nan = torch.where(divided_by_zero, torch.nan, out.new_zeros(()))     # 0 where not taken: gradient 0
    return torch.where(divided_by_zero, nan * everything, out)


# ---------------------------------------------------------------------------------------------
# trace guards

_GUARD_RTOL, _GUARD_ATOL = 1e-4, 1e-6


class Guard:
    """One value the trace froze: which extra graph output recomputes it and what Python saw.
    ``internal``: library code took it (torch's BatchNorm batch-size check, transformers' mask
    checks): guarded like the others, but not the user's to hear about unless it changes."""
    __slots__ = ("output_index", "value", "kind", "where", "internal")

    def __init__(self, output_index, value, kind, where, internal=False):
        self.output_index, self.value, self.kind, self.where = output_index, value, kind, where
        self.internal = internal

    def describe(self):
        return f"{self.where} ({self.kind} = {self.value!r})"

    def holds(self, tensor):
        """The engine's value, converted as Python converted the traced one, gives what Python
        saw: int(2.5) froze 2, and 2.5 from the engine still means 2."""
        got = tensor.tolist()
        convert = _GUARD_CONVERSIONS.get(self.kind)
        if convert is not None and not isinstance(got, list):
            try:
                got = convert(got)
            except (ValueError, OverflowError):   # int(nan), int(inf): Python would have raised
                return False
        return _same(got, self.value)


# the conversions whose result is not the tensor's value itself (kinds of recording_guards)
_GUARD_CONVERSIONS = {"int(tensor)": int, "tensor as an index": int, "bool(tensor)": bool}


def _same(a, b):
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        if not isinstance(a, (list, tuple)):
            a = [a]
        if not isinstance(b, (list, tuple)):
            b = [b]
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) or isinstance(b, float):
        a, b = float(a), float(b)
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return abs(a - b) <= _GUARD_ATOL + _GUARD_RTOL * max(abs(a), abs(b))
    return a == b


_recording = threading.local()


def _current_recorder():
    return getattr(_recording, "recorder", None)


class TraceGuards:
    """Records, while torch traces the module, every tensor Python converts to a value."""

    def __init__(self):
        self.records = []      # (traced tensor, kind, value, where, internal)
        # a symbolic emitted a kernel eager picks by memory layout (rules/nn._nearest_symbolic)
        self.reads_layout = False
        # a symbolic baked the traced sizes into the graph (rules/strided.py's as_strided index)
        self.shapes_frozen = False

    def record(self, tensor, kind, value):
        caller = sys._getframe(2).f_code.co_filename      # 0 record, 1 the patched method
        self.records.append((tensor, kind, value, user_frame(3), _is_library(caller)))

    def reset(self):
        self.records = []

    def tensors(self):
        # a guard output is a tensor of its own: a view of a user output would alias it
        return tuple(t.detach().clone() if t.dim() else t.detach().reshape(()) for t, *_ in self.records)


def record_guard(tensor, kind, where):
    """While ortmod traces: guard ``tensor``'s value (read now) as the patched conversions guard
    what Python reads, for a check of ortmod's own (capture/packed.py); the graph is right only
    while it holds. Read here, without the recorder: this file's tracer warnings are not hazards.
    Returns the value, or None when nothing records."""
    rec = _current_recorder()
    if rec is None or not torch.jit.is_tracing():
        return None
    value = read_unguarded(tensor)
    rec.records.append((tensor, kind, value, where, True))
    return value


def current_records():
    """The guards recorded so far in this trace (a list to edit), or None when nothing records."""
    rec = _current_recorder()
    return None if rec is None else rec.records


def read_unguarded(tensor):
    """``tensor.tolist()`` without recording a guard (for a value ortmod guards otherwise)."""
    # a function mode (StopGradientMode) calls the patched method again: nothing records meanwhile
    rec = _current_recorder()
    _recording.recorder = None
    try:
        return tensor.tolist()
    finally:
        _recording.recorder = rec


def _patched(name, kind, convert=None):
    original = getattr(torch.Tensor, name)

    def method(self, *args, **kwargs):
        value = original(self, *args, **kwargs)
        rec = _current_recorder()
        if rec is not None and torch.jit.is_tracing() and not pyop._inside_kept_function():
            guarded = convert(self) if convert else self
            if isinstance(guarded, torch.Tensor):
                rec.record(guarded, kind, value)
        return value

    method.__name__ = name
    method.__wrapped__ = original
    return name, original, method


@contextlib.contextmanager
def recording_guards(recorder):
    """While active (in this thread, while tracing), conversions of tensors to Python values are
    recorded on ``recorder``. Methods are patched on torch.Tensor for the duration only."""
    patches = [
        _patched("item", ".item()"),
        _patched("tolist", ".tolist()"),
        _patched("__bool__", "bool(tensor)"),
        _patched("__float__", "float(tensor)"),
        _patched("__int__", "int(tensor)"),
        _patched("__index__", "tensor as an index"),
        _patched("__len__", "len(tensor)", convert=lambda t: t.shape[0] if t.dim() else None),
    ]
    _recording.recorder = recorder
    for name, _, method in patches:
        setattr(torch.Tensor, name, method)
    try:
        yield recorder
    finally:
        for name, original, _ in patches:
            setattr(torch.Tensor, name, original)
        _recording.recorder = None


# tracer warnings a guard makes harmless (the conversions above), and one that is harmless by itself
_GUARDED_MESSAGES = ("Converting a tensor to a Python", "Using len to get tensor shape")
_HARMLESS_MESSAGES = ("torch.tensor results are registered as constants",
                      # (pack_padded_sequence's lengths given as a list: a non-tensor argument, in the call's key)
                      "torch.as_tensor results are registered as constants")


def unguarded_tracer_warnings(caught, guarded_places):
    """'file:line: message' of the TracerWarnings no guard covers."""
    out = []
    for w in caught:
        if not issubclass(w.category, torch.jit.TracerWarning):
            continue
        msg = str(w.message).split("\n", 1)[0]
        place = f"{w.filename}:{w.lineno}"
        if msg.startswith(_GUARDED_MESSAGES) and (place in guarded_places or w.filename == __file__):
            continue                     # raised inside a patched conversion: that call is guarded
        if msg.startswith(_HARMLESS_MESSAGES):
            continue
        note = f"{place}: {msg[:160]}"
        if note not in out:
            out.append(note)
    return out
