"""Loss rules written once for both capture paths (``emitter.aten_rule``): smooth_l1_loss,
binary_cross_entropy, soft_margin_loss, multi_margin_loss, multilabel_margin_loss.

Each is a faithful decomposition into ops the engine runs, its gradient eager's backward formula
(derivatives.yaml, Loss.cpp) kinks included: Where gives dy to the branch it selects (the ``z > 0``
tests of the margin kernels, which also drop a NaN z where Relu would propagate it). Where eager's
backward is not the derivative of its forward (binary_cross_entropy's clamped log,
soft_margin_loss), the forward is a stopped value and eager's gradient g enters through a term
that is exactly 0 forward (``grad_term``). torch's own rules decompose these losses with a
different gradient (a division by beta 0, a gradient at z == 0) or, on the TorchScript path at
opset 20, not at all."""
from typing import Optional

import torch

from .emitter import Tensor, aten_rule

_REDUCTIONS = (0, 1, 2)      # none, mean, sum


def reduction_known(a):
    if a.reduction not in _REDUCTIONS:
        return f"reduction {a.reduction!r} is not one of none, mean, sum"
    return None


def one_float_dtype(*names):
    """A check: the named tensors (those given) share one floating dtype (ortmod computes in it,
    where eager would promote mixed ones)."""
    def check(a):
        dts = {getattr(a, n).dtype for n in names if getattr(a, n, None) is not None}
        if len(dts) != 1 or not all(dt is not None and dt.is_floating_point for dt in dts):
            return "ortmod takes it only on floating tensors of one dtype (cast them first)"
        return None
    return check


def integer_target(a):
    if a.target.dtype is None or a.target.dtype.is_floating_point or a.target.dtype.is_complex:
        return "the target must hold class indices (an integer tensor)"
    return None


def rank_1_or_2(a):
    if a.self.rank not in (1, 2):
        return "ortmod takes an input of rank 1 or 2, known at export"
    return None


# ---- helpers ---------------------------------------------------------------------------------

def grad_term(e, x, grad, dt=None):
    """Pow(1 + (x - StopGradient(x)), StopGradient(grad)) - 1: exactly 0 forward (1^y is 1 for
    every y, inf and NaN included), gradient ``grad`` with respect to x (Pow's b * a^(b - 1) at
    a = 1), also where ``grad`` is infinite or NaN, as eager's is at some inputs (a product
    (x - x) * grad would make the forward NaN there). An infinite x would make the base
    inf - inf: it reads 0 there (and gets no gradient), so the forward stays the stopped value's.
    ``dt``: x's dtype, where the graph does not know it."""
    dt = dt or e.dtype(x)
    one = e.const(1.0, dt)
    x = e.op("Where", e.op("IsInf", x), e.const(0.0, dt), x)
    base = e.op("Add", one, e.op("Sub", x, e.stop_gradient(x)))
    return e.op("Sub", e.op("Pow", base, e.stop_gradient(grad)), one)


def with_gradients(e, value, *terms):
    """``value``'s forward, stopped, plus the gradient terms (each exactly 0 forward): what eager
    gives where its backward is not the derivative of its forward."""
    out = e.stop_gradient(value)
    for x, grad in terms:
        out = e.op("Add", out, grad_term(e, x, grad))
    return out


def reduce_loss(e, out, reduction):
    if reduction == 0:
        return out
    return e.op("ReduceMean" if reduction == 1 else "ReduceSum", out, keepdims=0)


def log1p(e, u, dt):
    """log1p(u) to a few ulps from Log alone (Goldberg): w = 1 + u; u where w == 1, else
    log(w) * u / (w - 1). Forward only (its gradient is not log1p's)."""
    one = e.const(1.0, dt)
    w = e.op("Add", one, u)
    return e.op("Where", e.op("Equal", w, one), u, e.op("Div", e.op("Mul", e.op("Log", w), u), e.op("Sub", w, one)))


def piecewise(e, d, k, scale, quadratic, dt):
    """Where(d <= -k, scale * (-d - k/2), Where(d >= k, scale * (d - k/2), quadratic)): the
    branches eager's smooth_l1/huber backward kernels take (x <= -k, x >= k, else), each with
    the forward's value there (|d| = -d or d exactly)."""
    half = e.const(0.5 * k, dt)
    neg, pos = e.op("Sub", e.op("Neg", d), half), e.op("Sub", d, half)
    if scale != 1.0:
        sc = e.const(scale, dt)
        neg, pos = e.op("Mul", sc, neg), e.op("Mul", sc, pos)
    out = e.op("Where", e.op("GreaterOrEqual", d, e.const(k, dt)), pos, quadratic)
    return e.op("Where", e.op("LessOrEqual", d, e.const(-k, dt)), neg, out)


# ---- smooth_l1 -------------------------------------------------------------------------------

def _beta_non_negative(a):
    return "beta must be non-negative" if a.beta < 0 else None


@aten_rule("aten::smooth_l1_loss", checks=(one_float_dtype("self", "target"), reduction_known, _beta_non_negative),
           why="torch's decompositions divide by beta 0 (NaN gradients)")
