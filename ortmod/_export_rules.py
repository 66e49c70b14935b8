"""ortmod's translations of aten ops for the torch.export capture path, where torchlib's rule
(onnxscript's torch_lib, the translator torch ships) does not mean what eager training means, or
is an ONNX local function the engine does not take. Each is read against eager's kernel and its
backward (derivatives.yaml) for every argument; arguments a rule cannot honour are refused by
name in ``_capture_export._CHECKS`` before translation.

``translations(op, ir, stop_gradient)`` returns {aten overload: onnxscript function}; the
functions are traced by torch's exporter (trace mode: Python branches on the arguments)."""
import torch


def unbatched_nll_loss_forward(gm):
    """In the exported program, before decomposition: an unbatched ``nll_loss_nd`` (input (C,),
    target 0-d) becomes ``nll_loss_forward(...)[0]``, which takes that form itself (torchlib's
    rule is its nll_loss rule, REVIEWED). Decomposition would re-trace nll_loss_nd with torch's
    reference implementation, whose unbatched branch indexes the input with the target's value
    (a data-dependent size torch.export cannot guard on); batching it by hand instead meets a
    size-oblivious re-trace that drops the batch dim of one. Returns the count."""
    import operator
    count = 0
    nll = torch.ops.aten.nll_loss_nd.default
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not nll:
            continue
        x = node.args[0]
        val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor) or val.dim() != 1:
            continue
        names = ("self", "target", "weight", "reduction", "ignore_index")
        bound = dict(zip(names, node.args), **node.kwargs)
        args = (bound["self"], bound["target"], bound.get("weight"), bound.get("reduction", 1),
                bound.get("ignore_index", -100))
        out = node.meta.get("val")
        with gm.graph.inserting_before(node):
            forward = gm.graph.call_function(torch.ops.aten.nll_loss_forward.default, args)
        if isinstance(out, torch.Tensor):
            forward.meta["val"] = (out, out.new_empty(()))
        # the node itself becomes the loss: its name (which the graph signature's outputs
        # name) and users stay
        node.target, node.args, node.kwargs = operator.getitem, (forward, 0), {}
        count += 1
    if count:
        gm.recompile()
    return count


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

    # ---- activations and elementwise losses (issue 16, helper "act") ---------------------------
    # The TorchScript path's reasoning (ortmod/_semantics.py, _export_losses.py): the engine's
    # activation ops (csrc/ops/misc.c) compute eager's forward and eager's backward, a select
    # where torch selects; where eager's backward is not the derivative of its forward, the
    # forward is a stopped value plus gradient terms that are exactly 0 forward.

    def grad_term(x, grad, dt=None):
        # Pow(1 + (x - StopGradient(x)), StopGradient(grad)) - 1: 0 forward (1^y is 1 for every
        # y, inf and NaN too), gradient ``grad`` with respect to x (Pow's b * a^(b - 1) at a = 1),
        # also where ``grad`` is infinite or NaN (_export_losses._grad_term). An infinite x would
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

    def selu(self: TFloat) -> TFloat:
        # the engine's Selu: eager's elu(x, SELU alpha, SELU scale) and its backward (x <= 0 takes
        # the exponential branch, NaN the linear one); torchlib's is a local function. Its
        # constants are float32: a float64 input takes them as float64 (elu_coefficient).
        if self.dtype != ir.DataType.DOUBLE:
            return op.Selu(self)
        alpha, scale = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
        return elu_coefficient(self, alpha * scale, scale)

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

    def nll_loss_nd(self: TFloat, target: TInt, weight: Optional[TFloat] = None, reduction: int = 1,
                    ignore_index: int = -100) -> TFloat:
        # F.nll_loss traces to nll_loss_nd, which torch decomposes into nll_loss for (N, C) but
        # for (N, C, d1..dk) into a gather/where form. torchlib's nll_loss rule
        # (NegativeLogLikelihoodLoss, which takes every rank) means what eager means there
        # (REVIEWED: aten::nll_loss); unbatched ones are nll_loss_forward by then
        # (unbatched_nll_loss_forward).
        return tl_nn.aten_nll_loss(self, target, weight, reduction, ignore_index)

    def binary_cross_entropy(self: TFloat, target: TFloat, weight: Optional[TFloat] = None,
                             reduction: int = 1) -> TFloat:
        # eager (Loss.cpp): w ((t - 1) max(log1p(-x), -100) - t max(log(x), -100)), reduced.
        # Its backward is not the clamped forward's derivative: input dy w (x - t) /
        # max((1 - x) x, 1e-12), target dy w (-logit(x)); both given exactly as gradient terms
        # on a stopped forward (the TorchScript path's rule, _export_losses). Registering it
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
        # activations and elementwise losses (issue 16, helper "act")
        torch.ops.aten.leaky_relu.default: leaky_relu,
        torch.ops.aten.elu.default: elu,
        torch.ops.aten.hardsigmoid.default: hardsigmoid,
        torch.ops.aten.softplus.default: softplus,
        torch.ops.aten.celu.default: celu,
        torch.ops.aten.selu.default: selu,
        torch.ops.aten.hardswish.default: hardswish,
        torch.ops.aten.mish.default: mish,
        torch.ops.aten.glu.default: glu,
        torch.ops.aten.log1p.default: log1p,
        torch.ops.aten.xlogy.Tensor: xlogy,
        torch.ops.aten.binary_cross_entropy.default: binary_cross_entropy,
        torch.ops.aten.soft_margin_loss.default: soft_margin_loss,
        torch.ops.aten.nll_loss_nd.default: nll_loss_nd,
    }
