"""The torch.export path's rules for activations (the elementwise losses are rules/aten_losses.py, written
once for both paths): onnxscript functions traced
by torch's
exporter where torchlib's translation does not mean what eager training means.

Each function below is handed the opset ``op``, ``onnx_ir`` as ``ir`` and the engine's stop-gradient
op, and returns {aten op: rule} for the rules that share its helpers; ``translations`` is their
union, which ``capture.export_registry`` adds to torchlib's registry."""
import torch


def activations_1(op, ir, stop_gradient):
    from onnxscript.function_libs.torch_lib.tensor_typing import TFloat

    def const(v, dt):
        return op.Constant(value=ir.tensor(v, dtype=dt))

    # ---- activations (issue 16, helper "act"; the elementwise losses: rules/aten_losses.py) -----
    # The TorchScript path's reasoning (rules/symbolics.py, rules/losses.py): the engine's
    # activation ops (csrc/ops/misc.c) compute eager's forward and eager's backward, a select
    # where torch selects; where eager's backward is not the derivative of its forward, the
    # forward is a stopped value plus gradient terms that are exactly 0 forward.

    def grad_term(x, grad, dt=None):
        # Pow(1 + (x - StopGradient(x)), StopGradient(grad)) - 1: 0 forward (1^y is 1 for every
        # y, inf and NaN too), gradient ``grad`` with respect to x (Pow's b * a^(b - 1) at a = 1),
        # also where ``grad`` is infinite or NaN (rules/losses._grad_term). An infinite x would
        # make the base inf - inf: it reads 0 there (and gets no gradient). ``dt``: x's dtype,
        # where x is a node whose dtype the trace does not know.
        dt = dt or x.dtype
        one = const(1.0, dt)
        x = op.Where(op.IsInf(x), const(0.0, dt), x)
        base = op.Add(one, op.Sub(x, stop_gradient(x)))
        return op.Sub(op.Pow(base, stop_gradient(grad)), one)

    def with_gradients(value, *terms):
        out = stop_gradient(value)
        for x, grad in terms:
            out = op.Add(out, grad_term(x, grad))
        return out

    def log1p(self: TFloat) -> TFloat:
        # eager: log1p(x), gradient dy / (1 + x). torchlib's Log(1 + x) loses small x entirely
        # (0 for |x| < 6e-8 in float32) and is a local function. The value from Log alone to a
        # few ulps (Goldberg: w = 1 + x; x where w == 1, else log(w) x / (w - 1); x at +inf,
        # where that would be inf / inf), stopped, with eager's gradient as a term.
        dt = self.dtype
        one = const(1.0, dt)
        w = op.Add(one, self)
        exact = op.Or(op.Equal(w, one), op.Equal(self, const(float("inf"), dt)))
        value = op.Where(exact, self, op.Div(op.Mul(op.Log(w), self), op.Sub(w, one)))
        return with_gradients(value, (self, op.Reciprocal(w)))

    def xlogy(self: TFloat, other: TFloat) -> TFloat:
        # eager: NaN where other is NaN, 0 where self == 0, else self log(other); gradients
        # (derivatives.yaml) xlogy(dy, other) masked to 0 where self == 0 and other <= 0 for
        # self, dy self / other for other (NaN at 0 / 0). torchlib's Where on Mul(self,
        # Log(other)) sends its unselected branch a 0 gradient that Mul turns into
        # 0 * log(0) = NaN, and gives self == 0 the gradient dy. Here Log reads 1 where
        # self == 0 and other <= 0 (value 0, self's gradient 0), other's gradient there a
        # term; and where self == 0 and other == inf (value 0, not 0 * inf), self's gradient
        # there (inf) a term. Left: eager's xlogy(dy, other) is 0 where dy is 0 and log(other) infinite,
        # here 0 * inf = NaN.
        dt = self.dtype
        if other.dtype != dt:
            other = op.Cast(other, to=dt)
        zero, inf = const(0.0, dt), const(float("inf"), dt)
        self_zero = op.Equal(self, zero)
        masked = op.And(self_zero, op.LessOrEqual(other, zero))
        at_inf = op.And(self_zero, op.Equal(other, inf))
        out = op.Mul(self, op.Log(op.Where(op.Or(masked, at_inf), const(1.0, dt), other)))
        out = op.Add(out, grad_term(other, op.Where(masked, op.Div(self, other), zero)))
        # (the term reads self only where it is 0: a NaN self would make its base NaN)
        return op.Add(out, grad_term(op.Where(self_zero, self, zero), op.Where(at_inf, inf, zero), dt))

    return {
        # activations and elementwise losses (issue 16, helper "act")
        torch.ops.aten.log1p.default: log1p,
        torch.ops.aten.xlogy.Tensor: xlogy,
    }


