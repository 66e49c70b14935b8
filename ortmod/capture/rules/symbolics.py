"""ortmod's TorchScript symbolics for torch's own ops (embedding, kl_div, index_add/put,
pools, clamps, sort, norms and distances, the margin losses, pad), registered by
``capture.torchscript_registry``. The mechanisms below span the package: the stop-gradient and
guard modes live in ``capture.tracing``, the shared ``g.op`` helpers in ``capture.onnx_util``.

What capture does so that the exported graph means what the module's forward means in training.

Four mechanisms, each general rather than one fix per pattern:

* **Stop-gradient is in the graph.** ``x.detach()`` is traced as ``aten::detach``; where an op
  runs under ``torch.no_grad()`` on a tensor that requires grad, ``StopGradientMode`` detaches
  its outputs in the trace. ``aten::detach`` exports as ``ortmod::StopGradient`` (identity
  forward, no gradient rule), so autodiff stops exactly where eager autograd does.
* **No argument is dropped.** torch's symbolics ignore some arguments (``padding_idx``,
  ``divisor_override``, Softplus's ``threshold``) or approximate them (``kl_div`` for
  non-positive targets, ``pairwise_distance``'s eps in the exponent, ``cosine_similarity``'s
  clamp, the NaN gradient of a p-norm at a zero row, ``index_put``'s ``accumulate`` with repeated
  indices). ortmod's own symbolics, registered only while ortmod exports, keep them as faithful
  decompositions, or refuse by name what the engine cannot reproduce (``max_norm``'s in-place
  renormalisation, ``scale_grad_by_freq``).
* **What the trace froze is guarded.** Python values computed from tensors while tracing
  (``.item()``, ``if t:``, ``float(x.size(-1))``, ``len(x)``) become constants in the graph.
  ``TraceGuards`` records each such tensor, makes it an extra graph output and keeps the value
  Python saw; after every call the engine's value is compared with it, and a difference means
  a re-export, never a stale graph. Tracer warnings no guard covers make the graph valid only
  for the traced shapes (it re-exports when they change). Either way the user gets one warning
  naming the file and line; ``strict_trace`` makes it an error.
* **The trace's dtypes are kept.** torch's ONNX type promotion takes 0-d float64 tensors for
  Python numbers of the default dtype; where a converted node's dtype differs from the one the
  trace recorded for its aten node, the recorded one is put back (``_keeping_traced_dtypes``).
"""
import math

import torch

from .. import compat
from ..compat import JitTensorType
from ..onnx_util import _const, _dtype_of, _float_const_arg, _input_rank_or_none, _loss_reduction, _onnx_dtype, _refuse, _stop_gradient


def _embedding_renorm_symbolic(g, weight, indices, max_norm, norm_type):
    _refuse("embedding(max_norm=...)",
            "F.embedding / nn.Embedding with max_norm renormalises rows of the weight in place on every "
            "call; ortmod does not reproduce that mutation (remove max_norm, or renormalise in the training "
            "loop under torch.no_grad())")


def _kl_div_symbolic(g, input, target, reduction, log_target):
    """eager: log_target ? exp(t) * (t - input) : xlogy(t, t) - t * input. torch's symbolic masks
    t <= 0 to 0, which zeroes the gradient -t there (and hides eager's NaN for t < 0)."""
    from ..compat import symbolic_helper as sh
    reduction = sh.maybe_get_const(reduction, "i")
    log_target = sh.maybe_get_const(log_target, "b")
    dt = _dtype_of(input)
    if log_target:
        out = g.op("Mul", g.op("Exp", target), g.op("Sub", target, input))
    else:
        zero = _const(g, 0.0, dt)
        xlogy = g.op("Where", g.op("Equal", target, zero), zero, g.op("Mul", target, g.op("Log", target)))
        out = g.op("Sub", xlogy, g.op("Mul", target, input))
    if reduction == 0:
        return out
    if reduction == 1:
        return g.op("ReduceMean", out, keepdims_i=0)
    if reduction == 2:
        return g.op("ReduceSum", out, keepdims_i=0)
    _refuse("kl_div", f"reduction {reduction!r} is not one of none, mean, sum")


def _index_add_symbolic(g, self, dim, index, source, alpha=None):
    """self.index_add(dim, index, source, alpha): ScatterElements with reduction add, so repeated
    indices add up as in eager (torch's opset-9 symbolic scatters without a reduction: a repeated
    row overwrites), and alpha is kept."""
    from ..compat import symbolic_helper as sh
    dim = sh.maybe_get_const(dim, "i")
    rank = sh.get_tensor_rank(self)
    if not isinstance(dim, int) or rank is None or sh.get_tensor_rank(source) != rank:
        _refuse("index_add", "needs a constant dim and self and source of one known rank")
    dim = dim % rank if rank else 0
    if alpha is not None and not sh.is_none(alpha):
        a = sh.maybe_get_const(alpha, "f")
        if not isinstance(a, (int, float)):
            _refuse("index_add", "alpha must be a constant")
        if a != 1:
            source = g.op("Mul", source, _const(g, float(a), _dtype_of(source)))
    # index (K,) -> shaped (1, .., K, .., 1) at dim, then expanded to source's shape
    shape = [1] * rank
    shape[dim] = -1
    idx = g.op("Reshape", index, _const(g, shape, torch.int64))
    idx = g.op("Expand", idx, g.op("Shape", source))
    return g.op("ScatterElements", self, idx, source, axis_i=dim, reduction_s="add")


