"""Activation rules written once for both capture paths (``emitter.aten_rule``): log_sigmoid,
softplus, hardtanh, relu6, leaky_relu, elu, celu, selu, hardsigmoid. torch's rules give them
another meaning than eager training's (a ``Log(Sigmoid(x))`` that is -inf where sigmoid
underflows, a dropped threshold, clamp's gradient at hardtanh's bounds, float32 coefficients in a
float64 model) or are ONNX local functions, which the engine does not take."""
import torch

from .aten_losses import with_gradients
from .emitter import Tensor, aten_rule


@aten_rule("aten::log_sigmoid",
           why="torch's Log(Sigmoid(x)) is -inf where sigmoid underflows; ortmod's -Softplus(-x) is eager's")
def log_sigmoid(e, self: Tensor):
    """eager (log_sigmoid CPU kernel): min(x, 0) - log1p(exp(-|x|)), as -Softplus(-x): the
    engine's Softplus(z) is z + log1p(exp(-z)) for z > 0, log1p(exp(z)) otherwise, at z = -x
    exactly eager's two branches, its gradient sigmoid(-x) eager's. torch's rules give
    Log(Sigmoid(x)), -inf where sigmoid underflows (x < -745 in float64, -104 in float32), and
    lose log1p's precision for large x (3.6e-8 relative at x = 20 in float64)."""
    return e.op("Neg", e.op("Softplus", e.op("Neg", self)))


@aten_rule("aten::softplus", why="torch's TorchScript rule drops the threshold; torchlib's is a local function")
def softplus(e, self: Tensor, beta: float = 1.0, threshold: float = 20.0):
    """eager: x where beta x > threshold, else log1p(exp(beta x)) / beta; its backward a select
    on the same test (dy there, dy sigmoid(beta x) elsewhere). The engine's Softplus is the
    stable form and its gradient eager's sigmoid; the Where's gradient is a select, so the
    unselected branch gets 0 (never 0 * inf)."""
    dt = e.dtype(self)
    bx = self if beta == 1.0 else e.op("Mul", self, e.const(beta, dt))
    soft = e.op("Softplus", bx)
    if beta != 1.0:
        soft = e.op("Div", soft, e.const(beta, dt))
    return e.op("Where", e.op("Greater", bx, e.const(threshold, dt)), self, soft)


@aten_rule("aten::hardtanh", why="torch's Clip has clamp's gradient at the bounds, not hardtanh's (0)")
def hardtanh(e, self: Tensor, min_val: float = -1.0, max_val: float = 1.0):
    """eager: clamp's forward (NaN stays NaN), hardtanh_backward's gradient: 0 where x <= min or
    x >= max, else dy; torch's Clip has clamp's (dy at the bounds). ortmod::HardTanh is the
    engine's op for it. At NaN eager's own kernels disagree (the scalar one gives dy, the
    vectorized one 0); the engine's is the scalar's. The bounds in self's dtype, as eager's
    kernel converts them (an integer tensor's truncated: hardtanh(x, -0.5, 3.5) is clamp(x, 0,
    3), Clip: no gradient through integers)."""
    dt = e.dtype(self)
    if dt is not None and not dt.is_floating_point:
        return e.op("Clip", self, e.const(int(min_val), dt), e.const(int(max_val), dt))
    return e.op("ortmod::HardTanh", self, e.const(min_val, dt), e.const(max_val, dt))


@aten_rule("aten::relu6", why="eager's relu6 is hardtanh(x, 0, 6): gradient 0 at 0 and 6 (torch's Clip: dy)")
def relu6(e, self: Tensor):
    return hardtanh(e, self, 0.0, 6.0)


# ---- leaky_relu, elu, celu, selu, hardsigmoid: float64 exact ----------------------------------
# The engine reads a float attribute as float32 (ONNX's type): torch's rules write leaky_relu's
# slope, elu's coefficients and SELU's constants so, and a float64 model then computes with 0.01f
# (1e-8 off). For a float64 input whose coefficients float32 cannot hold, these rules give eager's
# values and gradients from float64 constants.

def _attr_exact(v, dt):
    """A float attribute means v exactly: a float32 (or narrower) input, or a float64 one where
    float32 holds v."""
    import numpy as np
    return dt != torch.float64 or float(np.float32(v)) == float(v)


def _elu_coefficients(e, x, neg, pos):
    """eager's elu with negcoef neg and poscoef pos, input_scale 1: Elu(x, 1) (x for x > 0,
    expm1(x) elsewhere; gradient dy, dy exp(x); NaN the linear branch) times neg where x <= 0,
    pos elsewhere (constants of x's dtype), exact in float64."""
    dt = e.dtype(x)
    c = e.op("Where", e.op("LessOrEqual", x, e.const(0.0, dt)), e.const(neg, dt), e.const(pos, dt))
    return e.op("Mul", e.op("Elu", x, alpha=1.0), c)


@aten_rule("aten::leaky_relu", why="float64 exact where the engine's float32 attribute is not")
def leaky_relu(e, self: Tensor, negative_slope: float = 0.01):
    """The engine's LeakyRelu is eager's (x > 0 ? x : slope x, gradient dy or slope dy on the
    same test, NaN the slope branch); a float64 slope float32 cannot hold is x times
    Where(x > 0, 1, slope): the same values and gradient, exact."""
    dt = e.dtype(self)
    if _attr_exact(negative_slope, dt):
        return e.op("LeakyRelu", self, alpha=negative_slope)
    return e.op("Mul", self, e.op("Where", e.op("Greater", self, e.const(0.0, dt)), e.const(1.0, dt),
                                  e.const(negative_slope, dt)))