def activations_2(op, ir, stop_gradient):
    from typing import Optional
    from onnxscript.function_libs.torch_lib.tensor_typing import TFloat, TInt
    from onnxscript.function_libs.torch_lib.ops import nn as tl_nn

    I64 = ir.DataType.INT64

    def const(v, dt):
        return op.Constant(value=ir.tensor(v, dtype=dt))

    def ints(v):
        return const(list(v), I64)

    def hardswish(self: TFloat) -> TFloat:
        # the engine's HardSwish: eager's x * clamp(x + 3, 0, 6) / 6 and its backward (0 for
        # x <= -3, dy (x / 3 + 1/2) for x < 3, dy elsewhere and at NaN); torchlib's is a local
        # function
        return op.HardSwish(self)

    def mish(self: TFloat) -> TFloat:
        # the engine's Mish: eager's x tanh(softplus(x)) and mish_backward's product; torchlib's
        # is a local function
        return op.Mish(self)

    def glu(self: TFloat, dim: int = -1) -> TFloat:
        # eager: a * sigmoid(b) for the two halves along dim; torchlib's Split is a local
        # function. Two Slices at the half of the dim's size (read from the shape per call).
        rank = len(self.shape)
        axis = dim % rank if rank else 0
        size = op.Shape(self, start=axis, end=axis + 1)
        half = op.Div(size, ints([2]))
        a = op.Slice(self, ints([0]), half, ints([axis]))
        b = op.Slice(self, half, size, ints([axis]))
        return op.Mul(a, op.Sigmoid(b))

    def erf(self: TFloat) -> TFloat:
        # eager: erf, gradient 2 / sqrt(pi) exp(-x^2): the engine's Erf, as the TorchScript
        # path exports it. torchlib's rule (for erf and special_erf) is an ONNX local function.
        return op.Erf(self)

    def nll_loss_nd(self: TFloat, target: TInt, weight: Optional[TFloat] = None, reduction: int = 1,
                    ignore_index: int = -100) -> TFloat:
        # F.nll_loss traces to nll_loss_nd, which torch decomposes into nll_loss for (N, C) but
        # for (N, C, d1..dk) into a gather/where form. torchlib's nll_loss rule
        # (NegativeLogLikelihoodLoss, which takes every rank) means what eager means there
        # (REVIEWED: aten::nll_loss); unbatched ones are nll_loss_forward by then
        # (unbatched_nll_loss_forward).
        return tl_nn.aten_nll_loss(self, target, weight, reduction, ignore_index)

    return {
        torch.ops.aten.hardswish.default: hardswish,
        torch.ops.aten.mish.default: mish,
        torch.ops.aten.glu.default: glu,
        torch.ops.aten.erf.default: erf,
        torch.ops.aten.special_erf.default: erf,
        torch.ops.aten.nll_loss_nd.default: nll_loss_nd,
    }


def translations(op, ir, stop_gradient):
    """{aten op: rule} of this family."""
    return {**activations_1(op, ir, stop_gradient), **activations_2(op, ir, stop_gradient)}