def _index_put_symbolic(original):
    """index_put with accumulate=True: one ScatterND with reduction add, so that repeated indices
    add up as in eager. torch's rule scatters the values into zeros without a reduction and adds
    the result to self (a repeated index keeps only its last value), and with a boolean mask it
    ignores accumulate (masked_fill/masked_scatter replace). accumulate=False is torch's rule."""
    def symbolic(g, self, indices_list_value, values, accumulate=False):
        from ..compat import symbolic_helper as sh
        acc = sh.maybe_get_const(accumulate, "b")
        if not isinstance(acc, (bool, int)):
            _refuse("index_put", "accumulate must be a constant")
        if not acc:
            return original(g, self, indices_list_value, values, accumulate)
        indices = (sh.unpack_list(indices_list_value) if sh.is_packed_list(indices_list_value)
                   else [indices_list_value])
        if any(sh.is_bool(i) for i in indices):
            _refuse("index_put", "accumulate=True with a boolean mask index")
        out = original(g, self, indices_list_value, values, False)
        node = out.node()
        if node.kind() != "onnx::ScatterND":
            _refuse("index_put", f"accumulate=True exported as {node.kind()}, not one ScatterND")
        node.s_("reduction", "add")
        return out
    return symbolic


def _avg_pool_symbolic(rank, original):
    def symbolic(g, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override=None):
        from ..compat import symbolic_helper as sh
        if divisor_override is None or sh.is_none(divisor_override):
            return original(g, input, kernel_size, stride, padding, ceil_mode, count_include_pad,
                            divisor_override)
        divisor = sh.maybe_get_const(divisor_override, "i")
        ceil = sh.maybe_get_const(ceil_mode, "b")
        if not isinstance(divisor, int) or ceil:
            _refuse(f"avg_pool{rank}d(divisor_override=...)",
                    "ortmod keeps divisor_override only as a constant and without ceil_mode")
        kernel = sh.maybe_get_const(kernel_size, "is")
        kernel = [kernel] * rank if isinstance(kernel, int) else list(kernel)
        if len(kernel) == 1:
            kernel = kernel * rank
        # the window sum counting padding, then divided by the override: AveragePool with
        # count_include_pad divides by the window size, so scale by window / divisor
        pooled = original(g, input, kernel_size, stride, padding, ceil_mode, 1, None)
        return g.op("Mul", pooled, _const(g, float(math.prod(kernel)) / divisor, _dtype_of(input)))
    return symbolic


def _clamp_min_number(g, x, lo):
    """clamp_min(x, lo) by a number, as eager's number kernel differentiates it on this torch
    (capture.compat.clamp_semantics): to 2.13 Clip (all of dy at the bound), on 2.14 none at the
    bound (Clip's value, the gradient through the Where branch that keeps x). The loss kernels
    that clamp_min a margin term by 0 (hinge_embedding, margin_ranking, triplet_margin,
    cosine_embedding) take it: their kink sits exactly at the bound."""
    return _clamp_as_eager(g, x, lo, None, compat.require_clamp_mode("number"))


def _clamp_symbolic(which):
    """clamp / clamp_min / clamp_max where eager's gradient at a bound is not torch.clamp's of
    2.13 (capture.compat.clamp_semantics; registered only then): Clip's value, the gradient through
    the Where branch that keeps x. A number bound (a constant of a Scalar type): ``exclusive``,
    none at the bound or at NaN. A 0-d tensor bound: ``half``, half at a bound, all where both
    bounds meet x, all at NaN (eager 2.14)."""
    def symbolic(g, x, *bounds, ortmod_clamp_tensor=None):
        from ..compat import symbolic_helper as sh
        lo, hi = {"clamp": bounds, "clamp_min": (bounds[0], None), "clamp_max": (None, bounds[0])}[which]
        integer = _integer_dtype(x)
        dtype = integer or _dtype_of(x)
        # the overload eager ran, noted on the traced graph (_clamp_overloads_noted): the exporter's
        # passes make a Scalar bound a tensor and the node clamp.Tensor
        if ortmod_clamp_tensor is None and len(_inplace_clamps) == 1:
            ortmod_clamp_tensor = next(iter(_inplace_clamps))     # an in-place clamp the passes replaced
        if ortmod_clamp_tensor is None and integer is None:
            _refuse(f"torch.{which} whose overload (number or tensor bounds) ortmod did not note",
                    f"their gradients at the bound differ on torch {compat.VERSION}")
        # an integer tensor has no gradient: Clip's value, its integer bounds in its dtype (Longformer
        # clamps token counts); a floating-point bound promotes eager's result: refused
        tensor = ortmod_clamp_tensor == 1 and integer is None
        mode = compat.require_clamp_mode("tensor" if tensor else "number") if integer is None else None

        def bound(b):
            if b is None or sh.is_none(b):
                return None
            if integer is not None and not _is_integer(b):
                _refuse(f"torch.{which} of an integer tensor by a floating-point bound",
                        "eager's result is floating-point there; ortmod clamps integers by integers only")
            if tensor:
                if sh.get_tensor_rank(b) != 0:
                    _refuse(f"torch.{which} with a bound of more than one element",
                            f"ortmod reproduces torch {compat.VERSION}'s gradient at a tensor bound for 0-d bounds")
                return g.op("Cast", b, to_i=_onnx_dtype(dtype))
            v = sh.maybe_get_const(b, "f")
            if sh.is_value(v):
                _refuse(f"torch.{which} with a number bound computed in the graph",
                        "ortmod keeps a number bound only as a constant")
            if integer is not None:
                return _const(g, int(v), dtype)
            return _const(g, float(v), dtype)
        lo, hi = bound(lo), bound(hi)
        if lo is None and hi is None:
            return x
        if integer is not None:
            out = g.op("Clip", x, lo if lo is not None else _const(g, torch.iinfo(dtype).min, dtype),
                       *([hi] if hi is not None else []))
            out.setType(x.type())
            return out
        return _clamp_as_eager(g, x, lo, hi, mode)
    return symbolic


