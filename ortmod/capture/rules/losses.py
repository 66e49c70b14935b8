"""ortmod's export rules for the losses torch's TorchScript exporter cannot export at opset 20
(or exports narrower than eager): each a faithful decomposition into ops the engine runs,
checked against eager, or a refusal that names what it cannot reproduce.

``symbolics(registration, opset)`` returns {aten name: symbolic}; ``semantic_export``
registers them only while ortmod exports.

Gradients come from the engine's autodiff of the emitted ops, so each decomposition is chosen
so that its gradient is eager's backward formula (derivatives.yaml, Loss.cpp), kinks included:
Abs' gradient is sgn (0 at 0, as l1_loss's), Clip's passes dy at its bound (clamp_min's
``x >= min``), Where gives dy to the branch it selects (the ``z > 0`` tests of the margin
kernels, which also drop a NaN z where Relu would propagate it). Where eager's backward is not
the derivative of its forward (binary_cross_entropy's clamped log, soft_margin_loss), the
forward is a stopped value and eager's gradient g enters through a term that is exactly 0
forward: ``Pow(1 + (x - StopGradient(x)), StopGradient(g)) - 1`` (_grad_term).
"""
import torch

from .symbolics import _clamp_min_number, _same_float_dtype
from ..onnx_util import (_const, _dtype_of, _float_const_arg, _input_rank_or_none, _loss_reduction, _onnx_dtype,
                         _refuse, _stop_gradient)
from ..onnx_util import _torch_symbolic


def _sh():
    from ..compat import symbolic_helper as sh
    return sh


def _reduction_arg(reduction, what):
    r = _sh().maybe_get_const(reduction, "i")
    if r not in (0, 1, 2):
        _refuse(what, f"reduction {r!r} is not one of none, mean, sum")
    return r


def _bool_arg(value, what, name):
    sh = _sh()
    v = sh.maybe_get_const(value, "b")
    if sh.is_value(v):
        _refuse(what, f"ortmod keeps {name} only as a constant")
    return bool(v)


def _int_arg(value, what, name):
    sh = _sh()
    v = sh.maybe_get_const(value, "i")
    if sh.is_value(v) or not isinstance(v, int):
        _refuse(what, f"ortmod keeps {name} only as a constant")
    return int(v)


def _grad_term(g, x, grad):
    """Pow(1 + (x - StopGradient(x)), StopGradient(grad)) - 1: exactly 0 forward (1^y is 1 for
    every y, inf and NaN included), gradient ``grad`` with respect to x (Pow's b * a^(b - 1)
    at a = 1), also where ``grad`` is infinite or NaN, as eager's is at some inputs. A product
    (x - x) * grad would make the forward NaN there."""
    dt = _dtype_of(x)
    one = _const(g, 1.0, dt)
    base = g.op("Add", one, g.op("Sub", x, _stop_gradient(g, x)))
    return g.op("Sub", g.op("Pow", base, _stop_gradient(g, grad)), one)


def _with_gradients(g, value, *terms):
    """``value``'s forward, stopped, plus the gradient terms (each exactly 0 forward): what eager
    gives where its backward is not the derivative of its forward."""
    out = _stop_gradient(g, value)
    for x, grad in terms:
        out = g.op("Add", out, _grad_term(g, x, grad))
    return out


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


# ---- binary_cross_entropy_with_logits, margin_ranking, hinge_embedding ----------------------
# (smooth_l1, binary_cross_entropy, soft_margin, multi_margin and multilabel_margin are written
# once for both paths: rules/aten_losses.py)


def _log_sigmoid(g, x):
    """eager's log_sigmoid (CPU kernel: min(x, 0) - log1p(exp(-|x|))) as -Softplus(-x): the
    engine's Softplus(z) is z + log1p(exp(-z)) for z > 0, log1p(exp(z)) otherwise, at z = -x
    eager's two branches (the export path's log_sigmoid rule). Finite for every finite x."""
    return g.op("Neg", g.op("Softplus", g.op("Neg", x)))


