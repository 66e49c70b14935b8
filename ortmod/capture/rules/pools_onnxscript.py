"""The torch.export path's rules for conv3d, avg_pool with divisor_override, adaptive and fractional
pooling, circular padding: onnxscript functions traced by torch's exporter where torchlib's
translation does not mean what eager training means.

Each function below is handed the opset ``op``, ``onnx_ir`` as ``ir`` and the engine's stop-gradient
op, and returns {aten op: rule} for the rules that share its helpers; ``translations`` is their
union, which ``capture.export_registry`` adds to torchlib's registry."""
import torch


def pools_1(op, ir, stop_gradient):
    from typing import Optional, Sequence
    from onnxscript.function_libs.torch_lib.tensor_typing import TFloat
    from onnxscript.function_libs.torch_lib.ops import core as tl_core
    from onnxscript.function_libs.torch_lib.ops import nn as tl_nn

    I64 = ir.DataType.INT64

    def const(v, dt):
        return op.Constant(value=ir.tensor(v, dtype=dt))

    def ints(v):
        return const(list(v), I64)

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
            if r == rank + 2 and all(isinstance(o, int) and o == 1 for o in output_size):
                # one window over each whole plane: the engine's GlobalAveragePool, as the
                # TorchScript path exports it (the same sums, and the ResNet pooling's speed)
                return op.GlobalAveragePool(self)
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

    return {
        torch.ops.aten.conv3d.default: conv3d,
        torch.ops.aten.adaptive_avg_pool1d.default: adaptive_avg_pool(1),
        torch.ops.aten.adaptive_avg_pool2d.default: adaptive_avg_pool(2),
        torch.ops.aten.adaptive_avg_pool3d.default: adaptive_avg_pool(3),
        torch.ops.aten.avg_pool2d.default: avg_pool(2),
        torch.ops.aten.avg_pool3d.default: avg_pool(3),
    }


def pools_2(op, ir, stop_gradient):
    from typing import Sequence, Tuple
    from onnxscript.function_libs.torch_lib.tensor_typing import TFloat, TInt

    I64 = ir.DataType.INT64

    def const(v, dt):
        return op.Constant(value=ir.tensor(v, dtype=dt))

    def ints(v):
        return const(list(v), I64)

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

    return {
        torch.ops.aten.adaptive_max_pool2d.default: adaptive_max_pool(2),
        torch.ops.aten.adaptive_max_pool3d.default: adaptive_max_pool(3),
    }


def pools_3(op, ir, stop_gradient):
    from typing import Optional, Sequence, Tuple
    from onnxscript.function_libs.torch_lib.tensor_typing import TFloat, TTensor, TInt
    from onnxscript.function_libs.torch_lib.ops import nn as tl_nn

    I64 = ir.DataType.INT64

    def const(v, dt):
        return op.Constant(value=ir.tensor(v, dtype=dt))

    def ints(v):
        return const(list(v), I64)

    # ---- fractional max pooling ------------------------------------------------------------
    # The TorchScript path's rule (ortmod/capture/rules/nn.py), in onnxscript.

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
        torch.ops.aten.pad.default: pad,
        torch.ops.aten.fractional_max_pool2d.default: fractional_max_pool(2),
        torch.ops.aten.fractional_max_pool3d.default: fractional_max_pool(3),
    }


def translations(op, ir, stop_gradient):
    """{aten op: rule} of this family."""
    return {**pools_1(op, ir, stop_gradient), **pools_2(op, ir, stop_gradient), **pools_3(op, ir, stop_gradient)}
