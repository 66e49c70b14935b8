"""ortmod's export rules for the losses torch's TorchScript exporter cannot export at opset 20
(or exports narrower than eager): each a faithful decomposition into ops the engine runs,
checked against eager, or a refusal that names what it cannot reproduce.

``symbolics(registration, opset)`` returns {aten name: symbolic}; ``semantic_export``
registers them only while ortmod exports.

Gradients come from the engine's autodiff of the emitted ops, so each decomposition is chosen
so that its gradient is eager's backward formula (derivatives.yaml, Loss.cpp), kinks included:
Abs' gradient is sgn (0 at 0, as l1_loss's), Clip's passes dy at its bound (clamp_min's
``x >= min``), Relu's is 0 at 0 (the ``z > 0`` tests of the margin kernels), Where gives dy to
the branch it selects. Where eager's backward is not the derivative of its forward
(binary_cross_entropy's clamped log), the forward is a stopped value and the gradient comes from
a term that is exactly 0 forward: ``(x - StopGradient(x)) * StopGradient(g)``.
"""
import torch

from ._semantics import (_const, _float_const_arg, _input_rank_or_none, _loss_reduction, _refuse,
                         _same_float_dtype, _stop_gradient)


def _sh():
    from torch.onnx import symbolic_helper as sh
    return sh


def _reduction_arg(reduction, what):
    r = _sh()._maybe_get_const(reduction, "i")
    if r not in (0, 1, 2):
        _refuse(what, f"reduction {r!r} is not one of none, mean, sum")
    return r


def _bool_arg(value, what, name):
    sh = _sh()
    v = sh._maybe_get_const(value, "b")
    if sh._is_value(v):
        _refuse(what, f"ortmod keeps {name} only as a constant")
    return bool(v)


def _int_arg(value, what, name):
    sh = _sh()
    v = sh._maybe_get_const(value, "i")
    if sh._is_value(v) or not isinstance(v, int):
        _refuse(what, f"ortmod keeps {name} only as a constant")
    return int(v)


def _requires_grad(v):
    t = v.type()
    try:
        return bool(t.requiresGrad())
    except Exception:   # not a tensor type, or nothing recorded: assume it may
        return True


def _grad_term(g, x, grad):
    """(x - StopGradient(x)) * StopGradient(grad): exactly 0 forward (where grad is finite),
    gradient ``grad`` with respect to x."""
    return g.op("Mul", g.op("Sub", x, _stop_gradient(g, x)), _stop_gradient(g, grad))


# ---- l1, smooth_l1, huber -------------------------------------------------------------------

def _l1_loss_symbolic(g, input, target, reduction):
    """eager (Loss.cpp): apply_loss_reduction((input - target).abs(), reduction); abs' gradient
    sgn(d) is 0 at d == 0, as the engine's Abs."""
    what = "l1_loss"
    _same_float_dtype(what, input, target)
    _reduction_arg(reduction, what)
    return _loss_reduction(g, g.op("Abs", g.op("Sub", input, target)), reduction, what)


def _piecewise(g, d, k, scale, quadratic, dt):
    """Where(d <= -k, scale * (-d - k/2), Where(d >= k, scale * (d - k/2), quadratic)): the
    branches eager's smooth_l1/huber backward kernels take (x <= -k, x >= k, else), each with
    the forward's value there (|d| = -d or d exactly)."""
    half = _const(g, 0.5 * k, dt)
    neg, pos = g.op("Sub", g.op("Neg", d), half), g.op("Sub", d, half)
    if scale != 1.0:
        sc = _const(g, scale, dt)
        neg, pos = g.op("Mul", sc, neg), g.op("Mul", sc, pos)
    kk = _const(g, k, dt)
    out = g.op("Where", g.op("GreaterOrEqual", d, kk), pos, quadratic)
    return g.op("Where", g.op("LessOrEqual", d, g.op("Neg", kk)), neg, out)


def _smooth_l1_loss_symbolic(g, input, target, reduction, beta):
    """eager (Loss.cpp): z = |x - y|, z < beta ? 0.5 z^2 / beta : z - beta / 2; its backward
    (smooth_l1_backward kernel) is -1 for d <= -beta, 1 for d >= beta, d / beta between, for
    the input and, with d = y - x, for the target.

    beta == 0 (reached only through torch._C._nn.smooth_l1_loss: F.smooth_l1_loss calls
    l1_loss then): |d|, but with eager's gradient at d == 0, -1 for both input and target
    (the kernel's first test, d <= -0, holds for both)."""
    what = "smooth_l1_loss"
    dt = _same_float_dtype(what, input, target)
    _reduction_arg(reduction, what)
    b = _float_const_arg(beta, what, "beta")
    if b < 0:
        _refuse(what, "beta must be non-negative")
    d = g.op("Sub", input, target)
    if b == 0.0:
        zero, one = _const(g, 0.0, dt), _const(g, 1.0, dt)
        at_zero = g.op("Neg", g.op("Add", _grad_term(g, input, one), _grad_term(g, target, one)))
        out = g.op("Where", g.op("Less", d, zero), g.op("Neg", d),
                   g.op("Where", g.op("Greater", d, zero), d, at_zero))
        return _loss_reduction(g, out, reduction, what)
    quad = g.op("Div", g.op("Mul", g.op("Mul", _const(g, 0.5, dt), d), d), _const(g, b, dt))
    return _loss_reduction(g, _piecewise(g, d, b, 1.0, quad, dt), reduction, what)


def _huber_loss_symbolic(g, input, target, reduction, delta):
    """eager (Loss.cpp): z = |x - y|, z < delta ? 0.5 z^2 : delta (z - delta / 2); backward
    -delta for d <= -delta, delta for d >= delta, d between (huber_backward kernel)."""
    what = "huber_loss"
    dt = _same_float_dtype(what, input, target)
    _reduction_arg(reduction, what)
    k = _float_const_arg(delta, what, "delta")
    if not k > 0:
        _refuse(what, "delta must be positive")
    d = g.op("Sub", input, target)
    quad = g.op("Mul", g.op("Mul", _const(g, 0.5, dt), d), d)
    return _loss_reduction(g, _piecewise(g, d, k, k, quad, dt), reduction, what)


_RULES = {
    "aten::l1_loss": _l1_loss_symbolic,
    "aten::smooth_l1_loss": _smooth_l1_loss_symbolic,
    "aten::huber_loss": _huber_loss_symbolic,
}


def symbolics(registration, opset):
    return dict(_RULES)