def _binary_cross_entropy_with_logits_symbolic(g, input, target, weight, pos_weight, reduction):
    """eager (Loss.cpp): lw = (pos_weight - 1) t + 1; ((1 - t) x - lw log_sigmoid(x)) w, reduced.
    torch's rule computes Log(Sigmoid(x)) and Log(1 - Sigmoid(x)): inf once sigmoid rounds to
    0 or 1 (|x| > 37 in float64, 17 in float32) and far off eager before that (model fuzzer seed
    20000: a finite loss of 294 came out inf). The forward is stopped and eager's backward
    (FunctionsManual) given exactly: input dy w ((pos_weight t + 1 - t) sigmoid(x) -
    pos_weight t) (without pos_weight: sigmoid(x) - t); target dy w (log_sigmoid(-x) -
    pos_weight log_sigmoid(x)) (without: -x). weight and pos_weight get no gradient (eager
    refuses to differentiate them)."""
    sh = _sh()
    what = "binary_cross_entropy_with_logits"
    has_w = not (weight is None or sh.is_none(weight))
    has_pw = not (pos_weight is None or sh.is_none(pos_weight))
    dt = _same_float_dtype(what, input, target, *([weight] if has_w else []), *([pos_weight] if has_pw else []))
    _reduction_arg(reduction, what)
    one = _const(g, 1.0, dt)
    logsig = _log_sigmoid(g, input)
    if has_pw:
        lw = g.op("Add", g.op("Mul", g.op("Sub", pos_weight, one), target), one)
        logsig_w = g.op("Mul", logsig, lw)
        tp = g.op("Mul", pos_weight, target)
        gx = g.op("Sub", g.op("Mul", g.op("Sub", g.op("Add", tp, one), target), g.op("Sigmoid", input)), tp)
        gt = g.op("Sub", _log_sigmoid(g, g.op("Neg", input)), g.op("Mul", logsig, pos_weight))
    else:
        logsig_w = logsig
        gx = g.op("Sub", g.op("Sigmoid", input), target)
        gt = g.op("Neg", input)
    loss = g.op("Sub", g.op("Mul", g.op("Sub", one, target), input), logsig_w)
    if has_w:
        loss, gx, gt = (g.op("Mul", v, weight) for v in (loss, gx, gt))
    out = _with_gradients(g, loss, (input, gx), (target, gt))
    return _loss_reduction(g, out, reduction, what)


def _margin_ranking_loss_symbolic(g, input1, input2, target, margin, reduction):
    """eager (Loss.cpp): clamp_min(-target (input1 - input2) + margin, 0), reduced; clamp_min's
    gradient at the bound is the number kernel's of the running torch (_clamp_min_number)."""
    what = "margin_ranking_loss"
    dt = _same_float_dtype(what, input1, input2)
    target = _target_as(g, target, dt, what)
    _reduction_arg(reduction, what)
    m = _float_const_arg(margin, what, "margin")
    out = g.op("Add", g.op("Mul", g.op("Neg", target), g.op("Sub", input1, input2)), _const(g, m, dt))
    return _loss_reduction(g, _clamp_min_number(g, out, _const(g, 0.0, dt)), reduction, what)


def _target_dtype_or_none(target):
    from ..compat import ts_type_utils as _type_utils
    try:
        return _type_utils.JitScalarType.from_value(target).dtype()
    except Exception:
        return None


def _target_dtype(target, what):
    dt = _target_dtype_or_none(target)
    if dt is None:
        _refuse(what, "ortmod needs the target's dtype at export")
    return dt


def _target_as(g, target, dt, what):
    """An integer target cast to the inputs' float dtype ``dt`` (eager's type promotion, exact
    for any label); a float target must be of dtype ``dt``."""
    t_dt = _target_dtype(target, what)
    if t_dt == dt:
        return target
    if t_dt.is_floating_point or t_dt.is_complex:
        _refuse(what, "ortmod takes the target in the inputs' dtype or an integer dtype (cast it first)")
    return g.op("Cast", target, to_i=_onnx_dtype(dt))