_INTEGER_DTYPES = {"Long": torch.int64, "Int": torch.int32, "Short": torch.int16, "Char": torch.int8,
                   "Byte": torch.uint8}


def _integer_dtype(x):
    t = x.type()
    return _INTEGER_DTYPES.get(t.scalarType()) if isinstance(t, JitTensorType) else None


def _is_integer(value):
    """An int number or an integer tensor (a clamp bound of an integer tensor that keeps its dtype)."""
    t = value.type()
    return _integer_dtype(value) is not None if isinstance(t, JitTensorType) else t.kind() == "IntType"


def _clamp_as_eager(g, x, lo, hi, mode):
    """Clip of x to the bounds lo and/or hi (graph values of x's dtype, None where absent), with
    the gradient at a bound that eager's clamp kernel gives in ``mode`` (capture.compat's
    CLAMP_INCLUSIVE: Clip's; EXCLUSIVE: none at a bound or NaN; HALF: half at a bound)."""
    dtype = _dtype_of(x)
    value = g.op("Clip", x, lo if lo is not None else _const(g, -math.inf, dtype), *([hi] if hi is not None else []))
    clipped = g.op("ortmod::StopGradient", value)
    if mode == compat.CLAMP_EXCLUSIVE:
        keep = [g.op("Greater", x, lo)] if lo is not None else []
        keep += [g.op("Less", x, hi)] if hi is not None else []
        inside = keep[0] if len(keep) == 1 else g.op("And", *keep)
        out = g.op("Where", inside, x, clipped)
    elif mode == compat.CLAMP_HALF:
        outside = [g.op("Less", x, lo)] if lo is not None else []
        outside += [g.op("Greater", x, hi)] if hi is not None else []
        ties = [g.op("Equal", x, b) for b in (lo, hi) if b is not None]
        half = _const(g, 0.5, dtype)
        halfway = g.op("Add", g.op("Mul", x, half), g.op("Mul", g.op("ortmod::StopGradient", x), half))
        tie = ties[0] if len(ties) == 1 else g.op("Xor", *ties)
        out = g.op("Where", outside[0] if len(outside) == 1 else g.op("Or", *outside), clipped,
                   g.op("Where", tie, halfway, x))
    else:       # inclusive: torch.clamp's backward, Clip's
        out = value
    out.setType(x.type())
    return out


def _sort_node(g, x, dim, descending, stable):
    from ..compat import symbolic_helper as sh
    dim, descending = sh.maybe_get_const(dim, "i"), sh.maybe_get_const(descending, "b")
    stable = sh.maybe_get_const(stable, "b") if stable is not None else False
    if sh.is_value(dim) or sh.is_value(descending) or sh.is_value(stable):
        _refuse("torch.sort / torch.argsort with tensor arguments",
                "ortmod keeps dim, descending and stable only as constants")
    values, indices = g.op("ortmod::Sort", x, axis_i=int(dim), descending_i=int(bool(descending)),
                           stable_i=int(bool(stable)), outputs=2)
    values.setType(x.type())
    if isinstance(x.type(), JitTensorType):
        indices.setType(x.type().with_dtype(torch.int64))
    return values, indices


def _sort_symbolic(g, x, *args):
    """torch.sort as ortmod::Sort. torch's rule gives TopK(k = the axis size), whose equal values
    eager torch.topk orders differently from eager torch.sort (nth_element + std::sort against
    std::sort: csrc/ops/sort_order.h); Sort keeps sort's own order, and stable=True, which
    torch's rule cannot export. aten::sort(self, dim, descending) or
    aten::sort.stable(self, stable, dim, descending)."""
    if len(args) == 3:
        stable, dim, descending = args
    else:
        (dim, descending), stable = args[:2], None
    return _sort_node(g, x, dim, descending, stable)


