"""ortmod's export rules for nn layers whose stock TorchScript rule is missing or narrower than
eager (pools on unbatched inputs or with output sizes that do not divide the input, norms):
each a faithful decomposition into ops the engine runs, checked against eager, or a refusal
that names what it cannot reproduce.

``symbolics(registration, opset)`` returns {aten name: symbolic}; ``semantic_export``
registers them only while ortmod exports."""
import torch

from ..compat import JitListType, JitTensorType

from .symbolics import _avg_pool_symbolic
from ..onnx_util import _const, _dtype_of, _input_rank_or_none, _onnx_dtype, _refuse, _torch_symbolic
from . import symbolics as ts_symbolics
from ..onnx_util import _stop_gradient

_I64 = torch.int64
_HALF = (torch.float16, torch.bfloat16)


class _NeedsStaticSizes(RuntimeError):
    """Raised while input dims are exported dynamic: ortmod's export (``_capture.export``) takes
    any error but a refusal as "export again with static input dims", which these rules need.
    Should the static export still lack the sizes, it surfaces as ortmod's ExportError, naming
    the op."""


def _sizes(x):
    from ..compat import symbolic_helper as sh
    return sh.get_tensor_sizes(x)


def _axes(g, axes):
    return _const(g, list(axes), _I64)


def _slice(g, x, axis, start, end):
    return g.op("Slice", x, _axes(g, [start]), _axes(g, [end]), _axes(g, [axis]))


def _int_list(value, what, name):
    """A constant int or int list argument as a list (elements may be None); None if it is
    not constant."""
    from ..compat import symbolic_helper as sh
    if sh.is_none(value):
        return None
    v = sh.maybe_get_const(value, "is")
    if sh.is_value(v):
        if not sh.is_packed_list(v):
            return None
        out = []
        for e in sh.unpack_list(v):
            if sh.is_none(e):
                out.append(None)
                continue
            c = sh.maybe_get_const(e, "i")
            if sh.is_value(c):
                return None
            out.append(int(c))
        return out
    return [int(v)] if isinstance(v, int) else [int(e) for e in v]


# ---- unfold ----------------------------------------------------------------------------------

def _unfold_symbolic(g, x, dimension, size, step):
    """Tensor.unfold(dim, size, step): a Gather along dim of each window's indices (the starts
    0 .. L - size by step, Range of the traced length, plus 0 .. size - 1), the window axis then
    moved to the end: eager's (..., windows, ..., size). torch's opset-9 rule unsqueezes at the
    dim as given: a negative one gave (..., size, windows), transposed values where the two are
    equal, without a word. Overlapping windows' gradients sum in Gather's (step < size)."""
    from ..compat import symbolic_helper as sh
    dim, size, step = (sh.maybe_get_const(v, "i") for v in (dimension, size, step))
    rank = _input_rank_or_none(x)
    if not all(isinstance(v, int) for v in (dim, size, step)) or rank is None:
        _refuse("unfold", "ortmod takes a constant dimension, size and step, on an input of known rank")
    if rank == 0:       # eager: a 0-d tensor's one window of size 1 (size and step checked by eager)
        return g.op("Unsqueeze", x, _axes(g, [0]))
    dim = dim + rank if dim < 0 else dim
    length = g.op("Gather", g.op("Shape", x), _const(g, dim, _I64), axis_i=0)
    starts = g.op("Range", _const(g, 0, _I64), g.op("Sub", length, _const(g, size - 1, _I64)),
                  _const(g, step, _I64))
    indices = g.op("Add", g.op("Unsqueeze", starts, _axes(g, [1])), _const(g, [list(range(size))], _I64))
    windows = g.op("Gather", x, indices, axis_i=dim)      # (..., windows, size, ...)
    perm = list(range(rank + 1))
    perm.append(perm.pop(dim + 1))
    return g.op("Transpose", windows, perm_i=perm)


# ---- vdot ------------------------------------------------------------------------------------

def _vdot_symbolic(g, x, y):
    """torch.vdot of real vectors is their dot product (spectral_norm's sigma, u . W v): MatMul of
    two 1-d tensors, as torch's rule for dot. A complex vdot conjugates x: not a dtype ortmod takes."""
    dtype = _dtype_of(x, None)
    if dtype is None or dtype.is_complex or not dtype.is_floating_point:
        _refuse("vdot", f"ortmod takes real floating vectors, not {dtype}")
    return g.op("MatMul", x, y)


# ---- rms_norm --------------------------------------------------------------------------------