def _hinge_embedding_loss_symbolic(g, input, target, margin, reduction):
    """eager (Loss.cpp): where(t != 1, clamp_min(margin - x, 0), 0) + where(t != -1, x, 0),
    reduced (a target other than 1 and -1 takes both terms, as eager's)."""
    what = "hinge_embedding_loss"
    dt = _same_float_dtype(what, input)
    t_dt = _target_dtype(target, what)
    _reduction_arg(reduction, what)
    m = _float_const_arg(margin, what, "margin")
    zero = _const(g, 0.0, dt)
    clamped = _clamp_min_number(g, g.op("Sub", _const(g, m, dt), input), zero)
    out_margin = g.op("Where", g.op("Not", g.op("Equal", target, _const(g, 1, t_dt))), clamped, zero)
    out_self = g.op("Where", g.op("Not", g.op("Equal", target, _const(g, -1, t_dt))), input, zero)
    return _loss_reduction(g, g.op("Add", out_margin, out_self), reduction, what)


def _class_count(g, x, dt):
    """(C as a 0-d int64, C as a 0-d float of dtype dt, arange(C)) for x of shape (N, C)."""
    c = g.op("Gather", g.op("Shape", x), _const(g, 1, torch.int64), axis_i=0)
    classes = g.op("Range", _const(g, 0, torch.int64), c, _const(g, 1, torch.int64))
    return c, g.op("Cast", c, to_i=_onnx_dtype(dt)), classes


# ---- poisson_nll ---------------------------------------------------------------------------

def _poisson_nll_loss_symbolic(g, input, target, log_input, full, eps, reduction):
    """eager (Loss.cpp), composite: log_input ? exp(x) - t x : x - t log(x + eps); full adds
    Stirling's t log(t) - t + 0.5 log(2 pi t), masked to 0 where t <= 1; reduced."""
    import math
    what = "poisson_nll_loss"
    dt = _same_float_dtype(what, input, target)
    _reduction_arg(reduction, what)
    log_in, full_v = _bool_arg(log_input, what, "log_input"), _bool_arg(full, what, "full")
    eps_v = _float_const_arg(eps, what, "eps")
    if log_in:
        loss = g.op("Sub", g.op("Exp", input), g.op("Mul", target, input))
    else:
        loss = g.op("Sub", input, g.op("Mul", target, g.op("Log", g.op("Add", input, _const(g, eps_v, dt)))))
    if full_v:
        stirling = g.op("Add", g.op("Sub", g.op("Mul", target, g.op("Log", target)), target),
                        g.op("Mul", _const(g, 0.5, dt),
                             g.op("Log", g.op("Mul", _const(g, 2 * math.pi, dt), target))))
        stirling = g.op("Where", g.op("LessOrEqual", target, _const(g, 1.0, dt)), _const(g, 0.0, dt), stirling)
        loss = g.op("Add", loss, stirling)
    return _loss_reduction(g, loss, reduction, what)


# ---- cross_entropy ---------------------------------------------------------------------------

_REDUCTION_NAMES = {0: "none", 1: "mean", 2: "sum"}


def _static_dim(x, axis):
    sizes = _sh().get_tensor_sizes(x)
    v = sizes[axis] if sizes is not None and len(sizes) > axis else None
    return v if isinstance(v, int) else None


def _max_shifted(g, x):
    """x - StopGradient(max over classes): the engine's LogSoftmax and SoftmaxCrossEntropyLoss
    kernels compute x - (m + log(sum)), which rounds m + log(sum) at the scale of the largest
    logit; eager's (x - m) - log(sum) does not (a confident prediction's loss ~1e-6 came out 30%
    off in float32). With the max already subtracted, the kernel's m is 0 and its result is
    eager's. The shift takes no gradient: log_softmax is invariant to it."""
    m = g.op("ReduceMax", x, _const(g, [1], torch.int64), keepdims_i=1)
    return g.op("Sub", x, _stop_gradient(g, m))