def _argsort_symbolic(g, x, *args):
    """torch.argsort: Sort's indices. aten::argsort(self, dim, descending) or
    aten::argsort.stable(self, stable, dim, descending)."""
    if len(args) == 3:
        stable, dim, descending = args
    else:
        (dim, descending), stable = args[:2], None
    return _sort_node(g, x, dim, descending, stable)[1]


def _extremum_symbolic(arg_op, original):
    """torch.max/min(x, dim): torch's rule gives ReduceMax and ArgMax side by side, and
    ReduceMax's gradient shares dy among ties; eager's goes to the index max(dim) returns (the
    first of them). The values are gathered at ArgMax's index instead, so the gradient flows
    to that element only, as in eager. max(x) and max(x, y) keep torch's rule."""
    def symbolic(g, self, dim_or_y=None, keepdim=None):
        from ..compat import symbolic_helper as sh
        if keepdim is None:
            return original(g, self, dim_or_y, keepdim)
        dim = sh.get_const(dim_or_y, "i", "dim")
        keep = sh.get_const(keepdim, "i", "keepdim")
        indices = g.op(arg_op, self, axis_i=dim, keepdims_i=1)
        values = g.op("GatherElements", self, indices, axis_i=dim)
        if not keep:
            axes = _const(g, [dim], torch.int64)
            values, indices = g.op("Squeeze", values, axes), g.op("Squeeze", indices, axes)
        return values, indices
    return symbolic


def _p_norm(g, x, p, axes, keepdim, what):
    """at::norm / linalg_vector_norm of ``x`` of order ``p`` over ``axes``, forward and gradient
    as eager's norm_backward (FunctionsManual.cpp) gives them:

    * p 2 and 1: ReduceL2 (dy * x / norm, 0 where the norm is 0) and ReduceL1 (dy * sgn(x));
    * p +-inf: ReduceMax / ReduceMin of |x| (ties share dy equally, as eager's mask.sum);
    * p 0: the count of non-zeros, no gradient;
    * any other p: (sum |x|^p)^(1/p), with eager's masks: 0 where the norm is 0 (p > 0), where an
      element is 0 (p < 1, whose |x|^(p-1) is inf there), and on rows holding a zero (p < 0: their
      norm is 0, eager's norm^(1-p) factor zeroes the row). torch's rule has none of them: its
      gradient at a zero row is inf * 0 = NaN.
    A 0-d ``x`` is a 1-element vector (eager's dim -1 of a 0-d tensor)."""
    dt = _dtype_of(x)
    if _input_rank_or_none(x) == 0:
        x = g.op("Reshape", x, _const(g, [1], torch.int64))
        axes, keepdim = [0], False
    ax = _const(g, list(axes), torch.int64)
    k = int(bool(keepdim))
    if p == 2.0:
        return g.op("ReduceL2", x, ax, keepdims_i=k)
    if p == 1.0:
        return g.op("ReduceL1", x, ax, keepdims_i=k)
    if math.isinf(p):
        return g.op("ReduceMax" if p > 0 else "ReduceMin", g.op("Abs", x), ax, keepdims_i=k)
    zero, one = _const(g, 0.0, dt), _const(g, 1.0, dt)
    if p == 0.0:
        nonzero = g.op("Cast", g.op("Not", g.op("Equal", x, zero)), to_i=_onnx_dtype(dt))
        return g.op("ReduceSum", _stop_gradient(g, nonzero), ax, keepdims_i=k)
    a = g.op("Abs", x)
    a_zero = g.op("Equal", a, zero)
    a_safe = g.op("Where", a_zero, one, a)               # pow's gradient stays finite where a == 0
    powed = g.op("Pow", a_safe, _const(g, p, dt))
    if p > 0:
        powed = g.op("Where", a_zero, zero, powed)       # 0^p = 0, gradient 0
        total = g.op("ReduceSum", powed, ax, keepdims_i=k)
        t_zero = g.op("Equal", total, zero)
        root = g.op("Pow", g.op("Where", t_zero, one, total), _const(g, 1.0 / p, dt))
        return g.op("Where", t_zero, zero, root)
    # p < 0: a zero element makes the norm 0 (0^p = inf, inf^(1/p) = 0); the gradient is 0 there
    total = g.op("ReduceSum", powed, ax, keepdims_i=k)
    has_zero = g.op("Equal", g.op("ReduceMin", a, ax, keepdims_i=k), zero)
    root = g.op("Pow", g.op("Where", has_zero, one, total), _const(g, 1.0 / p, dt))
    return g.op("Where", has_zero, zero, root)


def _same_float_dtype(what, *xs):
    dts = {_dtype_of(x, None) for x in xs}
    if len(dts) != 1 or None in dts:
        _refuse(what, "ortmod takes it only on floating tensors of one dtype (cast them first)")
    return dts.pop()