def _rms_norm_symbolic(g, x, normalized_shape, weight, eps):
    """torch.rms_norm as eager's composite (layer_norm.cpp, rms_norm_symint): in the op-math
    dtype (float32 for half/bfloat16 inputs, else the input's own), x * rsqrt(mean(x^2 over the
    normalized dims) + eps), cast back to the input dtype, then times weight. eps None is the
    op-math dtype's machine epsilon. Eager differentiates those same ops (pow, mean, add,
    rsqrt, mul), so the engine's gradient is eager's."""
    from ..compat import symbolic_helper as sh
    shape = _int_list(normalized_shape, "rms_norm", "normalized_shape")
    if shape is None or None in shape:
        _refuse("rms_norm", "ortmod keeps normalized_shape only as a constant")
    dt = _dtype_of(x, None)
    if dt is None:
        _refuse("rms_norm", "the input's floating dtype must be known at export")
    op_dt = torch.float32 if dt in _HALF else dt
    if sh.is_none(eps):
        eps_v = torch.finfo(op_dt).eps
    else:
        eps_v = sh.maybe_get_const(eps, "f")
        if sh.is_value(eps_v):
            _refuse("rms_norm", "ortmod keeps eps only as a constant")
    xs = x if op_dt == dt else g.op("Cast", x, to_i=_onnx_dtype(op_dt))
    axes = _axes(g, range(-len(shape), 0))
    ms = g.op("ReduceMean", g.op("Mul", xs, xs), axes, keepdims_i=1)
    root = g.op("Sqrt", g.op("Add", ms, _const(g, float(eps_v), op_dt)))
    if op_dt == torch.float64 and float(torch.tensor(eps_v, dtype=torch.float32)) != float(eps_v):
        # the engine fuses x * Reciprocal(Sqrt(mean + eps)) * weight into one
        # SimplifiedLayerNormalization whose epsilon is a float32 attribute: a float64 eps
        # that float32 cannot hold would be rounded. 1 / sqrt is the same value, not fused.
        inv = g.op("Div", _const(g, 1.0, op_dt), root)
    else:
        inv = g.op("Reciprocal", root)
    y = g.op("Mul", xs, inv)
    if op_dt != dt:
        y = g.op("Cast", y, to_i=_onnx_dtype(dt))
    if not sh.is_none(weight):
        y = g.op("Mul", y, weight)
    return y


# ---- threshold, bilinear ---------------------------------------------------------------------

def _threshold_symbolic(g, x, threshold, value):
    """threshold(x, th, v) = v where x <= th, else x (NaN passes: NaN <= th is false), and the
    gradient dy where x > th or NaN, 0 elsewhere: eager's threshold and threshold_backward
    both test x <= th. torch's rule exports only th = v = 0 (as Relu)."""
    from ..compat import symbolic_helper as sh
    th, v = sh.maybe_get_const(threshold, "f"), sh.maybe_get_const(value, "f")
    if sh.is_value(th) or sh.is_value(v):
        _refuse("threshold", "ortmod keeps threshold and value only as constants")
    dt = _dtype_of(x, None)
    if dt is None:
        _refuse("threshold", "ortmod exports it for a floating input of known dtype only")
    below = g.op("LessOrEqual", x, _const(g, float(th), dt))
    return g.op("Where", below, _const(g, float(v), dt), x)


def _bilinear_symbolic(g, x1, x2, weight, bias):
    """bilinear: y[..., o] = sum_ij x1[..., i] W[o, i, j] x2[..., j] + b[o], as two Einsums
    (the engine's Einsum takes two operands): x1 W first, then its product with x2. Eager's
    _trilinear sums in another order, so values agree to rounding."""
    from ..compat import symbolic_helper as sh
    r1, r2 = _input_rank_or_none(x1), _input_rank_or_none(x2)
    if r1 is None or r2 is None or r1 != r2 or r1 < 1:
        _refuse("bilinear", "ortmod needs both inputs' ranks, equal, at export")
    t = g.op("Einsum", x1, weight, equation_s="...i,oij->...oj")
    y = g.op("Einsum", t, x2, equation_s="...oj,...j->...o")
    if bias is not None and not sh.is_none(bias):
        y = g.op("Add", y, bias)
    return y


# ---- pools on unbatched inputs ---------------------------------------------------------------

def _batched(g, x, spatial, pool, n_outputs=1):
    """Runs ``pool`` (the rule for a batched (N, C, *spatial) input) on ``x``; an unbatched
    input (C, *spatial) gets a batch dim of 1 for it and loses it after: exact, as eager's
    pools treat an unbatched input as a batch of one. Outputs that are None stay None."""
    rank = _input_rank_or_none(x)
    if rank is None:
        _refuse(f"{spatial}-d pooling", "ortmod needs the input's rank at export")
    if rank == spatial + 2:
        return pool(x)
    if rank != spatial + 1:
        _refuse(f"{spatial}-d pooling", f"an input of rank {rank} (eager takes {spatial + 1} or {spatial + 2})")
    out = pool(g.op("Unsqueeze", x, _axes(g, [0])))
    if n_outputs == 1 and not isinstance(out, (tuple, list)):
        return g.op("Squeeze", out, _axes(g, [0]))
    return tuple(None if o is None else g.op("Squeeze", o, _axes(g, [0])) for o in out)


def _avg_pool_unbatched(rank, inner):
    """avg_pool{1,2,3}d: ``inner`` is _semantics' rule (which keeps divisor_override, over
    torch's), run on a batched input; this rule, registered over it, adds the unbatched case."""
    def symbolic(g, input, kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override=None):
        return _batched(g, input, rank, lambda x: inner(g, x, kernel_size, stride, padding, ceil_mode,
                                                        count_include_pad, divisor_override))
    return symbolic


def _max_pool_unbatched(rank, original, with_indices):
    """max_pool{1,2,3}d(_with_indices): torch's rule on a batched input. Its indices are flat
    over each (n, c) plane, as eager's, so dropping the batch dim of 1 keeps them right."""
    def symbolic(g, input, *args):
        return _batched(g, input, rank, lambda x: original(g, x, *args), 2 if with_indices else 1)
    return symbolic