def _class_weight(g, weight, rank):
    """weight (C,) as (1, C, 1, ..) for an input of rank ``rank`` (eager's expand_weight)."""
    return g.op("Reshape", weight, _const(g, [1, -1] + [1] * (rank - 2), torch.int64))


def _cross_entropy_symbolic(stock):
    def symbolic(g, self, target, weight, reduction, ignore_index, label_smoothing):
        """eager (LossNLL.cpp cross_entropy_loss), where torch's rule refuses label_smoothing, takes
        no probability targets and no unbatched input (its SoftmaxCrossEntropyLoss wants (N, C)):

        * class targets, label_smoothing 0: torch's rule (SoftmaxCrossEntropyLoss);
        * class targets, label_smoothing ls: (1 - ls) nll_loss(log_softmax(x)) + ls / C * smooth,
          smooth = -sum_c w_c log_softmax(x)_c, 0 at ignored targets, its mean divided by the
          summed weights of the targets not ignored (their count without weights), as eager's
          cross_entropy_loss_label_smoothing (composite: the gradient is autodiff's);
        * probability targets: -sum_c w_c t_c log_softmax(x)_c, t smoothed to t (1 - ls) + ls / C,
          mean over the numel / C positions (cross_entropy_loss_prob_target);
        * an unbatched input (C,) with target () or (C,): a batch of one, the batch axis removed
          again for reduction none (exact: eager's class_dim 0 is the same computation)."""
        sh = _sh()
        what = "cross_entropy"
        ls = _float_const_arg(label_smoothing, what, "label_smoothing")
        rank = _input_rank_or_none(self)
        t_dt = _target_dtype_or_none(target)
        prob = t_dt is not None and (t_dt.is_floating_point or t_dt.is_complex)
        if not prob and ls == 0.0 and rank != 1:
            return stock(g, self, target, weight, reduction, ignore_index, label_smoothing)
        has_w = not (weight is None or sh.is_none(weight))
        dt = _same_float_dtype(what, self, *([weight] if has_w else []))
        r = _reduction_arg(reduction, what)
        ignore = _int_arg(ignore_index, what, "ignore_index")
        if rank is None or rank == 0:
            _refuse(what, "ortmod needs the input's rank at export (1 or more)")
        t_dt = _target_dtype(target, what)
        if prob and t_dt != dt:
            _refuse(what, "probability targets must have the input's dtype")
        unbatched = rank == 1
        if unbatched:
            self = g.op("Unsqueeze", self, _const(g, [0], torch.int64))
            target = g.op("Unsqueeze", target, _const(g, [0], torch.int64))
            rank = 2
        if not prob and ls == 0.0:
            if unbatched:   # torch's rule on a batch of one: its rounding fixed while the cost is one row
                self = _max_shifted(g, self)
            out = stock(g, self, target, weight, reduction, ignore_index, label_smoothing)
        elif prob:
            out = _cross_entropy_probabilities(g, self, target, weight if has_w else None, r, ls, ignore, rank, dt)
        else:
            out = _cross_entropy_smoothed(g, self, target, weight if has_w else None, r, ls, ignore, rank, dt)
        if unbatched and r == 0:
            out = g.op("Squeeze", out, _const(g, [0], torch.int64))
        return out
    return symbolic


def _class_count_f(g, x, dt):
    """(C as a Python int when known at export, else None; C as a 0-d float value). With C known,
    ls / C divides in double, as eager's arithmetic on Python numbers."""
    c = _static_dim(x, 1)
    _, c_f, _ = _class_count(g, x, dt)
    return c, c_f


def _smoothing_factor(g, ls, c, c_f, dt):
    return _const(g, ls / c, dt) if c is not None else g.op("Div", _const(g, ls, dt), c_f)