def _pairwise_distance_symbolic(g, x1, x2, p, eps, keepdim):
    """eager (Distance.cpp): at::norm(x1 - x2 + eps, p, -1, keepdim). torch's rule computes
    (sum (x1 - x2)^p)^(1 / (p + eps)): eps in the exponent and no abs (odd p is wrong)."""
    from ..compat import symbolic_helper as sh
    what = "pairwise_distance"
    dt = _same_float_dtype(what, x1, x2)
    p = _float_const_arg(p, what, "p")
    eps = _float_const_arg(eps, what, "eps")
    keep = sh.maybe_get_const(keepdim, "b")
    if sh.is_value(keep):
        _refuse(what, "ortmod keeps keepdim only as a constant")
    if _input_rank_or_none(x1) is None or _input_rank_or_none(x2) is None:
        _refuse(what, "ortmod needs the inputs' ranks at export")
    d = g.op("Add", g.op("Sub", x1, x2), _const(g, eps, dt))
    return _p_norm(g, d, p, [-1], bool(keep), what)


def _string_const(v):
    """The value of a string constant argument, else None."""
    node = v.node() if v is not None else None
    if node is None or node.kind() not in ("prim::Constant", "onnx::Constant") or not node.hasAttribute("value"):
        return None
    return node.s("value") if node.kindOf("value") == "s" else None


def _norm_dims(dim, rank, what):
    from ..compat import symbolic_helper as sh
    if dim is None or sh.is_none(dim):
        if rank is None:
            _refuse(what, "ortmod needs the input's rank at export")
        return list(range(rank))
    dims = sh.maybe_get_const(dim, "is")
    if sh.is_value(dims):
        _refuse(what, "ortmod keeps dim only as a constant")
    return [dims] if isinstance(dims, int) else list(dims)


def _with_dtype(g, x, dtype, what):
    from ..compat import symbolic_helper as sh
    if dtype is None or sh.is_none(dtype):
        return x
    d = sh.maybe_get_const(dtype, "i")
    if sh.is_value(d):
        _refuse(what, "ortmod keeps dtype only as a constant")
    from ..compat import ts_type_utils as _type_utils
    return g.op("Cast", x, to_i=_type_utils.JitScalarType(d).onnx_type())


def _vector_norm(g, x, ord, dim, keepdim, dtype, what):
    from ..compat import symbolic_helper as sh
    p = 2.0 if ord is None or sh.is_none(ord) else _float_const_arg(ord, what, "ord")
    keep = sh.maybe_get_const(keepdim, "b")
    if sh.is_value(keep):
        _refuse(what, "ortmod keeps keepdim only as a constant")
    axes = _norm_dims(dim, _input_rank_or_none(x), what)
    return _p_norm(g, _with_dtype(g, x, dtype, what), p, axes, bool(keep), what)


def _vector_norm_symbolic(g, self, ord, dim, keepdim, dtype=None):
    """linalg.vector_norm, torch.norm(p, dim): _p_norm, which keeps eager's zero-row gradient for
    every order (torch's rule: NaN for orders other than 1, 2, inf) and keepdim with dim=None
    (torch's rule drops it)."""
    return _vector_norm(g, self, ord, dim, keepdim, dtype, "linalg.vector_norm")


def _norm_symbolic(g, self, p, dim=None, keepdim=None, dtype=None):
    """aten::norm (at::norm, as C++ callers such as triplet_margin_loss reach it): torch's rule
    takes p 1 and 2 only."""
    from ..compat import symbolic_helper as sh
    if _string_const(p) is not None:
        _refuse("torch.norm(p=<str>)", "ortmod takes string orders through torch.linalg.matrix_norm only")
    keepdim = keepdim if keepdim is not None else _const(g, 0, torch.int64)
    return _vector_norm(g, self, p, dim, keepdim, dtype, "torch.norm")


def _frobenius(g, x, dim, keepdim, what):
    from ..compat import symbolic_helper as sh
    keep = sh.maybe_get_const(keepdim, "b")
    axes = _norm_dims(dim, _input_rank_or_none(x), what)
    return _p_norm(g, x, 2.0, axes, bool(keep), what)


def _frobenius_norm_symbolic(g, self, dim=None, keepdim=None):
    """ReduceL2 (eager's linalg_vector_norm(2) gradient, 0 at a zero matrix); torch's rule is
    Sqrt(ReduceSum(x * x)), NaN there."""
    keepdim = keepdim if keepdim is not None else _const(g, 0, torch.int64)
    return _frobenius(g, self, dim, keepdim, "frobenius_norm")


def _matrix_norm_symbolic(original):
    def symbolic(g, self, ord, dim, keepdim, dtype=None):
        """'fro' as ReduceL2 (see _frobenius_norm_symbolic); other orders keep torch's rule."""
        from ..compat import symbolic_helper as sh
        if _string_const(ord) == "fro":
            return _frobenius(g, _with_dtype(g, self, dtype, "linalg.matrix_norm"), dim, keepdim,
                              "linalg.matrix_norm")
        return original(g, self, ord, dim, keepdim, dtype)
    return symbolic