def smooth_l1_loss(e, self: Tensor, target: Tensor, reduction: int = 1, beta: float = 1.0):
    """eager (Loss.cpp): z = |x - y|, z < beta ? 0.5 z^2 / beta : z - beta / 2; its backward
    (smooth_l1_backward kernel) is -1 for d <= -beta, 1 for d >= beta, d / beta between, for
    the input and, with d = y - x, for the target.

    beta == 0 (reached only through aten's own op: F.smooth_l1_loss calls l1_loss then): |d|,
    but with eager's gradient at d == 0, -1 for both input and target (the kernel's first test,
    d <= -0, holds for both)."""
    dt = e.dtype(self)
    d = e.op("Sub", self, target)
    if beta == 0.0:
        zero, one = e.const(0.0, dt), e.const(1.0, dt)
        at_zero = e.op("Neg", e.op("Add", grad_term(e, self, one), grad_term(e, target, one)))
        out = e.op("Where", e.op("Less", d, zero), e.op("Neg", d),
                   e.op("Where", e.op("Greater", d, zero), d, at_zero))
        return reduce_loss(e, out, reduction)
    quad = e.op("Div", e.op("Mul", e.op("Mul", e.const(0.5, dt), d), d), e.const(beta, dt))
    return reduce_loss(e, piecewise(e, d, beta, 1.0, quad, dt), reduction)


# ---- binary_cross_entropy, soft_margin -------------------------------------------------------

# Loss.cpp's EPSILON in binary_cross_entropy_backward, max((1 - x) x, EPSILON): a C++ float, so
# 1e-12 rounded to float32 whatever the input's dtype (float64 inputs showed it: 4e-9 relative)
_BCE_EPS = float(torch.tensor(1e-12, dtype=torch.float32))


@aten_rule("aten::binary_cross_entropy", checks=(one_float_dtype("self", "target", "weight"), reduction_known),
           why="its backward is not its clamped forward's derivative (torch's decomposition differentiates that)")
def binary_cross_entropy(e, self: Tensor, target: Tensor, weight: Optional[Tensor] = None, reduction: int = 1):
    """eager (Loss.cpp): w * ((t - 1) max(log1p(-x), -100) - t max(log(x), -100)), reduced (mean:
    over the elements, weights or not). Its backward is not the clamped forward's derivative:
    input dy w (x - t) / max((1 - x) x, 1e-12), target dy w (-logit(x)) (inf at x 0 or 1); both
    are given exactly, as gradient terms on a stopped forward (with_gradients)."""
    dt = e.dtype(self)
    one, lo = e.const(1.0, dt), e.const(-100.0, dt)
    log1m = e.op("Max", log1p(e, e.op("Neg", self), dt), lo)
    logx = e.op("Max", e.op("Log", self), lo)
    loss = e.op("Sub", e.op("Mul", e.op("Sub", target, one), log1m), e.op("Mul", target, logx))
    one_minus = e.op("Sub", one, self)
    gx = e.op("Div", e.op("Sub", self, target), e.op("Max", e.op("Mul", one_minus, self), e.const(_BCE_EPS, dt)))
    gt = e.op("Neg", e.op("Log", e.op("Div", self, one_minus)))
    if weight is not None:
        loss, gx, gt = (e.op("Mul", v, weight) for v in (loss, gx, gt))
    return reduce_loss(e, with_gradients(e, loss, (self, gx), (target, gt)), reduction)


@aten_rule("aten::soft_margin_loss", checks=(one_float_dtype("self", "target"), reduction_known),
           why="its backward is given exactly (torch's decomposition: Softplus, finite where eager's loss is inf)")
def soft_margin_loss(e, self: Tensor, target: Tensor, reduction: int = 1):
    """eager (Loss.cpp): log1p(exp(-x t)), reduced; inf where exp overflows (kept: Softplus alone
    would be finite there). Its backward, -t z / (1 + z) with z = exp(-x t) (NaN where z is inf),
    is given exactly as a gradient term. The target gets no gradient (eager raises when it
    requires one). Left: at an infinite input whose loss is inf, eager's gradient is inf / inf =
    NaN, here 0 (grad_term reads an infinite x as 0)."""
    dt = e.dtype(self)
    v = e.op("Mul", e.op("Neg", self), target)
    z = e.op("Exp", v)
    loss = e.op("Where", e.op("IsInf", z), z, e.op("Softplus", v))
    gx = e.op("Div", e.op("Mul", e.op("Neg", target), z), e.op("Add", e.const(1.0, dt), z))
    return reduce_loss(e, with_gradients(e, loss, (self, gx)), reduction)


# ---- multi_margin, multilabel_margin ---------------------------------------------------------

def _batched(e, x):
    """A vector (C,) as a batch of one (eager's dim <= 1 case)."""
    return e.op("Unsqueeze", x, e.ints([0])) if e.rank(x) == 1 else x


def _classes(e, x, dt):
    """(C as a 0-d float of dtype dt, arange(C)) for x of shape (N, C)."""
    c = e.op("Gather", e.op("Shape", x), e.const(1, torch.int64), axis=0)
    return e.op("Cast", c, to=dt), e.op("Range", e.const(0, torch.int64), c, e.const(1, torch.int64))