def _cross_entropy_smoothed(g, x, target, weight, r, ls, ignore, rank, dt):
    what = "cross_entropy"
    if not ls <= 1.0:
        _refuse(what, "label_smoothing must be in [0, 1]")
    logp = g.op("LogSoftmax", _max_shifted(g, x), axis_i=1)
    nll_in = [logp, target] + ([weight] if weight is not None else [])
    nll = g.op("NegativeLogLikelihoodLoss", *nll_in, reduction_s=_REDUCTION_NAMES[r], ignore_index_i=ignore)
    axis1 = _const(g, [1], torch.int64)
    per_class = logp if weight is None else g.op("Mul", logp, _class_weight(g, weight, rank))
    smooth = g.op("Neg", g.op("ReduceSum", per_class, axis1, keepdims_i=0))
    ignored = g.op("Equal", target, _const(g, ignore, _target_dtype(target, what)))
    zero = _const(g, 0.0, dt)
    smooth = g.op("Where", ignored, zero, smooth)
    if r == 1:
        if weight is not None:
            safe = g.op("Where", ignored, _const(g, 0, _target_dtype(target, what)), target)
            counted = g.op("Where", ignored, zero, g.op("Gather", weight, safe, axis_i=0))
        else:
            counted = g.op("Cast", g.op("Not", ignored), to_i=_onnx_dtype(dt))
        smooth = g.op("Div", g.op("ReduceSum", smooth, keepdims_i=0), g.op("ReduceSum", counted, keepdims_i=0))
    elif r == 2:
        smooth = g.op("ReduceSum", smooth, keepdims_i=0)
    c, c_f = _class_count_f(g, x, dt)
    return g.op("Add", g.op("Mul", _const(g, 1.0 - ls, dt), nll),
                g.op("Mul", smooth, _smoothing_factor(g, ls, c, c_f, dt)))


def _cross_entropy_probabilities(g, x, target, weight, r, ls, ignore, rank, dt):
    what = "cross_entropy"
    if ignore >= 0:
        _refuse(what, "ignore_index is not supported for probability targets (eager raises)")
    if not ls <= 1.0:
        _refuse(what, "label_smoothing must be in [0, 1]")
    logp = g.op("LogSoftmax", _max_shifted(g, x), axis_i=1)
    c, c_f = _class_count_f(g, x, dt)
    if ls > 0.0:
        target = g.op("Add", g.op("Mul", target, _const(g, 1.0 - ls, dt)), _smoothing_factor(g, ls, c, c_f, dt))
    prod = g.op("Mul", logp, target)
    if weight is not None:
        prod = g.op("Mul", prod, _class_weight(g, weight, rank))
    if r == 0:
        return g.op("Neg", g.op("ReduceSum", prod, _const(g, [1], torch.int64), keepdims_i=0))
    total = g.op("Neg", g.op("ReduceSum", prod, keepdims_i=0))
    if r == 2:
        return total
    c_i, _, _ = _class_count(g, x, dt)
    positions = g.op("Div", g.op("Size", x), c_i)                                   # numel / C, integer
    return g.op("Div", total, g.op("Cast", positions, to_i=_onnx_dtype(dt)))


_RULES = {
    "aten::l1_loss": _l1_loss_symbolic,
    "aten::huber_loss": _huber_loss_symbolic,
    "aten::binary_cross_entropy_with_logits": _binary_cross_entropy_with_logits_symbolic,
    "aten::margin_ranking_loss": _margin_ranking_loss_symbolic,
    "aten::hinge_embedding_loss": _hinge_embedding_loss_symbolic,
    "aten::poisson_nll_loss": _poisson_nll_loss_symbolic,
}


def symbolics(registration, opset):
    # torch registers its opset-12 rules (cross_entropy_loss's) when that module is imported,
    # which its exporter does lazily
    from ..compat import ts_opset12
    ts_opset12.module()
    rules = dict(_RULES)
    stock = _torch_symbolic(registration, "aten::cross_entropy_loss", opset)
    if stock is not None:
        rules["aten::cross_entropy_loss"] = _cross_entropy_symbolic(stock)
    return rules