def _linalg_norm_symbolic(original_matrix):
    matrix = _matrix_norm_symbolic(original_matrix)

    def symbolic(g, self, ord, dim, keepdim, dtype=None):
        """eager's linalg_norm dispatch (LinearAlgebra.cpp): a given ord with two dims (or none,
        on a matrix) is a matrix norm, anything else a vector norm (ord None: 2)."""
        from ..compat import symbolic_helper as sh
        given = not sh.is_none(ord)
        dims = None if sh.is_none(dim) else _norm_dims(dim, None, "linalg.norm")
        if given and ((dims is not None and len(dims) == 2) or (dims is None and _input_rank_or_none(self) == 2)):
            if dims is None:
                dim = _const(g, [0, 1], torch.int64)
            return matrix(g, self, ord, dim, keepdim, dtype)
        if given and _string_const(ord) is not None:
            _refuse("linalg.norm", "a string order takes two dims")
        return _vector_norm(g, self, ord, dim, keepdim, dtype, "linalg.norm")
    return symbolic


def _triplet_margin_loss_symbolic(g, anchor, positive, negative, margin, p, eps, swap, reduction):
    """eager (Loss.cpp): d(a, b) = pairwise_distance(a, b, p, eps); with swap the negative distance
    is min(d(anchor, negative), d(positive, negative)) (torch.minimum: ties share dy, as the
    engine's Min); clamp_min(margin + d_pos - d_neg, 0), reduced. torch's exporter has no rule
    (it inlines p 1 and 2 without swap through aten::norm and fails on the rest)."""
    from ..compat import symbolic_helper as sh
    what = "triplet_margin_loss"
    dt = _same_float_dtype(what, anchor, positive, negative)
    ranks = {_input_rank_or_none(v) for v in (anchor, positive, negative)}
    if len(ranks) != 1 or None in ranks:
        _refuse(what, "ortmod needs anchor, positive and negative of one known rank")
    p_v, eps_v = _float_const_arg(p, what, "p"), _float_const_arg(eps, what, "eps")
    margin_v = _float_const_arg(margin, what, "margin")
    swap_v = sh.maybe_get_const(swap, "b")
    if sh.is_value(swap_v):
        _refuse(what, "ortmod keeps swap only as a constant")

    def dist(a, b):
        return _p_norm(g, g.op("Add", g.op("Sub", a, b), _const(g, eps_v, dt)), p_v, [-1], False, what)

    d_pos, d_neg = dist(anchor, positive), dist(anchor, negative)
    if swap_v:
        d_neg = g.op("Min", d_neg, dist(positive, negative))
    out = g.op("Sub", g.op("Add", _const(g, margin_v, dt), d_pos), d_neg)
    out = _clamp_min_number(g, out, _const(g, 0.0, dt))      # eager: clamp_min(..., 0)
    return _loss_reduction(g, out, reduction, what)


# Loss.cpp's EPSILON: a C++ float, so 1e-12 rounded to float32 whatever the inputs' dtype
_COSINE_EMBEDDING_EPS = float(torch.tensor(1e-12, dtype=torch.float32))


def _cosine_embedding_loss_symbolic(g, input1, input2, target, margin, reduction):
    """eager (Loss.cpp): over dim d = target.dim(), cos = sum(x1 x2) / sqrt((sum x1^2 + E)(sum x2^2 + E));
    the loss is 1 - cos where target == 1, clamp_min(cos - margin, 0) where target == -1, else 0.
    torch's exporter has no rule."""
    from ..compat import symbolic_helper as sh
    from ..compat import ts_type_utils as _type_utils
    what = "cosine_embedding_loss"
    dt = _same_float_dtype(what, input1, input2)
    t_rank, x_rank = _input_rank_or_none(target), _input_rank_or_none(input1)
    if t_rank not in (0, 1) or x_rank != t_rank + 1 or _input_rank_or_none(input2) != x_rank:
        _refuse(what, "ortmod takes a target of rank 0 or 1 and inputs of one rank more, known at export")
    margin_v = _float_const_arg(margin, what, "margin")
    try:
        t_dtype = _type_utils.JitScalarType.from_value(target).dtype()
    except Exception:   # torch's SymbolicValueError: no dtype recorded
        _refuse(what, "ortmod needs the target's dtype at export")
    ax = _const(g, [t_rank], torch.int64)
    eps = _const(g, _COSINE_EMBEDDING_EPS, dt)
    prod = g.op("ReduceSum", g.op("Mul", input1, input2), ax, keepdims_i=0)
    mag1 = g.op("Add", g.op("ReduceSum", g.op("Mul", input1, input1), ax, keepdims_i=0), eps)
    mag2 = g.op("Add", g.op("ReduceSum", g.op("Mul", input2, input2), ax, keepdims_i=0), eps)
    cos = g.op("Div", prod, g.op("Sqrt", g.op("Mul", mag1, mag2)))
    zero = _const(g, 0.0, dt)
    pos = g.op("Sub", _const(g, 1.0, dt), cos)
    neg = _clamp_min_number(g, g.op("Sub", cos, _const(g, margin_v, dt)), zero)
    out = g.op("Add", g.op("Where", g.op("Equal", target, _const(g, 1, t_dtype)), pos, zero),
               g.op("Where", g.op("Equal", target, _const(g, -1, t_dtype)), neg, zero))
    return _loss_reduction(g, out, reduction, what)


