"""The torch.export path's rules for activations and elementwise losses: onnxscript functions traced
by torch's
exporter where torchlib's translation does not mean what eager training means.

Each function below is handed the opset ``op``, ``onnx_ir`` as ``ir`` and the engine's stop-gradient
op, and returns {aten op: rule} for the rules that share its helpers; ``translations`` is their
union, which ``capture.export_registry`` adds to torchlib's registry."""
import torch


def activations_1(op, ir, stop_gradient):
    from typing import Optional
    from onnxscript.function_libs.torch_lib.tensor_typing import TFloat, TInt

    I64 = ir.DataType.INT64

    def const(v, dt):
        return op.Constant(value=ir.tensor(v, dtype=dt))

    def ints(v):
        return const(list(v), I64)

    # ---- activations and elementwise losses (issue 16, helper "act") ---------------------------
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

    def attr_exact(v, dt):
        # the engine reads a float attribute as float32 (ONNX's type): exact for a float32 (or
        # narrower) input, and for a float64 one only where float32 holds the value
        import numpy as np
        return dt != ir.DataType.DOUBLE or float(np.float32(v)) == float(v)

    def elu_coefficient(x, neg, pos):
        # Elu(x, 1) is x for x > 0, expm1(x) elsewhere (gradient dy, dy exp(x); NaN the linear
        # branch), as eager's elu: times neg where x <= 0, pos elsewhere (constants of x's dtype)
        # is eager's elu with negcoef = neg, poscoef = pos, exact in float64
        dt = x.dtype
        c = op.Where(op.LessOrEqual(x, const(0.0, dt)), const(neg, dt), const(pos, dt))
        return op.Mul(op.Elu(x, alpha=1.0), c)

    def with_gradients(value, *terms):
        out = stop_gradient(value)
        for x, grad in terms:
            out = op.Add(out, grad_term(x, grad))
        return out

    def reduce_loss(out, reduction):
        if reduction == 0:
            return out
        if reduction == 1:
            return op.ReduceMean(out, keepdims=0)
        if reduction == 2:
            return op.ReduceSum(out, keepdims=0)
        raise NotImplementedError(f"ortmod: loss reduction {reduction!r}")

    def leaky_relu(self: TFloat, negative_slope: float = 0.01) -> TFloat:
        # the engine's LeakyRelu is eager's (x > 0 ? x : slope x, gradient dy or slope dy on
        # the same test, NaN the slope branch), torchlib's rule; a float64 slope float32 cannot
        # hold is x times Where(x > 0, 1, slope): the same values and gradient, exact
        if attr_exact(negative_slope, self.dtype):
            return op.LeakyRelu(self, alpha=negative_slope)
        dt = self.dtype
        return op.Mul(self, op.Where(op.Greater(self, const(0.0, dt)), const(1.0, dt), const(negative_slope, dt)))

    def elu(self: TFloat, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0) -> TFloat:
        # eager: x <= 0 ? alpha scale expm1(x) : scale x (input_scale other than 1 refused by
        # _CHECKS). The engine's Elu(alpha) is eager's, gradient a select on x <= 0 (NaN the
        # linear branch); torchlib's rule, with the float64 form where float32 cannot hold alpha
        if attr_exact(alpha, self.dtype):
            y = op.Elu(self, alpha=alpha)
            return y if scale == 1.0 else op.Mul(y, const(scale, self.dtype))
        return elu_coefficient(self, alpha * scale, scale)

    def celu(self: TFloat, alpha: float = 1.0) -> TFloat:
        # the engine's Celu is eager's (elu(x, alpha, 1, 1 / alpha): x <= 0 ? alpha expm1(x /
        # alpha) : x; gradient exp(x / alpha) there, dy elsewhere and at NaN) in every float
        # dtype; torchlib's rule computes a float64 input in float32. A float64 alpha > 0 that
        # float32 cannot hold: Elu(x / alpha, 1) alpha where x <= 0 (a select: the other branch
        # gets a 0 gradient, never 0 * inf); alpha < 0 there is refused by _CHECKS.
        if attr_exact(alpha, self.dtype):
            return op.Celu(self, alpha=alpha)
        # eager's backward (derivatives.yaml) takes input_scale as 1 / alpha.toFloat(): dy /
        # float32(alpha) * alpha * exp(x / float32(alpha)) for x <= 0, which is not the forward's
        # derivative in float64; given as a term on the stopped value (exponent 0 for x > 0, so
        # the unselected branch never sees 0 * inf)
        import numpy as np
        dt = self.dtype
        inv32 = 1.0 / float(np.float32(alpha))
        neg_side = op.LessOrEqual(self, const(0.0, dt))
        value = op.Mul(op.Elu(op.Mul(self, const(1.0 / alpha, dt)), alpha=1.0), const(alpha, dt))
        grad = op.Mul(const(inv32 * alpha, dt), op.Exp(op.Mul(self, const(inv32, dt))))
        neg = with_gradients(value, (self, op.Where(neg_side, grad, const(0.0, dt))))
        return op.Where(neg_side, neg, self)

    def selu(self: TFloat) -> TFloat:
        # the engine's Selu: eager's elu(x, SELU alpha, SELU scale) and its backward (x <= 0 takes
        # the exponential branch, NaN the linear one); torchlib's is a local function. Its
        # constants are float32: a float64 input takes them as float64 (elu_coefficient).
        if self.dtype != ir.DataType.DOUBLE:
            return op.Selu(self)
        alpha, scale = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
        return elu_coefficient(self, alpha * scale, scale)

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

    def binary_cross_entropy(self: TFloat, target: TFloat, weight: Optional[TFloat] = None,
                             reduction: int = 1) -> TFloat:
        # eager (Loss.cpp): w ((t - 1) max(log1p(-x), -100) - t max(log(x), -100)), reduced.
        # Its backward is not the clamped forward's derivative: input dy w (x - t) /
        # max((1 - x) x, 1e-12), target dy w (-logit(x)); both given exactly as gradient terms
        # on a stopped forward (the TorchScript path's rule, rules/losses.py). Registering it
        # keeps the op whole (decomposed, maximum's gradient would be 0 at the clamps).
        dt = self.dtype
        one, lo = const(1.0, dt), const(-100.0, dt)
        neg = op.Neg(self)
        w = op.Add(one, neg)
        log1m = op.Where(op.Equal(w, one), neg, op.Div(op.Mul(op.Log(w), neg), op.Sub(w, one)))
        log1m = op.Max(log1m, lo)
        logx = op.Max(op.Log(self), lo)
        loss = op.Sub(op.Mul(op.Sub(target, one), log1m), op.Mul(target, logx))
        one_minus = op.Sub(one, self)
        eps = const(float(torch.tensor(1e-12, dtype=torch.float32)), dt)
        gx = op.Div(op.Sub(self, target), op.Max(op.Mul(one_minus, self), eps))
        gt = op.Neg(op.Log(op.Div(self, one_minus)))
        if weight is not None:
            loss, gx, gt = op.Mul(loss, weight), op.Mul(gx, weight), op.Mul(gt, weight)
        return reduce_loss(with_gradients(loss, (self, gx), (target, gt)), reduction)

    def soft_margin_loss(self: TFloat, target: TFloat, reduction: int = 1) -> TFloat:
        # eager (Loss.cpp): log1p(exp(-x t)), reduced; inf where exp overflows (Softplus alone
        # would be finite there). Its backward -t z / (1 + z), z = exp(-x t) (NaN where z is
        # inf), as a gradient term. Eager has no gradient for the target (it raises when the
        # target requires grad); here it gets none. The TorchScript path's rule; registered,
        # the op stays whole. Left: at an infinite input whose loss is inf, eager's gradient is
        # inf / inf = NaN, here 0 (grad_term reads an infinite x as 0).
        dt = self.dtype
        v = op.Mul(op.Neg(self), target)
        z = op.Exp(v)
        loss = op.Where(op.IsInf(z), z, op.Softplus(v))
        gx = op.Div(op.Mul(op.Neg(target), z), op.Add(const(1.0, dt), z))
        return reduce_loss(with_gradients(loss, (self, gx)), reduction)

    def piecewise(d, k, scale, quadratic, dt):
        # Where(d <= -k, scale (-d - k/2), Where(d >= k, scale (d - k/2), quadratic)): the
        # branches eager's smooth_l1/huber backward kernels take (rules/losses._piecewise)
        half = const(0.5 * k, dt)
        neg, pos = op.Sub(op.Neg(d), half), op.Sub(d, half)
        if scale != 1.0:
            neg, pos = op.Mul(const(scale, dt), neg), op.Mul(const(scale, dt), pos)
        out = op.Where(op.GreaterOrEqual(d, const(k, dt)), pos, quadratic)
        return op.Where(op.LessOrEqual(d, const(-k, dt)), neg, out)

    def smooth_l1_loss(self: TFloat, target: TFloat, reduction: int = 1, beta: float = 1.0) -> TFloat:
        # eager (Loss.cpp): z = |d|, z < beta ? 0.5 z^2 / beta : z - beta / 2; its backward -1
        # for d <= -beta, 1 for d >= beta, d / beta between. beta 0 (aten's own op:
        # F.smooth_l1_loss calls l1_loss then): |d|, with eager's gradient -1 at d == 0 for
        # input and target alike; torch's decomposition divides by beta there (NaN gradients).
        # The TorchScript path's rule (rules/losses.py).
        dt = self.dtype
        d = op.Sub(self, target)
        if beta == 0.0:
            zero, one = const(0.0, dt), const(1.0, dt)
            at_zero = op.Neg(op.Add(grad_term(self, one), grad_term(target, one)))
            out = op.Where(op.Less(d, zero), op.Neg(d), op.Where(op.Greater(d, zero), d, at_zero))
            return reduce_loss(out, reduction)
        quad = op.Div(op.Mul(op.Mul(const(0.5, dt), d), d), const(float(beta), dt))
        return reduce_loss(piecewise(d, float(beta), 1.0, quad, dt), reduction)

    def batched(x):
        # a vector (C,) as a batch of one, as eager's dim <= 1 case
        return op.Unsqueeze(x, ints([0])) if len(x.shape) == 1 else x

    def classes_of(x, dt):
        # (C as a float of dtype dt, arange(C)) for x of shape (N, C)
        c = op.Gather(op.Shape(x), const(1, I64), axis=0)
        return op.Cast(c, to=dt), op.Range(const(0, I64), c, const(1, I64))

    def multi_margin_loss(self: TFloat, target: TInt, p: float = 1.0, margin: float = 1.0,
                          weight: Optional[TFloat] = None, reduction: int = 1) -> TFloat:
        # eager (MultiMarginCriterion.cpp): per sample, the sum over classes d != y of
        # w[y] max(0, margin - x[y] + x[d])^p, over C. Its backward is dy w[y] (p 1) or
        # 2 dy z w[y] (p 2) where z > 0 strictly, 0 for a NaN z: Where(z > 0) gives both
        # (torch's decomposition gave a gradient at z == 0). The TorchScript path's rule.
        dt = self.dtype
        x = batched(self)
        y = op.Reshape(target, ints([-1, 1]))
        z = op.Add(op.Sub(const(float(margin), dt), op.GatherElements(x, y, axis=1)), x)
        zero = const(0.0, dt)
        c_f, classes = classes_of(x, dt)
        counted = op.And(op.Greater(z, zero), op.Not(op.Equal(classes, y)))
        h = op.Where(counted, z, zero)      # before squaring: 0 * NaN would reach the gradient
        if p == 2:
            h = op.Mul(h, h)
        if weight is not None:
            h = op.Mul(h, op.Gather(weight, y, axis=0))
        out = op.Div(op.ReduceSum(h, ints([1]), keepdims=0), c_f)
        if reduction == 0:      # (N,) for a 2-d input or a target (1,); 0-d for a 0-d target
            return op.Reshape(out, op.Shape(target))
        return reduce_loss(out, reduction)

    def multilabel_margin_loss(self: TFloat, target: TInt, reduction: int = 1) -> TFloat:
        # eager (MultilabelMarginCriterion.cpp): per sample, the targets y[0..k) up to the first
        # negative entry; the sum over those slots k (a repeated class counts again) and the
        # non-target classes i of max(0, 1 - x[y[k]] + x[i]), over C. Backward -dy at y[k], +dy
        # at i where z > 0 strictly (Where's gradient). Registered, the op stays whole (torch's
        # decomposition gave a gradient at z == 0). The TorchScript path's rule.
        dt = self.dtype
        rank = len(self.shape)
        x = batched(self)
        y = batched(target)                                                     # (N, K)
        zero_i = const(0, I64)
        stopped = op.CumSum(op.Cast(op.Less(y, zero_i), to=I64), const(1, I64))
        valid = op.Equal(stopped, zero_i)                                       # before the first y < 0
        ys = op.Where(valid, y, zero_i)
        c_f, classes = classes_of(x, dt)
        hit = op.And(op.Equal(op.Unsqueeze(ys, ints([2])), classes), op.Unsqueeze(valid, ints([2])))
        is_target = op.Greater(op.ReduceMax(op.Cast(hit, to=dt), ints([1]), keepdims=0), const(0.0, dt))
        x_y = op.GatherElements(x, ys, axis=1)                                  # (N, K)
        z = op.Add(op.Sub(const(1.0, dt), op.Unsqueeze(x_y, ints([2]))), op.Unsqueeze(x, ints([1])))
        mask = op.And(op.Unsqueeze(valid, ints([2])), op.Unsqueeze(op.Not(is_target), ints([1])))
        mask = op.And(mask, op.Greater(z, const(0.0, dt)))                      # eager's z > 0 (NaN: 0)
        h = op.Where(mask, z, const(0.0, dt))
        out = op.Div(op.ReduceSum(h, ints([1, 2]), keepdims=0), c_f)
        if reduction == 0:
            return out if rank == 2 else op.Squeeze(out, ints([0]))
        return reduce_loss(out, reduction)

    return {
        # activations and elementwise losses (issue 16, helper "act")
        torch.ops.aten.leaky_relu.default: leaky_relu,
        torch.ops.aten.elu.default: elu,
        torch.ops.aten.celu.default: celu,
        torch.ops.aten.selu.default: selu,
        torch.ops.aten.log1p.default: log1p,
        torch.ops.aten.xlogy.Tensor: xlogy,
        torch.ops.aten.binary_cross_entropy.default: binary_cross_entropy,
        torch.ops.aten.soft_margin_loss.default: soft_margin_loss,
        torch.ops.aten.smooth_l1_loss.default: smooth_l1_loss,
        torch.ops.aten.multi_margin_loss.default: multi_margin_loss,
        torch.ops.ortmod.multi_margin_loss.default: multi_margin_loss,      # keep_whole
        torch.ops.aten.multilabel_margin_loss.default: multilabel_margin_loss,
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

    def softplus(self: TFloat, beta: float = 1.0, threshold: float = 20.0) -> TFloat:
        # eager: x where beta x > threshold, else log1p(exp(beta x)) / beta; its backward a select
        # on the same test (dy there, dy sigmoid(beta x) elsewhere). torchlib's rule means the
        # same but is an ONNX local function, which the engine does not take. The engine's
        # Softplus is the stable form and its gradient eager's sigmoid; the Where's gradient is a
        # select, so the unselected branch gets 0 (never 0 * inf). The TorchScript path's rule.
        dt = self.dtype
        bx = self if beta == 1.0 else op.Mul(self, const(beta, dt))
        soft = op.Softplus(bx)
        if beta != 1.0:
            soft = op.Div(soft, const(beta, dt))
        return op.Where(op.Greater(bx, const(threshold, dt)), self, soft)

    def hardsigmoid(self: TFloat) -> TFloat:
        # eager: clamp(x + 3, 0, 6) / 6, gradient dy / 6 for -3 < x < 3, else 0 (NaN too).
        # torchlib's HardSigmoid(1/6, 1/2): the engine's kernel is that, with a float32 1/6:
        # exact enough for float32 inputs, not for float64 ones (1e-8, and the kink moves), which
        # get eager's form: selects, NaN passed on without a gradient. Eager's backward
        # multiplies by the float32 1/6 in every dtype (hardsigmoid_backward's one_sixth):
        # inside, the value (x + 3) / 6 is stopped and (x - x) times that constant adds the
        # gradient (x is finite there)
        import numpy as np
        if self.dtype != ir.DataType.DOUBLE:
            return op.HardSigmoid(self, alpha=1.0 / 6, beta=0.5)
        dt = self.dtype
        three = const(3.0, dt)
        inside = op.And(op.Greater(self, op.Neg(three)), op.Less(self, three))
        outside = op.Where(op.GreaterOrEqual(self, three), const(1.0, dt),
                           op.Where(op.LessOrEqual(self, op.Neg(three)), const(0.0, dt), stop_gradient(self)))
        value = stop_gradient(op.Div(op.Add(self, three), const(6.0, dt)))
        slope = op.Mul(op.Sub(self, stop_gradient(self)), const(float(np.float32(1.0 / 6)), dt))
        return op.Where(inside, op.Add(value, slope), outside)

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
        torch.ops.aten.hardsigmoid.default: hardsigmoid,
        torch.ops.aten.softplus.default: softplus,
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