def _p_1_or_2(a):
    return None if a.p in (1.0, 2.0) else "only p 1 and 2 are supported (as eager)"


@aten_rule("aten::multi_margin_loss", "ortmod::multi_margin_loss",
           checks=(one_float_dtype("self", "weight"), reduction_known, _p_1_or_2, integer_target, rank_1_or_2),
           why="torch's decomposition gives a gradient at z == 0, where eager's kernel tests z > 0")
def multi_margin_loss(e, self: Tensor, target: Tensor, p: float = 1.0, margin: float = 1.0,
                      weight: Optional[Tensor] = None, reduction: int = 1):
    """eager (MultiMarginCriterion.cpp): per sample, sum over classes d != y of
    w[y] * max(0, margin - x[y] + x[d])^p, divided by C; mean over samples (weights or not).
    Its backward is g * w[y] (p 1) or 2 g z w[y] (p 2) where z > 0 strictly. Where(z > 0, ...)
    gives both, and eager's 0 for a NaN z (its test fails; Relu would propagate the NaN).
    (ortmod::multi_margin_loss: the export path's copy kept whole through decomposition.)"""
    dt = e.dtype(self)
    x = _batched(e, self)
    y = e.op("Reshape", target, e.ints([-1, 1]))                                     # (N, 1)
    z = e.op("Add", e.op("Sub", e.const(margin, dt), e.op("GatherElements", x, y, axis=1)), x)
    zero = e.const(0.0, dt)
    c_f, classes = _classes(e, x, dt)
    counted = e.op("And", e.op("Greater", z, zero), e.op("Not", e.op("Equal", classes, y)))   # z > 0, d != y
    h = e.op("Where", counted, z, zero)        # before squaring: 0 * NaN would reach the gradient
    if p == 2.0:
        h = e.op("Mul", h, h)
    if weight is not None:
        h = e.op("Mul", h, e.op("Gather", weight, y, axis=0))
    out = e.op("Div", e.op("ReduceSum", h, e.ints([1]), keepdims=0), c_f)
    if reduction == 0:
        # eager: (N,) for a 2-d input or a 1-element target vector, 0-d for a 0-d target
        return e.op("Reshape", out, e.op("Shape", target))
    return reduce_loss(e, out, reduction)


def _target_of_input_rank(a):
    return None if a.target.rank == a.self.rank else "ortmod takes a target of the input's rank"


@aten_rule("aten::multilabel_margin_loss",
           checks=(one_float_dtype("self"), reduction_known, integer_target, rank_1_or_2, _target_of_input_rank),
           why="torch's decomposition gives a gradient at z == 0, where eager's kernel tests z > 0")
def multilabel_margin_loss(e, self: Tensor, target: Tensor, reduction: int = 1):
    """eager (MultilabelMarginCriterion.cpp): per sample, the targets are y[0..k) up to the first
    negative entry; is_target marks them; loss = sum over target slots k (a repeated class
    counts again, as eager's loop) and non-target classes i of max(0, 1 - x[y[k]] + x[i]), / C.
    Backward: -g at y[k], +g at i where z > 0 strictly (Where's gradient)."""
    dt = e.dtype(self)
    rank = e.rank(self)
    x, y = _batched(e, self), _batched(e, target)                                     # (N, C), (N, K)
    zero_i = e.const(0, torch.int64)
    stopped = e.op("CumSum", e.op("Cast", e.op("Less", y, zero_i), to=torch.int64), e.const(1, torch.int64))
    valid = e.op("Equal", stopped, zero_i)                                            # before the first y < 0
    ys = e.op("Where", valid, y, zero_i)
    c_f, classes = _classes(e, x, dt)
    hit = e.op("And", e.op("Equal", e.op("Unsqueeze", ys, e.ints([2])), classes),
               e.op("Unsqueeze", valid, e.ints([2])))                                 # (N, K, C)
    is_target = e.op("Greater", e.op("ReduceMax", e.op("Cast", hit, to=dt), e.ints([1]), keepdims=0),
                     e.const(0.0, dt))
    x_y = e.op("GatherElements", x, ys, axis=1)                                       # (N, K)
    z = e.op("Add", e.op("Sub", e.const(1.0, dt), e.op("Unsqueeze", x_y, e.ints([2]))),
             e.op("Unsqueeze", x, e.ints([1])))                                       # (N, K, C)
    mask = e.op("And", e.op("Unsqueeze", valid, e.ints([2])), e.op("Unsqueeze", e.op("Not", is_target), e.ints([1])))
    mask = e.op("And", mask, e.op("Greater", z, e.const(0.0, dt)))                    # eager's z > 0 (NaN: 0)
    h = e.op("Where", mask, z, e.const(0.0, dt))
    out = e.op("Div", e.op("ReduceSum", h, e.ints([1, 2]), keepdims=0), c_f)
    if reduction == 0:
        return out if rank == 2 else e.op("Squeeze", out, e.ints([0]))
    return reduce_loss(e, out, reduction)