_CDIST_MM_ROWS = 25   # Distance.cpp: "use_mm_for_euclid_dist_if_necessary" takes the mm path above it


def _euclidean_dist_mm(g, x1, x2, dt):
    """eager's _euclidean_dist: x1_ = [-2 x1, |x1|^2, 1], x2_ = [x2, 1, |x2|^2],
    sqrt(clamp_min(x1_ @ x2_^T, 0)); its backward (_euclidean_dist_backward) divides by the result
    and takes 0 where it is 0, which the Where around Sqrt gives (Sqrt's own is inf there)."""
    ax = _const(g, [-1], torch.int64)
    n1 = g.op("ReduceSum", g.op("Mul", x1, x1), ax, keepdims_i=1)
    n2 = g.op("ReduceSum", g.op("Mul", x2, x2), ax, keepdims_i=1)
    one1 = g.op("Expand", _const(g, 1.0, dt), g.op("Shape", n1))
    one2 = g.op("Expand", _const(g, 1.0, dt), g.op("Shape", n2))
    a = g.op("Concat", g.op("Mul", x1, _const(g, -2.0, dt)), n1, one1, axis_i=-1)
    b = g.op("Concat", x2, one2, n2, axis_i=-1)
    rank = _input_rank_or_none(x2)
    perm = list(range(rank - 2)) + [rank - 1, rank - 2]
    sq = g.op("MatMul", a, g.op("Transpose", b, perm_i=perm))
    zero, one = _const(g, 0.0, dt), _const(g, 1.0, dt)
    nonpos = g.op("LessOrEqual", sq, zero)                # clamp_min(0) and the 0 of the subgradient
    return g.op("Where", nonpos, zero, g.op("Sqrt", g.op("Where", nonpos, one, sq)))


def _cdist_symbolic(g, x1, x2, p, compute_mode=None):
    """torch.cdist as eager computes it (Distance.cpp): p 2 through _euclidean_dist (a matrix
    product) with compute_mode 'use_mm_for_euclid_dist', or by default where either input has
    more than 25 rows; otherwise the norm of every difference, with _cdist_backward's gradient
    (for p = inf every tie gets the whole dy). torch's rule reuses its pairwise_distance rule:
    eps in the exponent, no abs (NaN for odd p), and the mm path whatever the mode."""
    from ..compat import symbolic_helper as sh
    what = "torch.cdist"
    dt = _same_float_dtype(what, x1, x2)
    p_v = _float_const_arg(p, what, "p")
    r1, r2 = _input_rank_or_none(x1), _input_rank_or_none(x2)
    if r1 is None or r2 is None or r1 < 2 or r1 != r2:
        _refuse(what, "ortmod needs inputs of one known rank, at least 2")
    if p_v < 0:
        _refuse(what, "p must be non-negative")
    mode = None if compute_mode is None or sh.is_none(compute_mode) else sh.maybe_get_const(compute_mode, "i")
    if sh.is_value(mode):
        _refuse(what, "ortmod keeps compute_mode only as a constant")
    mode = mode or 0

    def direct(x1, x2):
        diff = g.op("Sub", g.op("Unsqueeze", x1, _const(g, [-2], torch.int64)),
                    g.op("Unsqueeze", x2, _const(g, [-3], torch.int64)))
        if math.isinf(p_v):
            return _inf_norm_ties_whole(g, diff)
        return _p_norm(g, diff, p_v, [-1], False, what)

    if p_v != 2.0 or mode == 2:
        return direct(x1, x2)
    if mode == 1:
        return _euclidean_dist_mm(g, x1, x2, dt)
    rows1, rows2 = sh.get_tensor_dim_size(x1, -2), sh.get_tensor_dim_size(x2, -2)
    if rows1 is not None and rows2 is not None:
        if rows1 > _CDIST_MM_ROWS or rows2 > _CDIST_MM_ROWS:
            return _euclidean_dist_mm(g, x1, x2, dt)
        return direct(x1, x2)
    # row counts dynamic in the graph: eager's choice made on the run's shapes. Each path reads
    # zeros where it is not taken, so its backward (0 * inf at an infinite input) adds nothing
    limit = _const(g, [_CDIST_MM_ROWS], torch.int64)
    rows = lambda x: g.op("Slice", g.op("Shape", x), _const(g, [-2], torch.int64), _const(g, [-1], torch.int64))
    use_mm = g.op("Or", g.op("Greater", rows(x1), limit), g.op("Greater", rows(x2), limit))
    zero = _const(g, 0.0, dt)
    only = lambda x, on_mm: g.op("Where", use_mm, x, zero) if on_mm else g.op("Where", use_mm, zero, x)
    return g.op("Where", use_mm, _euclidean_dist_mm(g, only(x1, True), only(x2, True), dt),
                direct(only(x1, False), only(x2, False)))


