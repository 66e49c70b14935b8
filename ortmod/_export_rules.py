"""ortmod's translations of aten ops for the torch.export capture path, where torchlib's rule
(onnxscript's torch_lib, the translator torch ships) does not mean what eager training means, or
is an ONNX local function the engine does not take. Each is read against eager's kernel and its
backward (derivatives.yaml) for every argument; arguments a rule cannot honour are refused by
name in ``_capture_export._CHECKS`` before translation.

``translations(op, ir, stop_gradient)`` returns {aten overload: onnxscript function}; the
functions are traced by torch's exporter (trace mode: Python branches on the arguments)."""
import torch


def translations(op, ir, stop_gradient):
    from typing import Optional, Sequence, Tuple
    from onnxscript.function_libs.torch_lib.tensor_typing import TFloat, TReal, TTensor, TInt
    from onnxscript.function_libs.torch_lib.ops import core as tl_core
    from onnxscript.function_libs.torch_lib.ops import nn as tl_nn

    I64 = ir.DataType.INT64

    def const(v, dt):
        return op.Constant(value=ir.tensor(v, dtype=dt))

    def ints(v):
        return const(list(v), I64)

    # ---- .item() ------------------------------------------------------------------------------

    def local_scalar_dense(self: TTensor) -> TTensor:
        # eager: tensor.item() is a Python number read at run time, and no gradient flows
        # through it. torchlib's rule reads the value (per call, as eager) but leaves it
        # differentiable, so the engine would send a gradient into the tensor it came from.
        # The translator types a Python float as FLOAT: fp32/fp16/bf16 values are exact there;
        # a float64 value is refused by _CHECKS unless it only feeds a tensor op (scalar_tensor,
        # which casts it to that op's dtype), where it stays DOUBLE.
        x = op.Gather(op.Reshape(self, ints([-1])), const(0, I64), axis=0)
        dt = self.dtype
        if dt.is_floating_point():
            if dt not in (ir.DataType.FLOAT, ir.DataType.DOUBLE):
                x = op.Cast(x, to=ir.DataType.FLOAT)
            return stop_gradient(x)
        return op.Cast(x, to=ir.DataType.BOOL if dt == ir.DataType.BOOL else I64)

    # ---- scatter_add ---------------------------------------------------------------------------

    def scatter_add(self: TReal, dim: int, index: TInt, src: TReal) -> TReal:
        # eager (scatter_add): self[..index[p]..] += src[p] for every position p of index, src
        # may be larger than index (only its index-shaped corner is read); ONNX's
        # ScatterElements wants updates of index's shape, so src is sliced to it (a no-op when
        # they agree). Repeated indices add (reduction add), as eager.
        rank = len(index.shape)
        src = op.Slice(src, ints([0] * rank), op.Shape(index), ints(range(rank)))
        return op.ScatterElements(self, index, src, axis=dim, reduction="add")

    # ---- log_sigmoid ---------------------------------------------------------------------------

    def log_sigmoid(self: TFloat) -> TFloat:
        # eager (log_sigmoid CPU kernel): min(x, 0) - log1p(exp(-|x|)); torchlib's Log(Sigmoid(x))
        # is -inf where sigmoid underflows (x < -104 in fp32) and is a local function. The
        # engine's Softplus(z) is z + log1p(exp(-z)) for z > 0, log1p(exp(z)) otherwise: at
        # z = -x exactly eager's two branches; its gradient sigmoid(-x) is eager's.
        return op.Neg(op.Softplus(op.Neg(self)))

    # ---- var / std -----------------------------------------------------------------------------

    def prims_var(inp: TFloat, dims: Optional[Sequence[int]], correction: float = 1.0,
                  output_dtype: Optional[int] = None) -> TFloat:
        # every var/std/var_mean/std_mean decomposes to prims.var. eager: the sum of squared
        # deviations from the mean over dims, divided by max(0, N - correction) (N the number
        # of elements reduced: 0/0 is NaN, x/0 inf, as eager). torchlib's rule divides by
        # N - correction (negative variance for N < correction) and cannot take dims=None.
        # The mean is a stopped value: eager's backward is 2 (x - mean) dy / (N - correction),
        # without the (mathematically zero) path through the mean, which at N == correction
        # would be inf * 0. Left: for N < correction (forward inf) eager's gradient divides by
        # the negative N - correction, this one by 0.
        rank = len(inp.shape)
        if dims is None or len(dims) == 0:
            axes = list(range(rank))
        else:
            axes = sorted(d % rank if rank else d for d in dims)
        c = 1.0 if correction is None else float(correction)
        dt = inp.dtype
        if not axes:    # a 0-d input: N = 1
            mean, n = inp, const(1.0, dt)
            d = op.Sub(inp, mean)
            ss = op.Mul(d, d)
        else:
            ax = ints(axes)
            mean = stop_gradient(op.ReduceMean(inp, ax, keepdims=1))
            d = op.Sub(inp, mean)
            ss = op.ReduceSum(op.Mul(d, d), ax, keepdims=0)
            n = op.Cast(op.ReduceProd(op.Gather(op.Shape(inp), ax, axis=0), keepdims=0), to=dt)
        denom = op.Max(op.Sub(n, const(c, dt)), const(0.0, dt))
        var = op.Div(ss, denom)
        if output_dtype is not None and output_dtype != -1 and output_dtype != dt:
            var = op.Cast(var, to=output_dtype)
        return var

    # ---- index_put -----------------------------------------------------------------------------

    def index_put(self: TReal, indices: Sequence[Optional[TTensor]], values: TReal,
                  accumulate: bool = False) -> TReal:
        # integer indices: torchlib's rule (ScatterND; accumulate: repeated indices add, as
        # eager; otherwise the engine lets the last write win, eager's deterministic order;
        # negative indices wrap). A boolean mask: torchlib's needs NonZero, which the engine
        # lacks; one mask on the leading dims with a single value (x[mask] = v, x[mask] += v,
        # what _CHECKS lets through) is a Where, whose gradients are eager's: v gets the sum of
        # dy over the selected positions, x gets dy where it was kept (accumulate: everywhere).
        if any(i is not None and i.dtype == ir.DataType.BOOL for i in indices):
            mask = indices[0]
            for _ in range(len(self.shape) - len(mask.shape)):
                mask = op.Unsqueeze(mask, ints([-1]))
            mask = op.Expand(mask, op.Shape(self))
            v = op.Reshape(values, ints([]))
            if values.dtype != self.dtype:
                v = op.Cast(v, to=self.dtype)
            if accumulate:
                return op.Add(self, op.Where(mask, v, const(0, self.dtype)))
            return op.Where(mask, v, self)
        return tl_core.aten_index_put(self, indices, values, accumulate)

    def copy(self: TTensor, src: TTensor, non_blocking: bool = False) -> TTensor:
        # eager: self's shape and dtype, src broadcast to it (x[1:-1, -2:] = row); torchlib's
        # CastLike keeps src's shape. self's values are overwritten: it gets no gradient.
        if src.dtype != self.dtype:
            src = op.Cast(src, to=self.dtype)
        return op.Expand(src, op.Shape(self))

    # ---- conv3d, avg_pool with divisor_override ----------------------------------------------

    def conv3d(input: TFloat, weight: TFloat, bias: Optional[TFloat] = None, stride: Sequence[int] = (1, 1, 1),
               padding: Sequence[int] = (0, 0, 0), dilation: Sequence[int] = (1, 1, 1), groups: int = 1) -> TFloat:
        # torchlib's conv3d builds a (M, 2) zero bias when there is none (its complex form's),
        # which Conv refuses; the rest is its rule (torch's symmetric pads per dim, strides,
        # dilations, groups; an unbatched input unsqueezed). Without a bias: Conv without B.
        def three(v):
            v = list(v) if isinstance(v, (list, tuple)) else [v]
            return v * 3 if len(v) == 1 else v
        padding = three(padding)
        return tl_core._aten_convolution_onnx(input, weight, bias, transposed=False, strides=three(stride),
                                              pads=[*padding, *padding], dilations=three(dilation), groups=groups)

    def avg_pool(rank):
        torchlib = {2: tl_nn.aten_avg_pool2d, 3: tl_nn.aten_avg_pool3d}[rank]

        def avg_pool_nd(self: TFloat, kernel_size: Sequence[int], stride: Sequence[int] = (),
                        padding: Sequence[int] = (0,) * rank, ceil_mode: bool = False,
                        count_include_pad: bool = True, divisor_override: Optional[int] = None) -> TFloat:
            # eager: with divisor_override d, each window's sum over the zero-padded input
            # divided by d (count_include_pad is then unused); torchlib drops d. Without
            # ceil_mode every window lies inside the padded input, so its sum is the
            # count_include_pad average times prod(kernel): the result is that times
            # prod(kernel) / d. ceil_mode with d is refused by _CHECKS (a window hanging past
            # the padding has fewer taps).
            if divisor_override is None:
                return torchlib(self, kernel_size, stride, padding, ceil_mode, count_include_pad)
            avg = torchlib(self, kernel_size, stride, padding, False, True)
            k = list(kernel_size) if isinstance(kernel_size, (list, tuple)) else [kernel_size]
            taps = 1
            for v in (k * rank if len(k) == 1 else k):
                taps *= int(v)
            return op.Mul(avg, const(taps / float(divisor_override), self.dtype))
        return avg_pool_nd

    # ---- adaptive average pooling --------------------------------------------------------------

    def adaptive_avg_pool(rank):
        def adaptive_avg_pool_nd(self: TFloat, output_size: Sequence[int]) -> TFloat:
            # eager: output i along a dim of size L averages input [floor(i L / O), ceil((i+1) L / O))
            # (windows of uneven size that may overlap); torchlib has no rule. A window's box is the
            # product of its per-dim ranges and its count the product of their lengths, so the
            # pooling is separable: per spatial dim, a MatMul by the (L, O) matrix whose column i
            # is 1/len_i over window i, 0 elsewhere. L is read from the input's shape (it may vary
            # between calls), so the matrix is built in the graph from integers: no gradient flows
            # into it, and x's is eager's (each input gets dy_i / len_i from every window it is in).
            r = len(self.shape)
            y = self
            for k in range(rank):
                axis = r - rank + k
                if not isinstance(output_size[k], int):
                    continue            # the input's own size (_CHECKS): windows of one, the identity
                out = int(output_size[k])
                size = op.Gather(op.Shape(self), const(axis, I64), axis=0)             # L, a scalar
                i = ints(range(out))
                lo = op.Div(op.Mul(i, size), const(out, I64))                          # floor(i L / O)
                hi = op.Div(op.Add(op.Mul(op.Add(i, const(1, I64)), size), const(out - 1, I64)),
                            const(out, I64))                                           # ceil((i+1) L / O)
                j = op.Unsqueeze(op.Range(const(0, I64), size, const(1, I64)), ints([1]))   # (L, 1)
                inside = op.And(op.GreaterOrEqual(j, lo), op.Less(j, hi))              # (L, O)
                mat = op.Div(op.Cast(inside, to=self.dtype), op.Cast(op.Sub(hi, lo), to=self.dtype))
                if axis == r - 1:
                    y = op.MatMul(y, mat)
                else:
                    perm = list(range(r))
                    perm[axis], perm[-1] = perm[-1], perm[axis]
                    y = op.Transpose(op.MatMul(op.Transpose(y, perm=perm), mat), perm=perm)
            return y
        return adaptive_avg_pool_nd

    def window_bounds(size, i, out):
        # eager's adaptive window i of O along a dim of size L: [floor(i L / O), ceil((i+1) L / O))
        lo = op.Div(op.Mul(const(i, I64), size), const(out, I64))
        hi = op.Div(op.Add(op.Mul(const(i + 1, I64), size), const(out - 1, I64)), const(out, I64))
        return lo, hi

    def eager_argmax(x, axis):
        # the index eager's max-pool kernels keep (val > max || isnan(val)): the first maximum, or
        # the last NaN; ArgMax keeps the first NaN, with select_last_index the last NaN but also
        # the last maximum
        first = op.ArgMax(x, axis=axis, keepdims=1, select_last_index=0)
        last = op.ArgMax(x, axis=axis, keepdims=1, select_last_index=1)
        return op.Where(op.IsNaN(op.GatherElements(x, first, axis=axis)), last, first)

    def adaptive_max_pool(rank):
        def adaptive_max_pool_nd(self: TFloat, output_size: Sequence[int]) -> Tuple[TFloat, TInt]:
            # eager: output i takes the max over its adaptive window (window_bounds per dim, a
            # box), the first maximum in row-major order or the last NaN, and sends its gradient
            # to that one element; the index is flat over the (spatial) plane. torchlib has no
            # rule. One dim at a time, innermost first: per window a Slice (bounds from the
            # input's shape, which may vary between calls), eager_argmax and GatherElements;
            # nested over the dims that is the box's first maximum (last NaN) in row-major order.
            # The indices along the dims already reduced are carried with the values.
            r = len(self.shape)
            vals, idx = self, {}                # spatial dim -> index along it, shaped as vals
            sizes = {}
            for k in reversed(range(rank)):
                axis = r - rank + k
                size = op.Gather(op.Shape(self), ints([axis]), axis=0)          # (1,)
                sizes[k] = size
                if not isinstance(output_size[k], int):
                    # the input's own size (_CHECKS): windows of one element
                    shape = [1] * r
                    shape[axis] = -1
                    rng = op.Reshape(op.Range(const(0, I64), op.Squeeze(size), const(1, I64)), ints(shape))
                    idx[k] = op.Expand(rng, op.Shape(vals))
                    continue
                out = int(output_size[k])
                pv, pi = [], {b: [] for b in list(idx) + [k]}
                for i in range(out):
                    lo, hi = window_bounds(size, i, out)
                    win = op.Slice(vals, lo, hi, ints([axis]))
                    a = eager_argmax(win, axis)
                    pv.append(op.GatherElements(win, a, axis=axis))
                    for b, ib in idx.items():
                        pi[b].append(op.GatherElements(op.Slice(ib, lo, hi, ints([axis])), a, axis=axis))
                    pi[k].append(op.Add(a, lo))
                vals = op.Concat(*pv, axis=axis) if len(pv) > 1 else pv[0]
                idx = {b: (op.Concat(*p, axis=axis) if len(p) > 1 else p[0]) for b, p in pi.items()}
            flat = idx[0]
            for k in range(1, rank):            # row-major over the plane
                flat = op.Add(op.Mul(flat, sizes[k]), idx[k])
            return vals, flat
        return adaptive_max_pool_nd

    # ---- fractional max pooling ------------------------------------------------------------
    # The TorchScript path's rule (ortmod/_export_nn.py), in onnxscript.

    sample_of_dim = {2: (1, 0), 3: (0, 1, 2)}    # which entry of a plane's samples places dim d

    def fractional_starts(samples, d, rank, length_k, o, dtype):
        # window starts along spatial dim d for every plane, (N, C, o) int64, as eager's
        # generate_intervals computes them in the input's dtype: alpha = float(L - k) / (o - 1);
        # start j = int((j + u) alpha) - int(u alpha) for j < o - 1 (floor: every term >= 0); the
        # last window starts at L - k
        u = op.Unsqueeze(op.Gather(samples, const(sample_of_dim[rank][d], I64), axis=2), ints([2]))   # (N, C, 1)
        last = op.Expand(op.Reshape(length_k, ints([1, 1, 1])), op.Shape(u))
        if o == 1:
            return last
        alpha = op.Div(op.Cast(length_k, to=dtype), const(float(o - 1), dtype))
        j = const([float(v) for v in range(o - 1)], dtype)
        first = op.Floor(op.Mul(op.Add(u, j), alpha))
        shift = op.Floor(op.Mul(u, alpha))
        return op.Concat(op.Cast(op.Sub(first, shift), to=I64), last, axis=2)

    def fractional_max_pool(rank):
        def fractional_max_pool_nd(self: TFloat, kernel_size: Sequence[int], output_size: Sequence[int],
                                   random_samples: TFloat) -> Tuple[TFloat, TInt]:
            # eager (FractionalMaxPool{2,3}d.cpp): each output is the max of its window (NaN wins,
            # else the first max in row-major order), its gradient to that one tap; torchlib has
            # no rule. The taps are gathered into a tensor where every window is one k1 x k2 (x k3)
            # block (GatherElements over the flattened plane: overlapping windows' gradients add,
            # as eager's), then MaxPool with kernel = stride = k scans each block in eager's order;
            # its Indices map back through the tap table to eager's flat index in the plane.
            # _CHECKS: the samples are a tensor of the module, in the input's dtype.
            k, o = [int(v) for v in kernel_size], [int(v) for v in output_size]
            unbatched = len(self.shape) == rank + 1
            x = op.Unsqueeze(self, ints([0])) if unbatched else self
            shape = op.Shape(x)
            nc = op.Slice(shape, ints([0]), ints([2]))
            # eager reads the samples of plane (n, c) and ignores any beyond the input's (an
            # unbatched input takes batch entry 0)
            samples = op.Slice(random_samples, ints([0, 0]), nc, ints([0, 1]))
            lengths = [op.Gather(shape, ints([2 + d]), axis=0) for d in range(rank)]
            table, stride = None, ints([1])
            for d in reversed(range(rank)):     # tap (n, c, o1, p1, ..., ok, pk) -> flat index in its plane
                starts = fractional_starts(samples, d, rank, op.Sub(lengths[d], ints([k[d]])), o[d], self.dtype)
                spread = [a for a in range(2, 2 + 2 * rank) if a != 2 + 2 * d]
                taps = [1] * (2 * rank)
                taps[2 * d + 1] = k[d]
                offsets = op.Constant(value=ir.tensor(torch.arange(k[d]).reshape([1, 1] + taps).numpy()))
                term = op.Mul(op.Add(op.Unsqueeze(starts, ints(spread)), offsets), stride)
                table = term if table is None else op.Add(term, table)
                stride = op.Mul(stride, lengths[d])
            flat = op.Reshape(x, ints([0, 0, -1]))
            table = op.Reshape(table, ints([0, 0, -1]))
            gathered = op.GatherElements(flat, table, axis=2)
            gathered = op.Reshape(gathered, op.Concat(nc, ints([a * b for a, b in zip(o, k)]), axis=0))
            y, idx = op.MaxPool(gathered, kernel_shape=k, strides=k)
            idx = op.Gather(op.Reshape(table, ints([-1])), idx, axis=0)
            if unbatched:
                y, idx = op.Squeeze(y, ints([0])), op.Squeeze(idx, ints([0]))
            return y, idx
        return fractional_max_pool_nd

    # ---- circular padding with a negative pad ------------------------------------------------

    def pad(self: TTensor, pad: Sequence[int], mode: str = "constant", value: Optional[float] = None) -> TTensor:
        # eager's circular padding crops by the negative pads first, then wraps from the cropped
        # tensor ([0,1,2,3] padded (-1, 2) is [1,2,3,1,2]); ONNX's wrap reads from the uncropped
        # one ([1,2,3,0,1]). So: a constant Pad by the negative parts (a crop), then the wrap by
        # the positive ones. Every other mode crops and pads from the same input: torchlib's rule.
        if mode != "circular" or all(p >= 0 for p in pad):
            return tl_nn.aten_pad(self, pad, mode, value)
        rank = len(self.shape)
        cropped = op.Pad(self, tl_nn._process_padding([min(p, 0) for p in pad], rank), mode="constant")
        return op.Pad(cropped, tl_nn._process_padding([max(p, 0) for p in pad], rank), mode="wrap")

    return {
        torch.ops.aten.conv3d.default: conv3d,
        torch.ops.aten.pad.default: pad,
        torch.ops.aten.fractional_max_pool2d.default: fractional_max_pool(2),
        torch.ops.aten.fractional_max_pool3d.default: fractional_max_pool(3),
        torch.ops.aten.adaptive_max_pool2d.default: adaptive_max_pool(2),
        torch.ops.aten.adaptive_max_pool3d.default: adaptive_max_pool(3),
        torch.ops.aten.adaptive_avg_pool1d.default: adaptive_avg_pool(1),
        torch.ops.aten.adaptive_avg_pool2d.default: adaptive_avg_pool(2),
        torch.ops.aten.adaptive_avg_pool3d.default: adaptive_avg_pool(3),
        torch.ops.aten.avg_pool2d.default: avg_pool(2),
        torch.ops.aten.avg_pool3d.default: avg_pool(3),
        torch.ops.aten.copy.default: copy,
        torch.ops.aten.index_put.default: index_put,
        torch.ops.aten._local_scalar_dense.default: local_scalar_dense,
        torch.ops.aten.scatter_add.default: scatter_add,
        torch.ops.aten.log_sigmoid.default: log_sigmoid,
        torch.ops.prims.var.default: prims_var,
    }