# ---- adaptive pools --------------------------------------------------------------------------

def _windows(length, out):
    """Eager's adaptive windows: [floor(i L / out), ceil((i + 1) L / out)) for i < out."""
    return [((i * length) // out, -((-(i + 1) * length) // out)) for i in range(out)]


def _adaptive_pool(rank, kind, max_pool_with_indices):
    """adaptive_{avg,max}_pool{1,2,3}d, unbatched or not, for any output size.

    * every output size 1 (avg): GlobalAveragePool, as torch's rule; no sizes needed;
    * every output size 1 (max): ArgMax over the flattened plane (the first maximum, or the
      last NaN: eager's element, _eager_argmax) and GatherElements, so the gradient goes to
      that one element;
    * output sizes dividing the input's: AveragePool, or torch's max_pool_with_indices rule
      (MaxPool), with kernel = stride = L / out: eager's windows exactly; MaxPool's gradient
      goes to the first maximum of a window, as eager's;
    * else, with static spatial sizes, eager's windows one axis at a time, innermost first
      (a window is a product of intervals): per window a Slice and ReduceMean (avg), or ArgMax
      and GatherElements (max: the first maximum along the axis, or its last NaN, so that
      nested over the axes it is the first maximum (last NaN) of the box in row-major order,
      the element eager's kernel picks and sends the gradient to; ReduceMax would share the
      gradient among ties). Indices are carried along and returned flat over each plane, as
      eager's.

    The divisible case's MaxPool is the engine's, which keeps eager's max_pool rule (the first
    maximum, or the last NaN of a window).

    Sizes unknown at export (dynamic input dims) make ortmod export again with static ones."""
    what = f"adaptive_{kind}_pool{rank}d"

    def pool(g, x, output_size):
        out = _int_list(output_size, what, "output_size")
        if out is None:
            raise _NeedsStaticSizes(f"{what}: output_size is not a constant at export")
        if len(out) == 1:
            out = out * rank
        if len(out) != rank:
            _refuse(what, f"output_size {out} has not {rank} values")
        sizes = _sizes(x)
        spatial = None if sizes is None else sizes[2:]
        if all(o == 1 for o in out):
            return _global(g, x, rank, kind)
        if spatial is None or None in spatial:
            raise _NeedsStaticSizes(f"{what}: the input's spatial sizes are not known at export")
        out = [L if o is None else o for o, L in zip(out, spatial)]
        if all(o > 0 and L % o == 0 for o, L in zip(out, spatial)):
            if kind == "avg":
                k = [L // o for o, L in zip(out, spatial)]
                return g.op("AveragePool", x, kernel_shape_i=k, strides_i=k, pads_i=[0] * (2 * rank),
                            ceil_mode_i=0, count_include_pad_i=0)
            k = [L // o for o, L in zip(out, spatial)]
            return max_pool_with_indices(g, x, k, k, [0] * rank, [1] * rank, False)
        return _separable(g, x, spatial, out, kind)

    def symbolic(g, input, output_size):
        return _batched(g, input, rank, lambda x: pool(g, x, output_size), 1 if kind == "avg" else 2)
    return symbolic


def _eager_argmax(g, x, axis):
    """The index eager's max-pool kernels keep along ``axis`` (``val > max || isnan(val)``):
    the first maximum, or the last NaN where there is one. The engine's ArgMax keeps the first
    NaN (torch.argmax's rule), with select_last_index the last NaN but also the last maximum."""
    first = g.op("ArgMax", x, axis_i=axis, keepdims_i=1, select_last_index_i=0)
    last = g.op("ArgMax", x, axis_i=axis, keepdims_i=1, select_last_index_i=1)
    nan = g.op("IsNaN", g.op("GatherElements", x, first, axis_i=axis))
    return g.op("Where", nan, last, first)


def _global(g, x, rank, kind):
    if kind == "avg":
        return g.op("GlobalAveragePool", x)       # torch's rule for it
    flat = g.op("Reshape", x, _axes(g, [0, 0, -1]))
    k = _eager_argmax(g, flat, 2)
    v = g.op("GatherElements", flat, k, axis_i=2)
    if rank == 1:
        return v, k
    extra = _axes(g, range(3, 2 + rank))    # (N, C, 1) -> (N, C, 1, ..., 1)
    return g.op("Unsqueeze", v, extra), g.op("Unsqueeze", k, extra)


def _separable(g, x, spatial, out, kind):
    rank = len(spatial)
    vals = x
    idx = {}                                   # axis -> absolute index along it, shaped as vals
    for a in reversed(range(rank)):
        axis, length, o = 2 + a, spatial[a], out[a]
        if o == length:                        # windows of one element: nothing to reduce
            if kind == "max":
                shape = [1] * (2 + rank)
                shape[axis] = length
                rng = _const(g, torch.arange(length).reshape(shape).tolist(), _I64)
                idx[a] = g.op("Expand", rng, g.op("Shape", vals))
            continue
        if o <= 0:
            _refuse(f"adaptive_{kind}_pool{rank}d", f"output size {o}")
        pv, pi = [], {b: [] for b in list(idx) + [a]}
        for start, end in _windows(length, o):
            win = _slice(g, vals, axis, start, end)
            if kind == "avg":
                pv.append(g.op("ReduceMean", win, _axes(g, [axis]), keepdims_i=1))
                continue
            k = _eager_argmax(g, win, axis)
            pv.append(g.op("GatherElements", win, k, axis_i=axis))
            for b, ib in idx.items():
                pi[b].append(g.op("GatherElements", _slice(g, ib, axis, start, end), k, axis_i=axis))
            pi[a].append(g.op("Add", k, _const(g, start, _I64)) if start else k)
        vals = g.op("Concat", *pv, axis_i=axis) if len(pv) > 1 else pv[0]
        if kind == "max":
            idx = {b: (g.op("Concat", *p, axis_i=axis) if len(p) > 1 else p[0]) for b, p in pi.items()}
    if kind == "avg":
        return vals
    flat = None
    for a in range(rank):                     # row-major over the plane
        flat = idx[a] if flat is None else g.op("Add", g.op("Mul", flat, _const(g, spatial[a], _I64)), idx[a])
    return vals, flat


# ---- constant pad: pads as a constant ---------------------------------------------------------

def _pad_symbolic(g, input, pad, mode, value):
    """F.pad in constant mode with constant pads: torch's rule (constant_pad_nd), but the pads
    as one Constant instead of the Concat / Slice / Transpose chain torch computes them with
    at run time. The values are the same; the difference is that ONNX shape inference then
    knows the padded shape: local_response_norm pads a dim of 1, and squeeze(1) of a dim
    whose size is unknown is exported as an If (squeeze only if it is 1), which the engine
    does not run. Every other F.pad is _semantics' rule, which this one overrides for
    aten::pad and runs."""
    from ..compat import symbolic_helper as sh
    pads = _int_list(pad, "F.pad", "pad") if sh.parse_arg(mode, "s") == "constant" else None
    rank = _input_rank_or_none(input)
    if pads is None or None in pads or len(pads) % 2 or rank is None or len(pads) // 2 > rank:
        return ts_symbolics._pad_symbolic(g, input, pad, mode, value)
    begin, end = [0] * rank, [0] * rank
    for k in range(len(pads) // 2):          # pad's first pair pads the last dim
        begin[rank - 1 - k], end[rank - 1 - k] = pads[2 * k], pads[2 * k + 1]
    value = sh.if_scalar_type_as(sh.maybe_get_scalar(value), input)
    return g.op("Pad", input, _const(g, begin + end, _I64), value, mode_s="constant")


def _shape_keeping(original):
    """view / reshape: torch's rule, and where the target shape is a list whose elements are
    partly constant (x.view(x.size(0), 1, x.size(1), -1)), the constant dims written into the
    output's type. ONNX shape inference leaves every dim of a Reshape to a computed shape
    unknown, and a later squeeze of such a dim is exported as an If (local_response_norm on
    a 4-d or 5-d input). Only the type changes: a positive element k of Reshape's shape is
    that dim's size, whatever the others are. (The dims left unknown get fresh symbols, as
    torch's inference gave them for such a Reshape.)"""
    def symbolic(g, self, size):
        out = original(g, self, size)
        try:
            wanted = _shape_list_partly_const(size)
            have = _sizes(out)
        except Exception:   # anything unexpected: torch's rule as it is
            return out
        if wanted is None or not isinstance(out.type(), JitTensorType):
            return out
        if have is None:
            have = [None] * len(wanted)
        if len(have) != len(wanted):
            return out
        merged = [h if h is not None else (w if w is not None and w > 0 else None) for h, w in zip(have, wanted)]
        if merged != have:
            out.setType(out.type().with_sizes(merged))
        return out
    return symbolic


def _shape_list_partly_const(size):
    """A shape list's elements: the constant ones as ints, the computed ones as None; None when
    the shape is not a list."""
    from ..compat import symbolic_helper as sh
    if not sh.is_value(size) or not sh.is_packed_list(size):
        return None
    out = []
    for e in sh.unpack_list(size):
        c = sh.maybe_get_const(e, "i")
        out.append(None if sh.is_value(c) else int(c))
    return out


# ---- fractional max pooling ------------------------------------------------------------------

# which entry of a plane's random samples places the windows along each spatial dim (found
# against eager: 2-D takes W from sample 0 and H from sample 1; 3-D takes T, H, W in order)
_FRACTIONAL_SAMPLE_OF_DIM = {2: (1, 0), 3: (0, 1, 2)}


def _fractional_starts(g, x, samples, axis, d, length_k, o, k, dtype):
    """Window starts along spatial dim d for every plane, (N, C, o) int64, computed in the
    graph as eager's generate_intervals does in the input's dtype: alpha = float(L - k) /
    float(o - 1); start j = int((j + u) * alpha) - int(u * alpha) for j < o - 1 (floor: every
    term is >= 0); the last window starts at L - k. The samples are a graph input (the module's
    ``_random_samples``), so new samples need no new export."""
    u = g.op("Gather", samples, _const(g, _FRACTIONAL_SAMPLE_OF_DIM[len(k)][d], _I64), axis_i=2)   # (N, C)
    u = g.op("Unsqueeze", u, _const(g, [2], _I64))                                                  # (N, C, 1)
    last = g.op("Expand", g.op("Reshape", length_k, _const(g, [1, 1, 1], _I64)), g.op("Shape", u))
    if o[d] == 1:
        return last
    alpha = g.op("Div", g.op("Cast", length_k, to_i=_onnx_dtype(dtype)), _const(g, float(o[d] - 1), dtype))
    j = _const(g, [float(v) for v in range(o[d] - 1)], dtype)
    first = g.op("Floor", g.op("Mul", g.op("Add", u, j), alpha))
    shift = g.op("Floor", g.op("Mul", u, alpha))
    starts = g.op("Cast", g.op("Sub", first, shift), to_i=_onnx_dtype(_I64))
    return g.op("Concat", starts, last, axis_i=2)


def _fractional_max_pool_symbolic(rank):
    """eager (FractionalMaxPool{2,3}d.cpp): along each dim the windows start as
    ``_fractional_starts`` computes from the plane's sample; each output is its window's max
    (NaN wins, else the first max in row-major order) and its gradient goes to that one tap.
    Exported as: the taps gathered into a tensor where every window is one k1 x k2 (x k3) block
    (GatherElements over the flattened plane; overlapping windows' gradients add, as eager's
    do), then MaxPool with kernel = stride = k, which scans each block in eager's order; its
    Indices map back through the tap table to eager's flat index in the plane. The samples must
    be a tensor of the module (``_random_samples``): windows drawn from torch's RNG on every call
    cannot be replayed."""
    what = f"fractional_max_pool{rank}d"

    def symbolic(g, x, kernel_size, output_size, random_samples):
        from ..compat import symbolic_helper as sh
        kernel = sh.maybe_get_const(kernel_size, "is")
        out_size = sh.maybe_get_const(output_size, "is")
        if sh.is_value(kernel) or sh.is_value(out_size):
            _refuse(what, "ortmod needs kernel_size and output_size as constants")
        k, o = [int(v) for v in kernel], [int(v) for v in out_size]
        if random_samples.node().kind() not in ("prim::Param", "onnx::Constant"):
            _refuse(what, "its windows are drawn from torch's random generator on every call, which the "
                    "engine cannot replay; pass _random_samples to fix them")
        x_rank = _input_rank_or_none(x)
        if x_rank not in (rank + 1, rank + 2) or _input_rank_or_none(random_samples) != 3:
            _refuse(what, f"ortmod needs an input of rank {rank + 1} or {rank + 2} and samples of rank 3")
        dtype = _dtype_of(x)
        if _dtype_of(random_samples, None) != dtype:
            _refuse(what, "ortmod needs the random samples in the input's dtype (as eager's kernel reads them)")
        if x_rank == rank + 1:   # unbatched: eager takes the samples' batch of one
            x = g.op("Unsqueeze", x, _const(g, [0], _I64))
        shape = g.op("Shape", x)
        # eager reads the samples of plane (n, c) and ignores any beyond the input's (an
        # unbatched input takes batch entry 0)
        random_samples = g.op("Slice", random_samples, _const(g, [0, 0], _I64),
                              g.op("Slice", shape, _const(g, [0], _I64), _const(g, [2], _I64)), _const(g, [0, 1], _I64))
        lengths = [g.op("Gather", shape, _const(g, [2 + d], _I64), axis_i=0) for d in range(rank)]
        table = None
        stride = _const(g, [1], _I64)
        for d in reversed(range(rank)):   # tap (n, c, o1, p1, ..., ok, pk) -> flat index in its plane
            starts = _fractional_starts(g, x, random_samples, 2 + d, d,
                                        g.op("Sub", lengths[d], _const(g, [k[d]], _I64)), o, k, dtype)
            spread = [a for a in range(2, 2 + 2 * rank) if a != 2 + 2 * d]   # (N, C, .., o_d, ..)
            taps = [1] * (2 * rank)
            taps[2 * d + 1] = k[d]
            pos = g.op("Add", g.op("Unsqueeze", starts, _const(g, spread, _I64)),
                       _const(g, torch.arange(k[d]).reshape([1, 1] + taps), _I64))
            term = g.op("Mul", pos, stride)
            table = term if table is None else g.op("Add", term, table)
            stride = g.op("Mul", stride, lengths[d])
        # the table is built in ONNX broadcasting: (N, C, o1, p1, ...) once both sides met
        flat = g.op("Reshape", x, _const(g, [0, 0, -1], _I64))
        table = g.op("Reshape", table, _const(g, [0, 0, -1], _I64))
        gathered = g.op("GatherElements", flat, table, axis_i=2)
        blocks = g.op("Concat", g.op("Slice", shape, _const(g, [0], _I64), _const(g, [2], _I64)),
                      _const(g, [a * b for a, b in zip(o, k)], _I64), axis_i=0)
        gathered = g.op("Reshape", gathered, blocks)
        y, idx = g.op("MaxPool", gathered, kernel_shape_i=k, strides_i=k, outputs=2)
        idx = g.op("Gather", g.op("Reshape", table, _const(g, [-1], _I64)), idx, axis_i=0)
        if x_rank == rank + 1:
            y = g.op("Squeeze", y, _const(g, [0], _I64))
            idx = g.op("Squeeze", idx, _const(g, [0], _I64))
        return y, idx

    return symbolic


# ---- upsampling ------------------------------------------------------------------------------

_UPSAMPLE_RANK = {"1d": 1, "2d": 2, "3d": 3}
_AXIS_NAMES = {1: ("W",), 2: ("H", "W"), 3: ("D", "H", "W")}


def _float_or_none(value, what):
    from ..compat import symbolic_helper as sh
    if value is None or sh.is_none(value):
        return None
    v = sh.maybe_get_const(value, "f")
    if sh.is_value(v):
        raise _NeedsStaticSizes(f"{what}: a scale is not a constant at export")
    return float(v)


def _float_list_or_none(value, what):
    from ..compat import symbolic_helper as sh
    if value is None or sh.is_none(value):
        return None
    v = sh.maybe_get_const(value, "fs")
    if sh.is_value(v):
        if not sh.is_packed_list(v):
            raise _NeedsStaticSizes(f"{what}: scale_factors are not constants at export")
        return [_float_or_none(e, what) for e in sh.unpack_list(v)]
    return [float(v)] if isinstance(v, (int, float)) else [float(e) for e in v]


def _upsample_call(g, what, rank, x, output_size, scale_args, align_corners=None):
    """The eager call this node makes, replayable on probes: (spatial sizes, op, args after the
    input) for the default overload (output_size, [align_corners], per-axis scales), as the .vec
    overload reduces to. Raises _NeedsStaticSizes while sizes are not constants."""
    sizes = _sizes(x)
    if sizes is None or len(sizes) != rank + 2:
        if _input_rank_or_none(x) not in (None, rank + 2):
            _refuse(what, f"an input of rank {_input_rank_or_none(x)} (eager takes {rank + 2})")
        raise _NeedsStaticSizes(f"{what}: the input's rank is not known at export")
    spatial = sizes[2:]
    if None in spatial:
        raise _NeedsStaticSizes(f"{what}: the input's spatial sizes are not known at export")
    if len(scale_args) == 1 and rank > 1 or (len(scale_args) == 1 and _is_list_value(scale_args[0])):
        scales = _float_list_or_none(scale_args[0], what)         # the .vec overload
        if scales is not None and len(scales) == 1:
            scales = scales * rank
    else:
        scales = [_float_or_none(s, what) for s in scale_args]    # the default overload
    if scales is not None and len(scales) != rank:
        _refuse(what, f"{len(scales)} scales for {rank} spatial dims")
    if scales is not None:
        scales = _traced_scales(g, len(scale_args), scales)
    out = _int_list(output_size, what, "output_size")
    from ..compat import symbolic_helper as sh
    if out is None and not sh.is_none(output_size):
        # computed from sizes (recompute_scale_factor, size=y.shape[2:]): the traced output's
        # sizes, but only while every graph input is static (the export the graph then holds
        # only for); else export again so
        out = _traced_output_sizes(g) if _all_inputs_static(g) else None
        if out is None:
            raise _NeedsStaticSizes(f"{what}: output_size is not a constant at export")
    if out is None:
        if scales is None or None in scales:
            _refuse(what, "neither output_size nor scale_factors is given")
        out = None                                                # eager's, from the scales
    elif len(out) == 1:
        out = out * rank
    if out is not None and (None in out or len(out) != rank):
        raise _NeedsStaticSizes(f"{what}: output_size is not a constant at export")
    if scales is None:
        scales = [None] * rank
    spatial = list(spatial)
    if out is None:   # eager's compute_output_size, read off eager on a probe
        vec = getattr(torch.ops.aten, what).vec
        extra = [align_corners] if align_corners is not None else []
        out = list(vec(torch.zeros([1, 1] + spatial), None, *extra, scales).shape[2:])
    return spatial, out, scales


def _traced_scales(g, count, scales):
    """The scales as the traced call held them: the ONNX graph stores a scale as a float32
    constant, while eager computes with the double (scale_factor 0.7 at size 10 gives 7 outputs,
    its float32 rounding 6), so each is read back from the traced node's own constant, checked to
    round to the value the ONNX graph holds."""
    node = getattr(g, "original_node", None)
    if node is None or node.inputsSize() < count:
        return scales
    held = []
    for i in range(node.inputsSize() - count, node.inputsSize()):
        v = node.inputsAt(i)
        if v.node().kind() != "prim::Constant":
            return scales
        held.append(v.toIValue())
    if count == 1 and (isinstance(held[0], (list, tuple)) or held[0] is None):
        held = held[0]
        if held is not None and len(held) == 1:
            held = list(held) * len(scales)
    if held is None or len(held) != len(scales):
        return scales
    f32 = lambda v: None if v is None else float(torch.tensor(float(v), dtype=torch.float32))
    if any(f32(h) != f32(s) for h, s in zip(held, scales)):
        return scales
    return [None if h is None else float(h) for h in held]


def _all_inputs_static(g):
    for v in g.graph.inputs():
        t = v.type()
        if isinstance(t, JitTensorType):
            s = t.varyingSizes()
            if s is None or None in s:
                return False
    return True


def _traced_output_sizes(g):
    node = getattr(g, "original_node", None)
    if node is None or node.outputsSize() != 1:
        return None
    t = node.output().type()
    s = t.varyingSizes() if isinstance(t, JitTensorType) else None
    if s is None or len(s) < 3 or None in s:
        return None
    return list(s[2:])


def _is_list_value(v):
    t = v.type()
    return isinstance(t, JitListType) or (v.node().kind() == "prim::ListConstruct")


def _linear_table(L, O, align_corners, scale, dtype):
    """Eager's (UpSampleKernel.cpp, compute_indices_weights_linear) indices and weights along
    one axis: in the op-math dtype, the source index area_pixel_compute_source_index; i0 its
    floor (floorf) clamped to L - 1, i1 = i0 + 1 unless i0 is the last; lambda1 = clamp(real -
    i0, 0, 1) and lambda0 = 1 - lambda1, both in the input's dtype. O == L copies (1, 0)."""
    op_dt = torch.float32 if dtype in _HALF else dtype
    T = lambda v: torch.tensor(v, dtype=op_dt)
    i0, i1, l0, l1 = [], [], [], []
    if align_corners:
        ratio = T(L - 1) / T(O - 1) if O > 1 else T(0.0)
    elif scale is not None and scale > 0:
        ratio = T(1.0 / scale)
    else:
        ratio = T(L) / T(O)
    for d in range(O):
        if O == L:
            i0.append(d), i1.append(d), l0.append(1.0), l1.append(0.0)
            continue
        if align_corners:
            real = ratio * T(d)
        else:
            real = ratio * (T(d) + T(0.5)) - T(0.5)
            if real < 0:
                real = T(0.0)
        k = min(int(torch.floor(real.to(torch.float32))), L - 1)
        lam1 = torch.clamp(real - T(k), 0, 1).to(dtype)
        lam0 = (torch.tensor(1.0, dtype=dtype) - lam1)
        i0.append(k), i1.append(k + 1 if k < L - 1 else k), l0.append(float(lam0)), l1.append(float(lam1))
    return i0, i1, l0, l1


def _linear_apply(x, tables, dtype):
    """The decomposition, in torch: each axis innermost first, w0 * x[i0] + w1 * x[i1]."""
    op_dt = torch.float32 if dtype in _HALF else dtype
    y = x.to(op_dt)
    rank = len(tables)
    for a in reversed(range(rank)):
        i0, i1, w0, w1 = tables[a]
        shape = [len(i0)] + [1] * (rank - 1 - a)
        w0 = torch.tensor(w0, dtype=op_dt).reshape(shape)
        w1 = torch.tensor(w1, dtype=op_dt).reshape(shape)
        y = torch.index_select(y, 2 + a, torch.tensor(i0)) * w0 + torch.index_select(y, 2 + a, torch.tensor(i1)) * w1
    return y.to(dtype)


def _linear_symbolic(rank):
    what = {1: "upsample_linear1d", 2: "upsample_bilinear2d", 3: "upsample_trilinear3d"}[rank]
    op = getattr(torch.ops.aten, what).default

    def symbolic(g, input, output_size, align_corners, *scale_args):
        """linear / bilinear / trilinear: separable, W first, then H, then D, as eager's kernel
        nests them (out = h0 (w0 x00 + w1 x01) + h1 (w0 x10 + w1 x11)): along each axis
        w0 * x[i0] + w1 * x[i1] with eager's constant indices and weights (_linear_table), in
        the op-math dtype (float32 for half inputs, cast back at the end, as eager's kernel).
        The tables are checked against eager on a random probe and on NaN probes (which
        elements each output reads), refused on any difference."""
        from ..compat import symbolic_helper as sh
        ac = sh.maybe_get_const(align_corners, "b")
        if sh.is_value(ac):
            _refuse(what, "ortmod keeps align_corners only as a constant")
        ac = bool(ac)
        dtype = _dtype_of(input, None)
        if dtype is None or not dtype.is_floating_point:
            _refuse(what, "ortmod exports it for a floating input of known dtype only")
        spatial, out, scales = _upsample_call(g, what, rank, input, output_size, scale_args, ac)
        tables = [_linear_table(L, O, ac, s, dtype) for L, O, s in zip(spatial, out, scales)]
        _check_linear(op, what, spatial, out, ac, scales, tables, dtype)
        op_dt = torch.float32 if dtype in _HALF else dtype
        y = input if op_dt == dtype else g.op("Cast", input, to_i=_onnx_dtype(op_dt))
        for a in reversed(range(rank)):
            i0, i1, w0, w1 = tables[a]
            shape = [len(i0)] + [1] * (rank - 1 - a)
            g0 = g.op("Gather", y, _const(g, i0, _I64), axis_i=2 + a)
            g1 = g.op("Gather", y, _const(g, i1, _I64), axis_i=2 + a)
            y = g.op("Add", g.op("Mul", g0, _const(g, torch.tensor(w0).reshape(shape).tolist(), op_dt)),
                     g.op("Mul", g1, _const(g, torch.tensor(w1).reshape(shape).tolist(), op_dt)))
        if op_dt != dtype:
            y = g.op("Cast", y, to_i=_onnx_dtype(dtype))
        return y
    return symbolic


def _check_linear(op, what, spatial, out, ac, scales, tables, dtype):
    gen = torch.Generator().manual_seed(0)
    shape = [2, 1] + spatial
    x = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    want = op(x, out, ac, *scales)
    have = _linear_apply(x, tables, dtype)
    eps = torch.finfo(dtype).eps
    if want.shape != have.shape or not torch.allclose(have.double(), want.double(), rtol=16 * eps, atol=16 * eps):
        _refuse(what, "ortmod's indices and weights do not reproduce eager's here")
    # which inputs each output reads, per axis: probe k holds a NaN at index k along the axis
    for a, L in enumerate(spatial):
        p = torch.zeros([L, 1] + spatial, dtype=dtype)
        for k in range(L):
            idx = [k, 0] + [slice(None)] * len(spatial)
            idx[2 + a] = k
            p[tuple(idx)] = float("nan")
        if not torch.equal(torch.isnan(op(p, out, ac, *scales)), torch.isnan(_linear_apply(p, tables, dtype))):
            _refuse(what, "ortmod's indices do not read the elements eager's do")


def _upsample_refused(what, why):
    def symbolic(g, *args):
        _refuse(what, why)
    return symbolic


# ---- float64 activations -----------------------------------------------------------------
# torch's rules write leaky_relu's slope, elu's coefficients and SELU's constants as ONNX float
# attributes, which are float32: a float64 model then computes with 0.01f (1e-8 off). For a
# float64 input whose coefficients float32 cannot hold, these rules give eager's values and
# gradients from float64 constants (rrelu in eval here; leaky_relu, elu, celu, selu and
# hardsigmoid are written once for both paths in rules/aten_activations.py).

def _exact_in_float32(v):
    return float(torch.tensor(v, dtype=torch.float32)) == float(v)


def _const_floats(what, *values):
    from ..compat import symbolic_helper as sh
    out = [sh.maybe_get_const(v, "f") for v in values]
    if any(sh.is_value(v) for v in out):
        _refuse(what, "ortmod keeps its coefficients only as constants")
    return [float(v) for v in out]


def _is_float64(x):
    return _dtype_of(x, None) == torch.float64


def _leaky_float64(g, x, slope):
    """x times (1 where x > 0, else slope): eager's leaky_relu values and gradient, NaN taking the
    slope, with a float64 slope."""
    dt = torch.float64
    return g.op("Mul", x, g.op("Where", g.op("Greater", x, _const(g, 0.0, dt)), _const(g, 1.0, dt), _const(g, slope, dt)))


def _rrelu_float64(original):
    def symbolic(g, x, lower, upper, training, generator):
        from ..compat import symbolic_helper as sh
        if _is_float64(x) and sh.maybe_get_const(training, "b") is False:
            lo, up = _const_floats("rrelu", lower, upper)
            slope = (lo + up) / 2   # eager's rrelu in eval: leaky_relu with the mean slope
            if not _exact_in_float32(slope):
                return _leaky_float64(g, x, slope)
        return original(g, x, lower, upper, training, generator)
    return symbolic


def _float64_activation_rules(registration, opset):
    rules = {}
    original = _torch_symbolic(registration, "aten::rrelu", opset)
    if original is not None:
        rules["aten::rrelu"] = _rrelu_float64(original)
    return rules


def symbolics(registration, opset):
    rules = {
        "aten::rms_norm": _rms_norm_symbolic,
        "aten::threshold": _threshold_symbolic,
        "aten::bilinear": _bilinear_symbolic,
        "aten::pad": _pad_symbolic,
        "aten::unfold": _unfold_symbolic,
        "aten::vdot": _vdot_symbolic,
        **_float64_activation_rules(registration, opset),
    }
    for name in ("aten::view", "aten::reshape"):
        original = _torch_symbolic(registration, name, opset)
        if original is not None:
            rules[name] = _shape_keeping(original)
    for rank in (1, 2, 3):
        avg = f"aten::avg_pool{rank}d"
        original = _torch_symbolic(registration, avg, opset)
        if original is not None:
            # over _semantics' own avg_pool rule (divisor_override), which this one runs
            rules[avg] = _avg_pool_unbatched(rank, _avg_pool_symbolic(rank, original))
        for suffix, with_indices in (("", False), ("_with_indices", True)):
            name = f"aten::max_pool{rank}d{suffix}"
            original = _torch_symbolic(registration, name, opset)
            if original is not None:
                rules[name] = _max_pool_unbatched(rank, original, with_indices)
        for kind in ("avg", "max"):
            name = f"aten::adaptive_{kind}_pool{rank}d"
            rules[name] = _adaptive_pool(
                rank, kind, _torch_symbolic(registration, f"aten::max_pool{rank}d_with_indices", opset))
    rules["aten::fractional_max_pool2d"] = _fractional_max_pool_symbolic(2)
    rules["aten::fractional_max_pool3d"] = _fractional_max_pool_symbolic(3)
    rules["aten::upsample_linear1d"] = _linear_symbolic(1)
    rules["aten::upsample_bilinear2d"] = _linear_symbolic(2)
    rules["aten::upsample_trilinear3d"] = _linear_symbolic(3)
    rules["aten::upsample_bicubic2d"] = _upsample_refused(
        "upsample_bicubic2d (mode='bicubic')", "ortmod does not decompose bicubic interpolation")
    for name in ("_upsample_bilinear2d_aa", "_upsample_bicubic2d_aa"):
        rules[f"aten::{name}"] = _upsample_refused(
            f"{name} (antialias=True)", "ortmod does not decompose antialiased interpolation")
    return rules