def _inf_norm_ties_whole(g, diff):
    """max |diff| over the last axis with _cdist_backward's gradient: sign(diff) * dy at every
    element equal to the maximum (linalg_vector_norm's shares dy among them instead)."""
    a = g.op("Abs", diff)
    ax = _const(g, [-1], torch.int64)
    raw = g.op("ReduceMax", a, ax, keepdims_i=1)
    m = _stop_gradient(g, raw)
    hit = g.op("Cast", g.op("Equal", a, m), to_i=_onnx_dtype(_dtype_of(diff)))
    picked = g.op("Mul", _stop_gradient(g, hit), g.op("Sub", a, _stop_gradient(g, a)))
    ties_whole = g.op("Add", m, g.op("ReduceSum", picked, ax, keepdims_i=1))
    # a - a is NaN at an infinite element: rows whose max is not finite keep ReduceMax itself
    finite = g.op("Equal", g.op("Sub", m, m), _const(g, 0.0, _dtype_of(diff)))
    return g.op("Squeeze", g.op("Where", finite, ties_whole, raw), ax)


def _dist_symbolic(g, self, other, p):
    """torch.dist: eager's at::norm(self - other, p) over every element (derivatives.yaml:
    norm_backward of the difference). torch's exporter has no rule."""
    what = "torch.dist"
    _same_float_dtype(what, self, other)
    d = g.op("Sub", self, other)
    rank = _input_rank_or_none(d)
    if rank is None:
        r1, r2 = _input_rank_or_none(self), _input_rank_or_none(other)
        rank = None if r1 is None or r2 is None else max(r1, r2)
    if rank is None:
        _refuse(what, "ortmod needs the inputs' ranks at export")
    return _p_norm(g, d, _float_const_arg(p, what, "p"), list(range(rank)), False, what)


_INT64_MAX = 2**63 - 1


def _pad_symbolic(g, input, pad, mode, value):
    """F.pad: torch's symbolic for everything but ``circular``. Its circular rule slices axes
    2, 3, ... whatever the input's rank, as if every input were batched (N, C, ...): an
    unbatched input (C, H, W) under CircularPad2d asks for axis 3 of a rank-3 tensor, and
    torch's per-node ONNX shape inference then corrupts the heap (the process aborts in
    free()). The padded dims are the last len(pad) / 2, so the axes count from the end here.
    Negative pads crop first and wrap what is left, as eager's circular pad does."""
    from ..compat import symbolic_helper as sh
    from ..compat import ts_opset11 as symbolic_opset11
    if sh.parse_arg(mode, "s") != "circular":
        return symbolic_opset11.pad(g, input, pad, mode, value)
    padding = sh.maybe_get_const(pad, "is")
    if sh.is_value(padding) and sh.is_packed_list(padding):
        try:
            padding = [sh.get_const(v, "i", "padding") for v in sh.unpack_list(padding)]
        except RuntimeError:   # torch's SymbolicValueError: a padding computed at run time
            padding = None
    if not isinstance(padding, (list, tuple)) or len(padding) % 2:
        _refuse("F.pad(mode='circular')", "the padding must be constant, one (left, right) pair per padded dim")
    rank = sh.get_tensor_rank(input)
    ndim = len(padding) // 2
    if rank is None or rank < ndim:
        _refuse("F.pad(mode='circular')", f"the input's rank must be known and at least {ndim}")

    def slice_(x, axis, start, end):
        i64 = torch.int64
        return g.op("Slice", x, _const(g, [start], i64), _const(g, [end], i64), _const(g, [axis], i64))

    out = input
    for k in range(ndim):   # pad's last pair pads the first padded dim (as torch's list reads)
        left, right = padding[-(2 * k + 2)], padding[-(2 * k + 1)]
        axis = rank - ndim + k
        if left < 0 or right < 0:
            out = slice_(out, axis, max(0, -left), right if right < 0 else _INT64_MAX)
        pieces = []
        if left > 0:
            pieces.append(slice_(out, axis, -left, _INT64_MAX))
        pieces.append(out)
        if right > 0:
            pieces.append(slice_(out, axis, 0, right))
        if len(pieces) > 1:
            out = g.op("Concat", *pieces, axis_i=axis)
    return out


# the overloads of the in-place clamps (clamp_, ...) of the graph converting: the exporter's passes
# replace each by a new out-of-place node, without the note
_inplace_clamps = set()


def _clamp_overloads_noted(optimize_graph, noting):
    """Wraps the exporter's conversion of the traced graph: before its passes make a number bound
    a tensor, each clamp / clamp_min / clamp_max notes whether eager ran its Tensor overload
    (``ortmod_clamp_tensor``), which _clamp_symbolic reads (their gradients at a bound differ
    from torch 2.14)."""
    def note(block):
        for node in block.nodes():
            if node.kind().rstrip("_") in ("aten::clamp", "aten::clamp_min", "aten::clamp_max", "aten::clip"):
                node.i_("ortmod_clamp_tensor", int(".Tensor(" in node.schema()))
                if node.kind().endswith("_"):
                    _inplace_clamps.add(node.i("ortmod_clamp_tensor"))
            for sub in node.blocks():
                note(sub)

    def run(graph, *args, **kw):
        _inplace_clamps.clear()
        note(graph)
        return optimize_graph(graph, *args, **kw)
    if not noting:      # torch's own clamp rules take no such attribute
        return optimize_graph
    run.__wrapped__ = optimize_graph
    return run