def zoo_translations(op, ir, stop_gradient):
    """The rules the model zoo needs on this path (issue 16): numbers made tensors (scalar_tensor),
    where and fill with a number, fill with a tensor, ceil of ints, hardtanh and relu6, remainder,
    baddbmm, and view_copy (what ``_capture_export._views_to_view_copies`` makes of a view)."""
    from typing import Sequence
    import onnx
    import onnxscript
    from onnxscript.function_libs.torch_lib.tensor_typing import TFloat, TReal, TTensor
    from onnxscript.function_libs.torch_lib.ops import core as tl_core
    from onnxscript.onnx_types import INT64

    def const(v, dt):
        return op.Constant(value=ir.tensor(v, dtype=dt))

    def number(v):
        # a Python number as a constant of its own kind: an int64 beyond 2**53 stays exact
        if isinstance(v, bool):
            return const(v, ir.DataType.BOOL)
        if isinstance(v, int):
            return const(v, ir.DataType.INT64)
        return const(float(v), ir.DataType.DOUBLE)

    def scalar_as(value, dt):
        # a Python number in dtype dt as eager converts a Scalar (an int64 or a double) to a
        # tensor's dtype: from its own kind (an int64 beyond 2**53 exact, a float from its
        # double, not through float32 as the translator types a number), Cast: rounded to nearest
        # for floats, truncated for ints, nonzero for bool
        v = number(value)
        kind = ir.DataType.BOOL if isinstance(value, bool) else \
            ir.DataType.INT64 if isinstance(value, int) else ir.DataType.DOUBLE
        return v if kind == dt else op.Cast(v, to=dt)

    # ---- view_copy -----------------------------------------------------------------------------

    def view_copy(self: TTensor, size: Sequence[INT64]) -> TTensor:
        # torchlib's view rule (Reshape with allowzero: a 0 in size is a dim of size 0, as in
        # eager); its view_copy rule omits allowzero, where 0 would copy the input's dim
        return tl_core.aten_view(self, size)

    # ---- fill ----------------------------------------------------------------------------------

    def fill_tensor(self: TTensor, value: TTensor) -> TTensor:
        # eager: self's shape and dtype, every element value (a 0-d tensor) converted to self's
        # dtype; the gradient is zeros for self and grad.sum() for value: Expand's. torchlib's
        # rule is an ONNX local function, which the engine does not take.
        if value.dtype != self.dtype:
            value = op.Cast(value, to=self.dtype)
        return op.Expand(value, op.Shape(self))

    def fill_scalar(self: TTensor, value: float) -> TTensor:
        return op.Expand(scalar_as(value, self.dtype), op.Shape(self))

    # ---- numbers the type-promotion pass makes tensors ------------------------------------------

    def scalar_tensor(s: int, dtype: int = ir.DataType.FLOAT, layout: str = "", device: str = "",
                      pin_memory: bool = False) -> TTensor:
        # The type-promotion pass turns every number operand (x * 0.1, where(m, x, 0.1), ...) into
        # scalar_tensor(number, dtype=the op's dtype). torchlib's rule takes s as a tensor input,
        # so the translator first makes a Python float a float32 constant, then Casts it: 0.1 in
        # a float64 graph is 0.10000000149. Here s is an attribute, passed through as it is (typed
        # int: a float attribute would make an int a float, inexact beyond 2**53), and made a
        # constant of dtype from its own kind (scalar_as); a symbolic number (a size, .item())
        # arrives as a graph value and is Cast, as torchlib does.
        dt = ir.DataType.FLOAT if dtype is None or dtype == -1 else ir.DataType(dtype)
        if isinstance(s, (bool, int, float)):
            return scalar_as(s, dt)
        return s if s.dtype == dt else op.Cast(s, to=dt)

    # ---- where with a number ----------------------------------------------------------------

    def where_scalar_other(condition: TTensor, self: TTensor, other: float) -> TTensor:
        # eager: the number converted to the tensor operand's dtype (the type-promotion pass has
        # made that the result's: an int tensor with a float number is cast to float first).
        # torchlib's rule is Where too, but its number reaches the graph as a float32 constant:
        # where(m, x, 0.1) in float64 would be 0.10000000149.
        return op.Where(condition, self, scalar_as(other, self.dtype))

    def where_scalar_self(condition: TTensor, self: float, other: TTensor) -> TTensor:
        return op.Where(condition, scalar_as(self, other.dtype), other)

    # ---- ceil ----------------------------------------------------------------------------------

    def ceil(self: TReal) -> TReal:
        # eager: Ceil of a float (NaN, +-inf, -0.0 kept; gradient 0, the engine's); an integer
        # tensor is its own ceiling (eager returns a copy), where torchlib's Ceil of an int the
        # engine refuses
        if self.dtype.is_floating_point():
            return op.Ceil(self)
        return op.Identity(self)

    # ---- hardtanh ------------------------------------------------------------------------------

    hard_tanh_schema = onnx.defs.OpSchema(
        "HardTanh", "ortmod", 1, doc="Clip's forward, hardtanh's gradient (the engine's op)",
        inputs=[onnx.defs.OpSchema.FormalParameter("x", "T"), onnx.defs.OpSchema.FormalParameter("min", "T"),
                onnx.defs.OpSchema.FormalParameter("max", "T")],
        outputs=[onnx.defs.OpSchema.FormalParameter("y", "T")],
        type_constraints=[("T", [f"tensor({t})" for t in ("float", "double", "float16", "bfloat16")], "")])
    hard_tanh_op = onnxscript.values.Op(onnxscript.values.Opset("ortmod", 1), "HardTanh", hard_tanh_schema)

    def hardtanh(self: TReal, min_val: float = -1.0, max_val: float = 1.0) -> TReal:
        # eager: clamp's forward (NaN stays NaN), hardtanh_backward's gradient: 0 where x <= min
        # or x >= max, else dy; torchlib's Clip has clamp's gradient (dy at the bounds). At NaN
        # eager's own kernels disagree (the scalar one gives dy, the vectorized one 0); the
        # engine's is the scalar's, as on the TorchScript path, whose engine op this is
        # (_semantics._hardtanh_symbolic). The bounds in self's dtype, as eager's kernel
        # converts them (an integer tensor's bounds truncated: hardtanh(x, -0.5, 3.5) is
        # clamp(x, 0, 3)).
        dt = self.dtype
        if dt.is_floating_point():
            return hard_tanh_op(self, const(float(min_val), dt), const(float(max_val), dt))
        return op.Clip(self, const(int(min_val), dt), const(int(max_val), dt))

    def relu6(self: TReal) -> TReal:
        # eager's relu6 is hardtanh(x, 0, 6), its gradient 0 at 0 and 6 (torchlib's Clip: dy)
        return hardtanh(self, 0.0, 6.0)

    # ---- remainder by a number -----------------------------------------------------------------

    def remainder_scalar(self: TReal, other: float) -> TReal:
        # eager (BinaryOpsKernel.cpp): r = fmod(a, b), plus b where r != 0 and r, b differ in
        # sign (floats), the same on a % b for ints. torchlib's float rule a - floor(a / b) * b
        # rounds differently (a / b and the product are rounded; far from 0 it is off by ulps of
        # a, and it can give b itself where eager gives 0 or a tiny r). The engine's
        # Mod(fmod=0) is eager's formula (csrc/ops/elementwise.c: mod_floor_*), in self's
        # dtype. The divisor is a number (no gradient); self's gradient is dy, as eager's.
        # The type-promotion pass makes a float remainder by a number remainder.Tensor (the
        # number a scalar_tensor) and an int tensor by a float number a float one.
        return op.Mod(self, scalar_as(other, self.dtype), fmod=0)

    def remainder_tensor(self: TReal, other: TReal) -> TReal:
        # as remainder_scalar, broadcast (one dtype after the type-promotion pass). eager's
        # divisor gradient, -dy * floor(self / other), the engine's Mod does not have: it
        # refuses by name a graph that needs it (csrc/ops/elementwise.c: mod_grad).
        return op.Mod(self, other, fmod=0)

    # ---- baddbmm -------------------------------------------------------------------------------

    def baddbmm(self: TReal, batch1: TReal, batch2: TReal, beta: float = 1.0, alpha: float = 1.0) -> TReal:
        # eager: beta * self + alpha * (batch1 @ batch2), and with beta == 0 self is not read
        # (NaN or inf in it does not propagate) but still gets a gradient, zeros (grad * beta);
        # torchlib's rule multiplies self by 0. Here Where(true, product, self): self's values
        # are not read, its gradient is the zeros Where gives the side not taken. alpha and
        # beta in self's dtype (a double stays exact for float64; torchlib's CastLike of a
        # float32 constant would round 0.1). alpha == 0 is refused by _CHECKS: eager's result
        # there depends on its kernel (BLAS skips the product, the small-matrix loop multiplies
        # NaN by 0).
        dt = self.dtype
        out = op.MatMul(batch1, batch2)
        if alpha != 1:
            out = op.Mul(out, const(alpha, dt))
        if beta == 0:
            return op.Where(const(True, ir.DataType.BOOL), out, self)
        return op.Add(out, self if beta == 1 else op.Mul(self, const(beta, dt)))

    return {
        torch.ops.aten.view_copy.default: view_copy,
        torch.ops.aten.scalar_tensor.default: scalar_tensor,
        torch.ops.aten.where.ScalarOther: where_scalar_other,
        torch.ops.aten.where.ScalarSelf: where_scalar_self,
        torch.ops.aten.fill.Tensor: fill_tensor,
        torch.ops.aten.fill.Scalar: fill_scalar,
        torch.ops.aten.ceil.default: ceil,
        torch.ops.aten.hardtanh.default: hardtanh,
        torch.ops.aten.remainder.Scalar: remainder_scalar,
        torch.ops.aten.remainder.Tensor: remainder_tensor,
        torch.ops.aten.relu6.default: relu6,
        torch.ops.aten.baddbmm.default: baddbmm,
    }