def _input_scale_one(a):
    # nn.ELU, F.elu, CELU and SELU never pass it; torch's rules scale both branches by it
    return None if a.input_scale == 1 else "input_scale other than 1 is not reproduced by ortmod"


@aten_rule("aten::elu", checks=(_input_scale_one,), why="float64 exact where the engine's float32 attribute is not")
def elu(e, self: Tensor, alpha: float = 1.0, scale: float = 1.0, input_scale: float = 1.0):
    """eager: x <= 0 ? alpha scale expm1(x) : scale x. The engine's Elu(alpha) is eager's, its
    gradient a select on x <= 0 (NaN the linear branch); the float64 form where float32 cannot
    hold alpha."""
    dt = e.dtype(self)
    if _attr_exact(alpha, dt):
        y = e.op("Elu", self, alpha=alpha)
        return y if scale == 1.0 else e.op("Mul", y, e.const(scale, dt))
    return _elu_coefficients(e, self, alpha * scale, scale)


def _celu_alpha_exact(a):
    import numpy as np
    if a.self.dtype == torch.float64 and a.alpha < 0 and float(np.float32(a.alpha)) != float(a.alpha):
        return "a negative alpha that float32 cannot hold is not reproduced exactly in float64 by ortmod"
    return None


@aten_rule("aten::celu", checks=(_celu_alpha_exact,), why="float64 exact (torchlib's computes it in float32)")
def celu(e, self: Tensor, alpha: float = 1.0):
    """The engine's Celu is eager's (elu(x, alpha, 1, 1 / alpha): x <= 0 ? alpha expm1(x /
    alpha) : x; gradient exp(x / alpha) there, dy elsewhere and at NaN) in every float dtype. A
    float64 alpha > 0 that float32 cannot hold: Elu(x / alpha, 1) alpha where x <= 0 (a select:
    the other branch gets a 0 gradient, never 0 * inf). Eager's backward (derivatives.yaml)
    takes input_scale as 1 / alpha.toFloat(): dy / float32(alpha) * alpha * exp(x /
    float32(alpha)) for x <= 0, not the forward's derivative in float64; given as a gradient
    term on the stopped value (exponent 0 for x > 0, so the unselected branch never sees 0 * inf)."""
    import numpy as np
    dt = e.dtype(self)
    if _attr_exact(alpha, dt):
        return e.op("Celu", self, alpha=alpha)
    inv32 = 1.0 / float(np.float32(alpha))
    neg_side = e.op("LessOrEqual", self, e.const(0.0, dt))
    value = e.op("Mul", e.op("Elu", e.op("Mul", self, e.const(1.0 / alpha, dt)), alpha=1.0), e.const(alpha, dt))
    grad = e.op("Mul", e.const(inv32 * alpha, dt), e.op("Exp", e.op("Mul", self, e.const(inv32, dt))))
    neg = with_gradients(e, value, (self, e.op("Where", neg_side, grad, e.const(0.0, dt))))
    return e.op("Where", neg_side, neg, self)


@aten_rule("aten::selu", why="float64 exact (SELU's constants are not float32 numbers); torchlib's is a local function")
def selu(e, self: Tensor):
    """The engine's Selu: eager's elu(x, SELU alpha, SELU scale) and its backward (x <= 0 takes
    the exponential branch, NaN the linear one). Its constants are float32: a float64 input
    takes them as float64."""
    if e.dtype(self) != torch.float64:
        return e.op("Selu", self)
    alpha, scale = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
    return _elu_coefficients(e, self, alpha * scale, scale)


@aten_rule("aten::hardsigmoid", why="float64 exact (the engine's 1/6 attribute is float32)")
def hardsigmoid(e, self: Tensor):
    """eager: clamp(x + 3, 0, 6) / 6, gradient dy / 6 for -3 < x < 3, else 0 (NaN too). The
    engine's HardSigmoid(1/6, 1/2) is that with a float32 1/6: exact enough for float32 inputs,
    not for float64 ones (1e-8, and the kink moves), which get eager's form: selects, NaN passed
    on without a gradient. Eager's backward multiplies by the float32 1/6 in every dtype
    (hardsigmoid_backward's one_sixth): inside, the value (x + 3) / 6 is stopped and (x - x)
    times that constant adds the gradient (x is finite there)."""
    import numpy as np
    dt = e.dtype(self)
    if dt != torch.float64:
        return e.op("HardSigmoid", self, alpha=1.0 / 6, beta=0.5)
    three = e.const(3.0, dt)
    inside = e.op("And", e.op("Greater", self, e.op("Neg", three)), e.op("Less", self, three))
    outside = e.op("Where", e.op("GreaterOrEqual", self, three), e.const(1.0, dt),
                   e.op("Where", e.op("LessOrEqual", self, e.op("Neg", three)), e.const(0.0, dt),
                        e.stop_gradient(self)))
    value = e.stop_gradient(e.op("Div", e.op("Add", self, three), e.const(6.0, dt)))
    slope = e.op("Mul", e.op("Sub", self, e.stop_gradient(self)), e.const(float(np.float32(1.0 / 6)), dt))
    return e.op("Where", inside, e.op("Add", value, slope), outside)
