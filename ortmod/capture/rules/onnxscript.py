"""ortmod's translations of aten ops for the torch.export capture path, where torchlib's rule
(onnxscript's torch_lib, the translator torch ships) does not mean what eager training means, or
is an ONNX local function the engine does not take. Each is read against eager's kernel and its
backward (derivatives.yaml) for every argument; arguments a rule cannot honour are refused by
name in ``_capture_export._CHECKS`` before translation.

``translations(op, ir, stop_gradient)`` returns {aten overload: onnxscript function}; the
functions are traced by torch's exporter (trace mode: Python branches on the arguments)."""
from typing import Optional

import torch


def gather_with_gradient_at(emit, stop_gradient, y, fwd, bwd, same, axis):
    """Gather y along axis at fwd for the value, with the gradient scattered at bwd (nearest
    upsampling's backward computes its own index: see "upsampling" in translations). Shared by
    both capture paths; emit(op_type, *inputs, axis=None) builds one node in the caller's graph,
    same is a bool tensor broadcastable to the result, true where fwd == bwd.

    Where they differ: Gather of the stopped y at fwd plus (y[bwd] - stop(y[bwd])), which is 0
    with gradient 1 at bwd. Left: where y[bwd] is inf or NaN that difference is NaN, so the
    value is the stopped read alone (eager's) and that output's gradient reaches no element,
    where eager's reaches y[bwd]; no op of the engine carries a gradient past such a value."""
    read = emit("Gather", y, fwd, axis=axis)
    at_b = emit("Gather", y, bwd, axis=axis)
    carried = emit("Sub", at_b, stop_gradient(at_b))
    stopped = emit("Gather", stop_gradient(y), fwd, axis=axis)
    moved = emit("Where", emit("IsNaN", carried), stopped, emit("Add", stopped, carried))
    return emit("Where", same, read, moved)


def _unbatched_calls(gm, target, names):
    """(node, its arguments by name) for each call of ``target`` on an unbatched (1-d) input."""
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not target:
            continue
        x = node.args[0]
        val = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
        if isinstance(val, torch.Tensor) and val.dim() == 1:
            yield node, dict(zip(names, node.args), **node.kwargs)


def unbatched_nll_loss_forward(gm):
    """In the exported program, before decomposition: an unbatched ``nll_loss_nd`` (input (C,),
    target 0-d) becomes ``nll_loss_forward(...)[0]``, which takes that form itself (torchlib's
    rule is its nll_loss rule, REVIEWED). Decomposition would re-trace nll_loss_nd with torch's
    reference implementation, whose unbatched branch indexes the input with the target's value
    (a data-dependent size torch.export cannot guard on); batching it by hand instead meets a
    size-oblivious re-trace that drops the batch dim of one. Returns the count."""
    import operator
    count = 0
    names = ("self", "target", "weight", "reduction", "ignore_index")
    for node, bound in _unbatched_calls(gm, torch.ops.aten.nll_loss_nd.default, names):
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


@torch.library.custom_op("ortmod::cross_entropy_loss", mutates_args=())
def cross_entropy_loss(self: torch.Tensor, target: torch.Tensor, weight: Optional[torch.Tensor], reduction: int,
                       ignore_index: int, label_smoothing: float) -> torch.Tensor:
    """``aten.cross_entropy_loss`` kept opaque through decomposition (unbatched_cross_entropy_loss);
    only ever traced: ``translations`` gives it ortmod's cross_entropy rule."""
    return torch.ops.aten.cross_entropy_loss.default(self, target, weight, reduction, ignore_index,
                                                     label_smoothing)


@cross_entropy_loss.register_fake
def _cross_entropy_loss_fake(self, target, weight, reduction, ignore_index, label_smoothing):
    if reduction != 0:
        return self.new_empty(())
    if not target.is_floating_point():              # class targets: one loss per target
        return self.new_empty(target.shape)
    # probability targets (shaped as the input): one loss per position, the class dim gone
    return self.new_empty(self.shape[1:] if self.dim() == 1 else self.shape[:1] + self.shape[2:])


def unbatched_cross_entropy_loss(gm):
    """In the exported program, before decomposition: an unbatched ``cross_entropy_loss`` (input
    (C,)) becomes the opaque ``ortmod::cross_entropy_loss``, which ``translations`` gives the
    rule aten's own op has there (``cross_entropy``: a batch of one, every argument as eager).
    aten's op is kept by decomposition too, yet decomposition runs it on fake tensors for its
    result, through the composite kernel, whose unbatched nll_loss_nd indexes the input with the
    target's value (a data-dependent size torch.export cannot guard on). ``_CHECKS`` refuses the
    arguments eager raises on, as for aten's op. Returns the count."""
    count = 0
    names = ("self", "target", "weight", "reduction", "ignore_index", "label_smoothing")
    for node, bound in _unbatched_calls(gm, torch.ops.aten.cross_entropy_loss.default, names):
        args = (bound["self"], bound["target"], bound.get("weight"), bound.get("reduction", 1),
                bound.get("ignore_index", -100), bound.get("label_smoothing", 0.0))
        if not all(isinstance(a, (int, float)) and not isinstance(a, bool) for a in args[3:]):
            continue        # a symbolic number: left to decomposition (which refuses it by name)
        node.target, node.args, node.kwargs = torch.ops.ortmod.cross_entropy_loss.default, args, {}
        count += 1
    if count:
        gm.recompile()
    return count


@torch.library.custom_op("ortmod::multi_margin_loss", mutates_args=())
def multi_margin_loss(self: torch.Tensor, target: torch.Tensor, p: float, margin: float, weight: Optional[torch.Tensor],
                      reduction: int) -> torch.Tensor:
    """``aten.multi_margin_loss`` kept opaque through decomposition (keep_whole); only ever traced:
    ``translations`` gives it ortmod's rule."""
    return torch.ops.aten.multi_margin_loss.default(self, target, p, margin, weight, reduction)


@multi_margin_loss.register_fake
def _multi_margin_loss_fake(self, target, p, margin, weight, reduction):
    return self.new_empty(target.shape if reduction == 0 else ())


# aten ops that torch decomposes in Python at the Autograd key, whatever the decomposition table
# says, and the opaque op each becomes before decomposition: (aten op, ortmod op, its arguments
# as (name, default, conversion to the ortmod op's type))
_KEPT_WHOLE = [
    (torch.ops.aten.multi_margin_loss.default, torch.ops.ortmod.multi_margin_loss.default,
     (("self", None, None), ("target", None, None), ("p", 1.0, float), ("margin", 1.0, float),
      ("weight", None, None), ("reduction", 1, int))),
]


def keep_whole(gm):
    """In the exported program, before decomposition: each call of a ``_KEPT_WHOLE`` aten op
    becomes its opaque ortmod op, which ``translations`` gives the aten op's rule. Their Python
    decompositions run at the Autograd key while decomposition re-traces, so registering a rule
    does not keep them (multi_margin_loss's gave a gradient at z == 0, where eager's kernel tests
    z > 0). Returns the count."""
    count = 0
    for aten_op, ortmod_op, names in _KEPT_WHOLE:
        for node in list(gm.graph.nodes):
            if node.op != "call_function" or node.target is not aten_op:
                continue
            bound = dict(zip((n for n, _, _ in names), node.args), **node.kwargs)
            args = tuple(bound.get(n, d) for n, d, _ in names)
            if not all(convert is None or isinstance(a, (int, float)) for a, (_, _, convert) in zip(args, names)):
                from ..errors import UnsupportedModelError
                raise UnsupportedModelError(f"{aten_op.name()}: ortmod keeps its numbers only as constants")
            node.target = ortmod_op
            node.args = tuple(a if convert is None else convert(a) for a, (_, _, convert) in zip(args, names))
            node.kwargs = {}
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

    # ---- max / min along a dim, argmax / argmin ----------------------------------------------

    def extremum_dim(arg_op):
        def extremum(self: TReal, dim: int, keepdim: bool = False) -> Tuple[TReal, TInt]:
            # eager (max.dim / min.dim): the index of the first extremum, a NaN counting as the
            # extremum (the first NaN), and the value's gradient to that one element
            # (value_selecting_reduction_backward scatters dy to the index). torchlib's
            # ReduceMax beside ArgMax shares dy among tied maxima. Here the value is read at
            # the engine's ArgMax / ArgMin index (first extremum, first NaN: eager's), so its
            # gradient goes where eager's goes. A 0-d input is its own extremum, index 0.
            if len(self.shape) == 0:
                return op.Identity(self), const(0, I64)
            idx = arg_op(self, axis=dim, keepdims=1, select_last_index=0)
            val = op.GatherElements(self, idx, axis=dim)
            if not keepdim:
                ax = ints([dim])
                val, idx = op.Squeeze(val, ax), op.Squeeze(idx, ax)
            return val, idx
        return extremum

    def arg_extremum(arg_op):
        def arg(self: TReal, dim: Optional[int] = None, keepdim: bool = False) -> TInt:
            # eager: the first extremum's index (the first NaN if any), over the flattened input
            # when dim is None, where keepdim keeps every dim as 1 (torchlib's keeps one). The
            # engine's ArgMax / ArgMin with select_last_index 0 pick eager's element.
            rank = len(self.shape)
            if rank == 0:
                return const(0, I64)
            if dim is None:
                i = arg_op(op.Reshape(self, ints([-1])), axis=0, keepdims=0, select_last_index=0)
                return op.Reshape(i, ints([1] * rank)) if keepdim else i
            return arg_op(self, axis=dim, keepdims=int(bool(keepdim)), select_last_index=0)
        return arg

    # ---- add / sub with alpha --------------------------------------------------------------------

    def add_sub(onnx_op, torchlib_rule, scalar):
        def rule(self: TReal, other: TReal, alpha: float = 1.0) -> TReal:
            # eager: self +- alpha * other, alpha a C++ number converted to the op's dtype.
            # torchlib multiplies by CastLike(alpha) of a FLOAT constant, so a float64 graph took
            # alpha = 0.1 as 0.10000000149011612. Here alpha is a constant in other's dtype from
            # the Python value. Left: eager fuses the multiply-add (one rounding), here it is
            # rounded twice (one ulp apart at most). The type-promotion pass gave self and other
            # one dtype.
            if scalar or not hasattr(other, "dtype"):
                other = const(other, self.dtype)
            if alpha == 1 or self.dtype == ir.DataType.BOOL:
                return torchlib_rule(self, other, alpha=alpha)
            return onnx_op(self, op.Mul(other, const(alpha, self.dtype)))
        return rule

    # ---- p-norms and distances (the TorchScript path's rules, ortmod/capture/tracing.py) -----------

    import math

    def p_norm(x, p, axes, keepdim, dt):
        # linalg_vector_norm of order p over axes, forward and gradient as eager's
        # norm_backward (FunctionsManual.cpp):
        # * p 2 and 1: ReduceL2 (dy x / norm, 0 where the norm is 0), ReduceL1 (dy sgn(x));
        # * p +-inf: ReduceMax / ReduceMin of |x| (ties share dy equally, eager's mask.sum);
        # * p 0: the count of non-zeros, no gradient;
        # * any other p: (sum |x|^p)^(1/p) with eager's masks: 0 where the norm is 0 (p > 0),
        #   where an element is 0 (p < 1: |x|^(p-1) is inf there), and on rows holding a zero
        #   (p < 0: their norm is 0 and eager's norm^(1-p) factor zeroes the row). torchlib's
        #   Pow chain has none of them: its gradient at a zero row is inf * 0 = NaN.
        # A 0-d x is a 1-element vector (eager's dim -1 of a 0-d tensor). dt: x's dtype, which
        # the translator does not always know for an intermediate value.
        if x.shape is not None and len(x.shape) == 0:
            x = op.Reshape(x, ints([1]))
            axes, keepdim = [0], False
        ax, k = ints(axes), int(bool(keepdim))
        if p == 2.0:
            return op.ReduceL2(x, ax, keepdims=k)
        if p == 1.0:
            return op.ReduceL1(x, ax, keepdims=k)
        if math.isinf(p):
            return (op.ReduceMax if p > 0 else op.ReduceMin)(op.Abs(x), ax, keepdims=k)
        zero, one = const(0.0, dt), const(1.0, dt)
        if p == 0.0:
            nonzero = op.Cast(op.Not(op.Equal(x, zero)), to=dt)
            return op.ReduceSum(stop_gradient(nonzero), ax, keepdims=k)
        a = op.Abs(x)
        a_zero = op.Equal(a, zero)
        powed = op.Pow(op.Where(a_zero, one, a), const(p, dt))     # Pow's gradient stays finite at 0
        if p > 0:
            powed = op.Where(a_zero, zero, powed)                     # 0^p = 0, gradient 0
            total = op.ReduceSum(powed, ax, keepdims=k)
            t_zero = op.Equal(total, zero)
            return op.Where(t_zero, zero, op.Pow(op.Where(t_zero, one, total), const(1.0 / p, dt)))
        total = op.ReduceSum(powed, ax, keepdims=k)                   # p < 0: a zero element makes it 0
        has_zero = op.Equal(op.ReduceMin(a, ax, keepdims=k), zero)
        return op.Where(has_zero, zero, op.Pow(op.Where(has_zero, one, total), const(1.0 / p, dt)))

    def vector_norm(self: TFloat, ord: float = 2.0, dim: Optional[Sequence[int]] = None, keepdim: bool = False,
                    dtype: int = -1) -> TFloat:
        # eager: the norm of self (cast to dtype first when given, the gradient through the
        # cast) over dim, every dim when dim is None or empty, keepdim keeping them as 1
        # (torchlib's rule drops keepdim without a dim); p_norm for the order.
        rank = len(self.shape)
        dt = self.dtype
        if dtype is not None and dtype != -1 and dtype != self.dtype:
            dt = ir.DataType(dtype)
            self = op.Cast(self, to=dt)
        if dim is None or len(dim) == 0:
            axes = list(range(rank))
        else:
            axes = [int(d) for d in ([dim] if isinstance(dim, int) else dim)]
        if rank == 0:
            return p_norm(self, float(ord), [0], False, dt)
        return p_norm(self, float(ord), axes, keepdim, dt)

    CDIST_MM_ROWS = 25   # Distance.cpp cdist_impl: p 2 takes the matrix-product path above it

    def euclidean_dist_mm(x1, x2, rank, dt):
        # eager's _euclidean_dist: [-2 x1, |x1|^2, 1] @ [x2, 1, |x2|^2]^T, clamped at 0, sqrt;
        # its backward divides by the result and takes 0 where it is 0 (the Where around Sqrt;
        # Sqrt's own gradient is inf there)
        ax = ints([-1])
        n1 = op.ReduceSum(op.Mul(x1, x1), ax, keepdims=1)
        n2 = op.ReduceSum(op.Mul(x2, x2), ax, keepdims=1)
        one1 = op.Expand(const(1.0, dt), op.Shape(n1))
        one2 = op.Expand(const(1.0, dt), op.Shape(n2))
        a = op.Concat(op.Mul(x1, const(-2.0, dt)), n1, one1, axis=-1)
        b = op.Concat(x2, one2, n2, axis=-1)
        perm = list(range(rank - 2)) + [rank - 1, rank - 2]
        sq = op.MatMul(a, op.Transpose(b, perm=perm))
        zero, one = const(0.0, dt), const(1.0, dt)
        nonpos = op.LessOrEqual(sq, zero)
        return op.Where(nonpos, zero, op.Sqrt(op.Where(nonpos, one, sq)))

    def inf_norm_ties_whole(diff, dt):
        # max |diff| over the last axis with _cdist_backward's gradient: sign(diff) dy at every
        # element equal to the maximum (linalg_vector_norm's shares dy among them instead)
        a = op.Abs(diff)
        ax = ints([-1])
        raw = op.ReduceMax(a, ax, keepdims=1)
        m = stop_gradient(raw)
        hit = op.Cast(op.Equal(a, m), to=dt)
        ties_whole = op.Add(m, op.ReduceSum(op.Mul(stop_gradient(hit), op.Sub(a, stop_gradient(a))), ax, keepdims=1))
        # a - a is NaN at an infinite element: rows whose max is not finite keep ReduceMax
        finite = op.Equal(op.Sub(m, m), const(0.0, dt))
        return op.Squeeze(op.Where(finite, ties_whole, raw), ax)

    def cdist_forward(x1: TFloat, x2: TFloat, p: float = 2.0, compute_mode: Optional[int] = None) -> TFloat:
        # torch.cdist (aten::cdist) and _cdist_forward: aten::cdist kept whole, since its
        # decomposition differentiates _euclidean_dist's Sqrt (NaN at a zero distance: cdist(x, x)
        # with more than 25 rows) where eager's _euclidean_dist_backward takes 0 there.
        # eager (Distance.cpp cdist_impl): p 2 through _euclidean_dist with compute_mode 1, or
        # with the default mode where either input has more than 25 rows; otherwise the norm of
        # every difference, with _cdist_backward's gradient (p inf: every tie gets the whole dy).
        # torchlib has no rule. Row counts are sizes of the call: with both paths possible the
        # choice is made in the graph, each path reading zeros where it is not taken (its
        # backward then adds nothing, not even 0 * inf).
        mode = 0 if compute_mode is None else int(compute_mode)
        p = float(p)
        dt = x1.dtype
        rank = len(x2.shape)

        def direct(a, b):
            diff = op.Sub(op.Unsqueeze(a, ints([-2])), op.Unsqueeze(b, ints([-3])))
            if math.isinf(p):
                return inf_norm_ties_whole(diff, dt)
            return p_norm(diff, p, [-1], False, dt)

        if p == 0.0:
            # eager's _cdist_backward gives p 0 a zero gradient (present, unlike vector_norm's):
            # a Where whose never-true condition the graph cannot fold sends it 0
            count = direct(x1, x2)
            reach = op.ReduceSum(op.Sub(op.Unsqueeze(x1, ints([-2])), op.Unsqueeze(x2, ints([-3]))), ints([-1]),
                                 keepdims=0)
            return op.Where(op.IsNaN(count), reach, count)
        if p != 2.0 or mode == 2:
            return direct(x1, x2)
        if mode == 1:
            return euclidean_dist_mm(x1, x2, rank, dt)
        r1, r2 = x1.shape[-2], x2.shape[-2]
        if isinstance(r1, int) and isinstance(r2, int):
            if r1 > CDIST_MM_ROWS or r2 > CDIST_MM_ROWS:
                return euclidean_dist_mm(x1, x2, rank, dt)
            return direct(x1, x2)
        limit = ints([CDIST_MM_ROWS])
        rows = lambda x: op.Shape(x, start=-2, end=-1)
        use_mm = op.Or(op.Greater(rows(x1), limit), op.Greater(rows(x2), limit))
        zero = const(0.0, dt)
        on_mm = lambda x: op.Where(use_mm, x, zero)
        off_mm = lambda x: op.Where(use_mm, zero, x)
        return op.Where(use_mm, euclidean_dist_mm(on_mm(x1), on_mm(x2), rank, dt), direct(off_mm(x1), off_mm(x2)))

    # ---- cross_entropy (the TorchScript path's rule, ortmod/capture/rules/losses.py) ----------------

    REDUCTIONS = {0: "none", 1: "mean", 2: "sum"}

    def max_shifted(x):
        # x - max over the classes, the max taking no gradient (log_softmax is invariant to it):
        # the engine's LogSoftmax / SoftmaxCrossEntropyLoss compute x - (m + log(sum)), rounding
        # m + log(sum) at the scale of the largest logit; with m already 0 the result is eager's
        # (x - m) - log(sum)
        return op.Sub(x, stop_gradient(op.ReduceMax(x, ints([1]), keepdims=1)))

    def class_weight(weight, rank):
        return op.Reshape(weight, ints([1, -1] + [1] * (rank - 2)))     # eager's expand_weight

    def smoothing_factor(x, class_dim, ls, dt):
        # eager: label_smoothing / n_classes in double, converted to dt where it meets a tensor
        c = x.shape[class_dim]
        if isinstance(c, int):
            return const(ls / c, dt)
        c_d = op.Cast(op.Shape(x, start=class_dim, end=class_dim + 1), to=ir.DataType.DOUBLE)
        return op.Reshape(op.Cast(op.Div(const([ls], ir.DataType.DOUBLE), c_d), to=dt), ints([]))

    def cross_entropy(self: TFloat, target: TTensor, weight: Optional[TFloat] = None, reduction: int = 1,
                      ignore_index: int = -100, label_smoothing: float = 0.0) -> TFloat:
        # eager (LossNLL.cpp cross_entropy_loss); torchlib's rule is SoftmaxCrossEntropyLoss,
        # which drops label_smoothing, takes no probability targets and wants an (N, C) input:
        # * class targets, label_smoothing 0, batched: torchlib's rule;
        # * class targets, label_smoothing ls: (1 - ls) nll_loss(log_softmax(x)) + ls / C * smooth,
        #   smooth = -sum_c w_c log_softmax(x)_c, 0 at ignored targets, for mean divided by the
        #   summed weights of the targets not ignored (their count without weights), as eager's
        #   cross_entropy_loss_label_smoothing (composite: the gradient is autodiff's);
        # * probability targets: -sum_c w_c t_c log_softmax(x)_c, t smoothed to t (1 - ls) + ls / C,
        #   the mean over numel / C positions (cross_entropy_loss_prob_target);
        # * an unbatched input (C,): a batch of one, its axis removed again for reduction none.
        # _CHECKS refuses what eager raises on (ls outside [0, 1], ignore_index with probabilities).
        rank = len(self.shape)
        ls = float(label_smoothing)
        prob = target.dtype.is_floating_point()
        if not prob and ls == 0.0 and rank != 1:
            return tl_nn.aten_cross_entropy_loss(self, target, weight, reduction, ignore_index, label_smoothing)
        dt = self.dtype
        unbatched = rank == 1
        given, class_dim = self, 0 if unbatched else 1
        if unbatched:
            self, target, rank = op.Unsqueeze(self, ints([0])), op.Unsqueeze(target, ints([0])), 2
        shape_src = self
        if not prob and ls == 0.0:
            out = tl_nn.aten_cross_entropy_loss(max_shifted(self), target, weight, reduction, ignore_index, 0.0)
        elif prob:
            logp = op.LogSoftmax(max_shifted(self), axis=1)
            if ls > 0.0:
                target = op.Add(op.Mul(target, const(1.0 - ls, dt)), smoothing_factor(given, class_dim, ls, dt))
            prod = op.Mul(logp, target)
            if weight is not None:
                prod = op.Mul(prod, class_weight(weight, rank))
            if reduction == 0:
                out = op.Neg(op.ReduceSum(prod, ints([1]), keepdims=0))
            else:
                out = op.Neg(op.ReduceSum(prod, keepdims=0))
                if reduction == 1:
                    positions = op.Div(op.Size(shape_src), op.Shape(shape_src, start=1, end=2))   # numel / C
                    out = op.Div(out, op.Cast(op.Squeeze(positions, ints([0])), to=dt))
        else:
            logp = op.LogSoftmax(max_shifted(self), axis=1)
            nll = op.NegativeLogLikelihoodLoss(logp, target, weight, reduction=REDUCTIONS[reduction],
                                               ignore_index=ignore_index)
            per_class = logp if weight is None else op.Mul(logp, class_weight(weight, rank))
            smooth = op.Neg(op.ReduceSum(per_class, ints([1]), keepdims=0))
            ignored = op.Equal(target, const(ignore_index, target.dtype))
            zero = const(0.0, dt)
            smooth = op.Where(ignored, zero, smooth)
            if reduction == 1:
                if weight is not None:
                    safe = op.Where(ignored, const(0, target.dtype), target)
                    counted = op.Where(ignored, zero, op.Gather(weight, safe, axis=0))
                else:
                    counted = op.Cast(op.Not(ignored), to=dt)
                smooth = op.Div(op.ReduceSum(smooth, keepdims=0), op.ReduceSum(counted, keepdims=0))
            elif reduction == 2:
                smooth = op.ReduceSum(smooth, keepdims=0)
            out = op.Add(op.Mul(const(1.0 - ls, dt), nll), op.Mul(smooth, smoothing_factor(given, class_dim, ls, dt)))
        if unbatched and reduction == 0:
            out = op.Squeeze(out, ints([0]))
        return out

    # ---- upsampling: nearest, nearest-exact, (bi/tri)linear --------------------------------------
    # Eager's CPU kernels (UpSampleKernel.cpp, UpSample.h) per spatial axis of input size L and
    # output size O, in the op-math type T (float; double for float64 inputs):
    # * O: the given size, else floor(L * scale) in double (compute_output_size);
    # * the source scale: 1 / scale given (> 0), else L / O, in T (compute_scales_value);
    # * nearest's index floorf(scale * o), nearest-exact's floorf(max(scale (o + .5) - .5, 0) + .5)
    #   (that + .5 in double), both clamped to L - 1; floorf takes a float, so a double is
    #   rounded to float first (2-d: see nearest() for the kernel eager picks);
    # * linear: O == L copies; else the source max(scale (o + .5) - .5, 0) (align_corners:
    #   scale o with scale (L - 1) / (O - 1), 0 for O == 1), i0 = min(floorf(it), L - 1),
    #   i1 = i0 + 1 unless i0 is the last, lambda1 = clamp(it - i0, 0, 1), lambda0 = 1 - lambda1;
    #   the result nests the axes innermost first (w0 x[i0] + w1 x[i1] along W, then H, then D).
    # Sizes are sizes of the call, so the indices and weights are computed in the graph, from
    # integers (no gradient flows into them). torchlib's Resize is an op the engine lacks.
    #
    # Linear's backward scatters with the forward's weights (one linear map). Nearest's does
    # not quite: its backward's index (nearest_idx, nearest_exact_idx) is computed in float and
    # nearest_idx copies for O == L and halves for O == 2 L, while the forward always uses the
    # formula in T. They differ, e.g., for float64 at L 24, O 74, or float32 with scale_factor
    # 1.1 at L 4 (forward [0, 0, 1, 2], the gradient as for [0, 1, 2, 3]). Where they can, the
    # value is read at the forward's index and the gradient sent to the backward's: Gather of
    # the stopped input at one plus (x[b] - stop(x[b])) at the other (gather_with_gradient_at, which
    # the TorchScript path shares), per output position
    # where they differ. Left: at such a position whose x[b] is inf or NaN the value stays
    # eager's but that element gets no gradient where eager's gets dy.

    F32, F64 = ir.DataType.FLOAT, ir.DataType.DOUBLE

    def opmath(dt):
        return F64 if dt == F64 else F32

    def axis_sizes(x, a, k, output_size, scale):
        size = op.Shape(x, start=a, end=a + 1)                                  # L, (1,)
        if output_size is not None:
            out = op.Slice(op.Cast(output_size, to=I64), ints([k]), ints([k + 1]))
        else:
            out = op.Cast(op.Floor(op.Mul(op.Cast(size, to=F64), const([float(scale)], F64))), to=I64)
        return size, out

    def source_scale(size, out, scale, T):
        if scale is not None and scale > 0:
            return const([float(torch.tensor(1.0 / scale, dtype=torch.float64 if T == F64 else torch.float32))], T)
        return op.Div(op.Cast(size, to=T), op.Cast(out, to=T))

    def floorf(v, T):
        if T == F64:
            v = op.Cast(v, to=F32)
        return op.Cast(op.Floor(v), to=I64)

    def nearest_indices(size, out, scale, T, exact):
        o = op.Range(const(0, I64), op.Squeeze(out, ints([0])), const(1, I64))
        last = op.Sub(size, ints([1]))
        s_t, s_f = source_scale(size, out, scale, T), source_scale(size, out, scale, F32)
        if exact:
            half = const(0.5, T)
            real = op.Max(op.Sub(op.Mul(s_t, op.Add(op.Cast(o, to=T), half)), half), const(0.0, T))
            fwd = op.Min(floorf(op.Cast(op.Add(op.Cast(real, to=F64), const(0.5, F64)), to=F32), F32), last)
            bwd_real = op.Mul(op.Add(op.Cast(o, to=F64), const(0.5, F64)), op.Cast(s_f, to=F64))
            bwd = op.Min(floorf(bwd_real, F64), last)
            return o, fwd, bwd
        fwd = op.Min(floorf(op.Mul(op.Cast(o, to=T), s_t), T), last)
        generic = op.Min(floorf(op.Mul(op.Cast(o, to=F32), s_f), F32), last)
        bwd = op.Where(op.Equal(out, size), o,
                       op.Where(op.Equal(out, op.Mul(size, ints([2]))), op.Div(o, const(2, I64)), generic))
        return o, fwd, bwd

    def may_differ(T, scale, exact):
        # whether nearest's backward index can differ from its forward's (see above): float
        # op-math with the same scale differs only through nearest_idx's O == L and O == 2 L
        # cases, which a scale in (1, 2) or (2, 3) can reach
        if exact or T == F64:
            return True
        return scale is not None and (1.0 < scale < 2.0 or 2.0 < scale < 3.0)

    def along(v, a, rank):
        # a vector over axis a, shaped to broadcast against a rank-`rank` tensor
        return op.Reshape(v, ints([-1] + [1] * (rank - 1 - a)))

    def emit(op_type, *inputs, axis=None):
        return getattr(op, op_type)(*inputs, **({} if axis is None else {"axis": axis}))

    def nearest(rank, exact):
        def rule(x, output_size, scales):
            r = len(x.shape)
            T = opmath(x.dtype)
            sizes = [axis_sizes(x, 2 + k, k, output_size, scales[k]) for k in range(rank)]
            if rank == 2:
                # eager's 2-d forward takes its channels-last kernel, which reads at the
                # backward's index, where O_h + O_w <= 128 (_use_vectorized_kernel_cond_2d; its
                # other case, a channels-last input with C > 3, is refused by _CHECKS), else the
                # formula in T
                small = op.LessOrEqual(op.Add(sizes[0][1], sizes[1][1]), ints([128]))
            y = x
            for k in range(rank):
                a = 2 + k
                size, out = sizes[k]
                o, fwd, bwd = nearest_indices(size, out, scales[k], T, exact)
                if rank == 2:
                    fwd = op.Where(small, bwd, fwd)
                if not may_differ(T, scales[k], exact):
                    y = op.Gather(y, fwd, axis=a)
                    continue
                y = gather_with_gradient_at(emit, stop_gradient, y, fwd, bwd, along(op.Equal(fwd, bwd), a, r), a)
            return y
        return rule

    def linear(rank):
        def rule(x, output_size, align_corners, scales):
            r = len(x.shape)
            T = opmath(x.dtype)     # float32 / float64 only (_CHECKS): T is the input's dtype
            y = x
            for k in reversed(range(rank)):
                a = 2 + k
                size, out = axis_sizes(x, a, k, output_size, scales[k])
                o = op.Range(const(0, I64), op.Squeeze(out, ints([0])), const(1, I64))
                o_t = op.Cast(o, to=T)
                zero, one, half = const(0.0, T), const(1.0, T), const(0.5, T)
                last = op.Sub(size, ints([1]))
                if align_corners:
                    ratio = op.Div(op.Cast(last, to=T), op.Cast(op.Sub(out, ints([1])), to=T))
                    ratio = op.Where(op.Greater(out, ints([1])), ratio, zero)
                    real = op.Mul(ratio, o_t)
                else:
                    ratio = source_scale(size, out, scales[k], T)
                    real = op.Max(op.Sub(op.Mul(ratio, op.Add(o_t, half)), half), zero)
                i0 = op.Min(floorf(real, T), last)
                lam1 = op.Min(op.Max(op.Sub(real, op.Cast(i0, to=T)), zero), one)
                i1 = op.Min(op.Add(i0, const(1, I64)), last)
                same = op.Equal(out, size)                                      # O == L copies
                i0, i1 = op.Where(same, o, i0), op.Where(same, o, i1)
                lam1 = op.Where(same, zero, lam1)
                lam0 = op.Sub(one, lam1)
                y = op.Add(op.Mul(op.Gather(y, i0, axis=a), along(lam0, a, r)),
                           op.Mul(op.Gather(y, i1, axis=a), along(lam1, a, r)))
            return y
        return rule

    def scale_list(rank, scale_factors):
        if scale_factors is None:
            return [None] * rank
        v = [float(s) for s in scale_factors]
        return v * rank if len(v) == 1 else v

    def nearest_vec(rank, exact):
        inner = nearest(rank, exact)

        def rule(input: TFloat, output_size: Optional[TInt], scale_factors: Optional[Sequence[float]]) -> TFloat:
            return inner(input, output_size, scale_list(rank, scale_factors))
        return rule

    def nearest_default(rank, exact):
        inner = nearest(rank, exact)
        if rank == 1:
            def rule(self: TFloat, output_size: TInt, scales: Optional[float] = None) -> TFloat:
                return inner(self, output_size, [scales])
        elif rank == 2:
            def rule(self: TFloat, output_size: TInt, scales_h: Optional[float] = None,
                     scales_w: Optional[float] = None) -> TFloat:
                return inner(self, output_size, [scales_h, scales_w])
        else:
            def rule(self: TFloat, output_size: TInt, scales_d: Optional[float] = None,
                     scales_h: Optional[float] = None, scales_w: Optional[float] = None) -> TFloat:
                return inner(self, output_size, [scales_d, scales_h, scales_w])
        return rule

    def linear_vec(rank):
        inner = linear(rank)

        def rule(input: TFloat, output_size: Optional[TInt], align_corners: bool,
                 scale_factors: Optional[Sequence[float]]) -> TFloat:
            return inner(input, output_size, bool(align_corners), scale_list(rank, scale_factors))
        return rule

    def linear_default(rank):
        inner = linear(rank)
        if rank == 1:
            def rule(self: TFloat, output_size: TInt, align_corners: bool, scales: Optional[float] = None) -> TFloat:
                return inner(self, output_size, bool(align_corners), [scales])
        elif rank == 2:
            def rule(self: TFloat, output_size: TInt, align_corners: bool, scales_h: Optional[float] = None,
                     scales_w: Optional[float] = None) -> TFloat:
                return inner(self, output_size, bool(align_corners), [scales_h, scales_w])
        else:
            def rule(self: TFloat, output_size: TInt, align_corners: bool, scales_d: Optional[float] = None,
                     scales_h: Optional[float] = None, scales_w: Optional[float] = None) -> TFloat:
                return inner(self, output_size, bool(align_corners), [scales_d, scales_h, scales_w])
        return rule

    upsampling = {}
    for rank, lin in ((1, "upsample_linear1d"), (2, "upsample_bilinear2d"), (3, "upsample_trilinear3d")):
        for exact, name in ((False, f"upsample_nearest{rank}d"), (True, f"_upsample_nearest_exact{rank}d")):
            packet = getattr(torch.ops.aten, name)
            upsampling[packet.vec] = nearest_vec(rank, exact)
            upsampling[packet.default] = nearest_default(rank, exact)
        packet = getattr(torch.ops.aten, lin)
        upsampling[packet.vec] = linear_vec(rank)
        upsampling[packet.default] = linear_default(rank)
    # ---- norms: group_norm, instance_norm, batch norm without running stats (issue 16) ---------
    # The TorchScript path's decomposition (ortmod/capture/tracing.py _normalized/_affine): per group
    # of channels of each sample, (x - mean) / sqrt(var + eps), var biased and two-pass, as eager's
    # kernels. torchlib's group_norm and instance_norm go through InstanceNormalization (an op
    # the engine does not differentiate) and build float32 default weights whatever the input's
    # dtype. Gradients are the engine's autodiff of these ops: eager's, the mean and variance
    # differentiated as functions of x.

    def normalized(x, groups, eps):
        # groups 0: each channel its own group (Reshape's 0 keeps the channel count)
        grouped = op.Reshape(x, ints([0, groups, -1]))
        axes = ints([-1])
        mean = op.ReduceMean(grouped, axes, keepdims=1)
        centred = op.Sub(grouped, mean)
        var = op.ReduceMean(op.Mul(centred, centred), axes, keepdims=1)
        normed = op.Div(centred, op.Sqrt(op.Add(var, const(eps, x.dtype))))
        return op.Reshape(normed, op.Shape(x))

    def per_channel(v, rank):
        return op.Reshape(v, ints([-1] + [1] * (rank - 2)))

    def affine(y, weight, bias, rank):
        if weight is not None:
            y = op.Mul(y, per_channel(weight, rank))
        if bias is not None:
            y = op.Add(y, per_channel(bias, rank))
        return y

    def group_norm(input: TFloat, num_groups: int, weight: Optional[TFloat] = None,
                   bias: Optional[TFloat] = None, eps: float = 1e-05, cudnn_enabled: bool = True) -> TFloat:
        return affine(normalized(input, int(num_groups), eps), weight, bias, len(input.shape))

    def instance_norm(input: TFloat, weight: Optional[TFloat] = None, bias: Optional[TFloat] = None,
                      running_mean: Optional[TFloat] = None, running_var: Optional[TFloat] = None,
                      use_input_stats: bool = True, momentum: float = 0.1, eps: float = 1e-05,
                      cudnn_enabled: bool = False) -> TFloat:
        # eager: input statistics per (sample, channel) unless use_input_stats is False (eval
        # with track_running_stats), where the running statistics are read. Training with
        # running statistics also updates them in place, which _CHECKS refuses by name (as the
        # TorchScript path does); the module unsqueezes an unbatched input before the op.
        rank = len(input.shape)
        if use_input_stats:
            y = normalized(input, 0, eps)
        else:
            centred = op.Sub(input, per_channel(running_mean, rank))
            y = op.Div(centred, op.Sqrt(op.Add(per_channel(running_var, rank), const(eps, input.dtype))))
        return affine(y, weight, bias, rank)

    def batch_norm_no_stats(input: TFloat, weight: Optional[TFloat] = None, bias: Optional[TFloat] = None,
                            training: bool = False, momentum: float = 0.9,
                            eps: float = 1e-05) -> Tuple[TFloat, TFloat, TFloat]:
        # BatchNorm with track_running_stats=False, in training and in eval: eager normalizes
        # with the batch's statistics per channel (over every dim but 1, var biased) and keeps
        # nothing. torchlib's rule feeds those statistics to an inference-mode
        # BatchNormalization, which the engine differentiates as constants: the gradient through
        # the mean and variance would be lost. Decomposed instead; the saved mean and inverse std
        # (outputs 1, 2) only feed eager's backward and _CHECKS refuses a graph that reads them.
        rank = len(input.shape)
        axes = ints([0] + list(range(2, rank)))
        mean = op.ReduceMean(input, axes, keepdims=1)
        centred = op.Sub(input, mean)
        var = op.ReduceMean(op.Mul(centred, centred), axes, keepdims=1)
        invstd = op.Div(const(1.0, input.dtype), op.Sqrt(op.Add(var, const(eps, input.dtype))))
        y = affine(op.Mul(centred, invstd), weight, bias, rank)
        return y, op.Reshape(mean, ints([-1])), op.Reshape(invstd, ints([-1]))

    # ---- activations and elementwise losses (issue 16, helper "act") ---------------------------
    # The TorchScript path's reasoning (ortmod/capture/tracing.py, _export_losses.py): the engine's
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

    def erf(self: TFloat) -> TFloat:
        # eager: erf, gradient 2 / sqrt(pi) exp(-x^2): the engine's Erf, as the TorchScript
        # path exports it. torchlib's rule (for erf and special_erf) is an ONNX local function.
        return op.Erf(self)

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

    def piecewise(d, k, scale, quadratic, dt):
        # Where(d <= -k, scale (-d - k/2), Where(d >= k, scale (d - k/2), quadratic)): the
        # branches eager's smooth_l1/huber backward kernels take (_export_losses._piecewise)
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
        # The TorchScript path's rule (_export_losses).
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
        **upsampling,
        torch.ops.aten.cross_entropy_loss.default: cross_entropy,
        torch.ops.ortmod.cross_entropy_loss.default: cross_entropy,       # unbatched_cross_entropy_loss
        torch.ops.aten.add.Tensor: add_sub(op.Add, tl_core.aten_add, scalar=False),
        torch.ops.aten.sub.Tensor: add_sub(op.Sub, tl_core.aten_sub, scalar=False),
        torch.ops.aten.add.Scalar: add_sub(op.Add, tl_core.aten_add, scalar=True),
        torch.ops.aten.sub.Scalar: add_sub(op.Sub, tl_core.aten_sub, scalar=True),
        torch.ops.aten.linalg_vector_norm.default: vector_norm,
        torch.ops.aten._cdist_forward.default: cdist_forward,
        torch.ops.aten.cdist.default: cdist_forward,
        torch.ops.aten.max.dim: extremum_dim(op.ArgMax),
        torch.ops.aten.min.dim: extremum_dim(op.ArgMin),
        torch.ops.aten.argmax.default: arg_extremum(op.ArgMax),
        torch.ops.aten.argmin.default: arg_extremum(op.ArgMin),
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
        # norms (issue 16)
        torch.ops.aten.group_norm.default: group_norm,
        torch.ops.aten.instance_norm.default: instance_norm,
        torch.ops.aten._native_batch_norm_legit.no_stats: batch_norm_no_stats,
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
        torch.ops.aten.erf.default: erf,
        torch.ops.aten.special_erf.default: erf,
        torch.ops.aten.xlogy.Tensor: xlogy,
        torch.ops.aten.binary_cross_entropy.default: binary_cross_entropy,
        torch.ops.aten.soft_margin_loss.default: soft_margin_loss,
        torch.ops.aten.smooth_l1_loss.default: smooth_l1_loss,
        torch.ops.aten.multi_margin_loss.default: multi_margin_loss,
        torch.ops.ortmod.multi_margin_loss.default: multi_margin_loss,      # keep_whole
        torch.ops.aten.multilabel_margin_loss.default: multilabel_margin_loss,
        torch.ops.aten.nll_loss_nd.default: nll_loss_nd,
    }


def zoo_translations(op, ir, stop_gradient):
    """The rules the model zoo needs on this path (issue 16): numbers made tensors (scalar_tensor),
    where and fill with a number, fill with a tensor, ceil of ints, hardtanh and relu6, remainder,
    baddbmm, view_copy (what ``_capture_export._views_to_view_copies`` makes of a view); any, all,
    amin and amax."""
    from typing import Optional, Sequence
    import onnx
    import onnxscript
    from onnxscript.function_libs.torch_lib.tensor_typing import TReal, TTensor
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

    def number_as(value, dt):
        # a Python number, or a symbolic one (a size: MultiLabelMarginLoss's where(m, i, n)),
        # which arrives as a 0-d graph value and is cast as torchlib casts it
        if isinstance(value, (bool, int, float)):
            return scalar_as(value, dt)
        return value if value.dtype == dt else op.Cast(value, to=dt)

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
        return number_as(s, dt)

    # ---- where with a number ----------------------------------------------------------------

    def where_scalar_other(condition: TTensor, self: TTensor, other: float) -> TTensor:
        # eager: the number converted to the tensor operand's dtype (the type-promotion pass has
        # made that the result's: an int tensor with a float number is cast to float first).
        # torchlib's rule is Where too, but its number reaches the graph as a float32 constant:
        # where(m, x, 0.1) in float64 would be 0.10000000149.
        return op.Where(condition, self, number_as(other, self.dtype))

    def where_scalar_self(condition: TTensor, self: float, other: TTensor) -> TTensor:
        return op.Where(condition, number_as(self, other.dtype), other)

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

    # ---- any / all, clamp by a 0-d bound, amin / amax ---------------------------------------------

    def any_over(x, dims, keepdim):
        # torch.any: some element nonzero (NaN counts), False over no element. ReduceMax of the
        # 0/1 values, then > 0: over no element ReduceMax gives its type's lowest value, which
        # torchlib's Cast to bool reads as True
        if x.shape is not None and len(x.shape) == 0:
            return op.Cast(x, to=ir.DataType.BOOL)
        ones = op.Cast(op.Cast(x, to=ir.DataType.BOOL), to=ir.DataType.INT64)
        if dims:
            top = op.ReduceMax(ones, const(list(dims), ir.DataType.INT64), keepdims=int(bool(keepdim)))
        else:
            top = op.ReduceMax(ones, keepdims=int(bool(keepdim)))
        return op.Greater(top, const(0, ir.DataType.INT64))

    def all_over(x, dims, keepdim):
        # torch.all: no element zero, True over no element: not any(x == 0)
        if x.shape is not None and len(x.shape) == 0:
            return op.Cast(x, to=ir.DataType.BOOL)
        return op.Not(any_over(op.Not(op.Cast(x, to=ir.DataType.BOOL)), dims, keepdim))

    def any_all(fn, form):
        def whole(self: TTensor) -> TTensor:
            return fn(self, [], False)

        def one_dim(self: TTensor, dim: int, keepdim: bool = False) -> TTensor:
            return fn(self, [dim], keepdim)

        def dims(self: TTensor, dim: Optional[Sequence[int]] = None, keepdim: bool = False) -> TTensor:
            return fn(self, list(dim) if dim else [], keepdim)
        return {"whole": whole, "dim": one_dim, "dims": dims}[form]

    def scalar_bound(b, like):
        return None if b is None else op.CastLike(op.Reshape(b, const([], ir.DataType.INT64)), like)

    def clamp_min_tensor(self: TReal, min: TReal) -> TReal:
        # _CHECKS lets only 0-d bounds through (torchlib makes a larger one Max / Min, whose
        # gradient halves at a tie). torchlib picks Clip by the bound's rank, which a number's
        # constant does not carry into the translation: it took Max. Clip of the 0-d bound has
        # clamp's gradient, all of dy at the bound.
        return op.Clip(self, scalar_bound(min, self))

    def clamp_tensor(self: TReal, min: Optional[TReal] = None, max: Optional[TReal] = None) -> TReal:
        # clamp(x, 1e-6) in a float64 graph: the type-promotion pass makes the number a tensor
        # (clamp.Tensor), whose torchlib rule is Max / Min: a value at the bound got half of
        # eager's gradient. 0-d bounds only (_CHECKS), as Clip.
        if min is None and max is None:
            return op.Identity(self)
        return op.Clip(self, scalar_bound(min, self), scalar_bound(max, self))

    def extremum_over(reduce_op):
        def rule(self: TReal, dim: Sequence[int] = (), keepdim: bool = False) -> TReal:
            # amin / amax: ReduceMin / ReduceMax over dim (every dim when empty, as eager), the
            # engine's gradient shared among ties as eager's amin/amax (the TorchScript path's
            # export). torchlib's rule is an ONNX local function, which the engine does not take.
            if len(self.shape) == 0:
                return op.Identity(self)
            dims = list(dim) if dim is not None else []
            if not dims:
                return reduce_op(self, keepdims=int(bool(keepdim)))
            return reduce_op(self, const(dims, ir.DataType.INT64), keepdims=int(bool(keepdim)))
        return rule

    def max_all(self: TReal) -> TReal:
        # max() over every element: amax's rule (eager shares the gradient among ties,
        # evenly_distribute_backward), the TorchScript path's ReduceMax
        return extremum_over(op.ReduceMax)(self)

    def min_all(self: TReal) -> TReal:
        return extremum_over(op.ReduceMin)(self)

    # ---- division with a rounding mode ----------------------------------------------------------

    def div_mode(self: TReal, other: TReal, rounding_mode: Optional[str] = None) -> TReal:
        # integers only (_CHECKS refuses the rest). eager (BinaryOpsKernel.cpp): trunc is C's a / b
        # (the engine's integer Div; a zero divisor an error, as eager's ZeroDivisionError);
        # floor is div_floor_integer: a / b, less 1 where the signs of a and b differ and a % b
        # is not 0. torchlib's rule divides in float32 (inexact past 2**24) and floors.
        if isinstance(other, (bool, int, float)):
            other = scalar_as(other, self.dtype)
        q = op.Div(self, other)
        if rounding_mode == "trunc":
            return q
        zero = const(0, self.dtype)
        differ = op.Xor(op.Less(self, zero), op.Less(other, zero))
        inexact = op.Not(op.Equal(op.Mod(self, other, fmod=1), zero))
        return op.Sub(q, op.Cast(op.And(differ, inexact), to=self.dtype))

    # ---- arange --------------------------------------------------------------------------------

    # eager's CPU kernel computes start + i * step in double (vectorized: in the output's dtype
    # from a double base), torchlib's Range in the output's dtype from float32 bounds: a 0.1 step
    # differed by an ulp in float32 and by 4e-8 in float64. Bounds that are all Python numbers
    # make eager's own values a constant (the TorchScript path traces the same constant); a
    # symbolic bound (a size) is an integer, and Range over int64 is exact (_CHECKS refuses a
    # symbolic bound beside a fractional one).
    torch_of = {ir.DataType.FLOAT: torch.float32, ir.DataType.DOUBLE: torch.float64,
                ir.DataType.FLOAT16: torch.float16, ir.DataType.BFLOAT16: torch.bfloat16,
                ir.DataType.INT64: torch.int64, ir.DataType.INT32: torch.int32, ir.DataType.INT16: torch.int16,
                ir.DataType.INT8: torch.int8, ir.DataType.UINT8: torch.uint8}

    ir_of = {t: i for i, t in torch_of.items()}

    def arange_of(start, end, step, dtype):
        bounds = (start, end, step)
        want = None if dtype is None or dtype == -1 else ir.DataType(dtype)
        if all(isinstance(b, (int, float)) and not isinstance(b, bool) for b in bounds):
            values = torch.arange(start, end, step, dtype=None if want is None else torch_of[want])
            dt = want or ir_of[values.dtype]
            if values.dtype == torch.bfloat16:     # numpy has no bfloat16; onnx's ml_dtypes does
                import ml_dtypes
                array = values.float().numpy().astype(ml_dtypes.bfloat16)
            else:
                array = values.numpy()
            return op.Constant(value=ir.tensor(array, dtype=dt))
        ints = [number(b) if isinstance(b, int) else op.Cast(b, to=ir.DataType.INT64) for b in bounds]
        out = op.Range(*ints)
        return out if want in (None, ir.DataType.INT64) else op.Cast(out, to=want)

    def arange(end: int, dtype: int = -1, layout: str = "", device: str = "", pin_memory: bool = False) -> TTensor:
        return arange_of(0, end, 1, dtype)

    def arange_start(start: int, end: int, dtype: int = -1, layout: str = "", device: str = "",
                     pin_memory: bool = False) -> TTensor:
        return arange_of(start, end, 1, dtype)

    def arange_start_step(start: int, end: int, step: int = 1, dtype: int = -1, layout: str = "",
                          device: str = "", pin_memory: bool = False) -> TTensor:
        return arange_of(start, end, step, dtype)

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
        torch.ops.aten.any.default: any_all(any_over, "whole"),
        torch.ops.aten.any.dim: any_all(any_over, "dim"),
        torch.ops.aten.any.dims: any_all(any_over, "dims"),
        torch.ops.aten.all.default: any_all(all_over, "whole"),
        torch.ops.aten.all.dim: any_all(all_over, "dim"),
        torch.ops.aten.all.dims: any_all(all_over, "dims"),
        torch.ops.aten.clamp_min.Tensor: clamp_min_tensor,
        torch.ops.aten.clamp.Tensor: clamp_tensor,
        torch.ops.aten.amin.default: extremum_over(op.ReduceMin),
        torch.ops.aten.amax.default: extremum_over(op.ReduceMax),
        torch.ops.aten.max.default: max_all,
        torch.ops.aten.min.default: min_all,
        torch.ops.aten.div.Tensor_mode: div_mode,
        torch.ops.aten.arange.default: arange,
        torch.ops.aten.arange.start: arange_start,
        torch.ops.aten.arange.start_step: arange_start_step,
    }


def clamp_translations(op, ir, stop_gradient, number_mode, tensor_mode):
    """clamp's gradient at its bound as eager computes it on the running torch
    (capture.compat.clamp_semantics). To 2.13 every mode is torch.clamp's backward, all of dy at a
    bound, which torchlib's Clip (and ortmod's clamp_tensor) has: nothing is registered. 2.14
    gives none at a number bound (``exclusive``: x passes where lo < x < hi, NaN gets nothing)
    and half at a tensor bound (``half``: all where lo == x == hi, and at NaN). The value is
    Clip's either way; the gradient reaches x through the Where branch that keeps it."""
    from typing import Optional
    from onnxscript.function_libs.torch_lib.tensor_typing import TReal

    def bound(b, like):
        return None if b is None else op.CastLike(op.Reshape(b, op.Constant(value_ints=[])), like)

    def exclusive(self, lo, hi):
        inside = None
        if lo is not None:
            inside = op.Greater(self, lo)
        if hi is not None:
            below = op.Less(self, hi)
            inside = below if inside is None else op.And(inside, below)
        return op.Where(inside, self, stop_gradient(op.Clip(self, lo, hi)))

    def half(self, lo, hi):
        outside = tie = None
        if lo is not None:
            outside, tie = op.Less(self, lo), op.Equal(self, lo)
        if hi is not None:
            above, at_hi = op.Greater(self, hi), op.Equal(self, hi)
            outside = above if outside is None else op.Or(outside, above)
            tie = at_hi if tie is None else op.Xor(tie, at_hi)
        one_half = op.CastLike(op.Constant(value_float=0.5), self)
        halfway = op.Add(op.Mul(self, one_half), op.Mul(stop_gradient(self), one_half))   # x, half its gradient
        return op.Where(outside, stop_gradient(op.Clip(self, lo, hi)), op.Where(tie, halfway, self))

    def rules(form):
        def clamp(self: TReal, min: Optional[TReal] = None, max: Optional[TReal] = None) -> TReal:
            if min is None and max is None:
                return op.Identity(self)
            return form(self, bound(min, self), bound(max, self))

        def clamp_min(self: TReal, min: TReal) -> TReal:
            return form(self, bound(min, self), None)

        def clamp_max(self: TReal, max: TReal) -> TReal:
            return form(self, None, bound(max, self))
        return clamp, clamp_min, clamp_max

    aten = torch.ops.aten
    out = {}
    if number_mode == "exclusive":
        clamp, clamp_min, clamp_max = rules(exclusive)
        out.update({aten.clamp.default: clamp, aten.clamp_min.default: clamp_min, aten.clamp_max.default: clamp_max,
                    torch.ops.ortmod.clamp_number.default: clamp})
    else:       # ortmod::clamp_number (number_clamps_back) where the number kernel is Clip's
        out[torch.ops.ortmod.clamp_number.default] = rules(lambda self, lo, hi: op.Clip(self, lo, hi))[0]
    if tensor_mode == "half":
        clamp, clamp_min, clamp_max = rules(half)
        out.update({aten.clamp.Tensor: clamp, aten.clamp_min.Tensor: clamp_min, aten.clamp_max.Tensor: clamp_max})
    return out


_NUMBER_CLAMPS = {torch.ops.aten.clamp.Tensor: torch.ops.aten.clamp.default,
                  torch.ops.aten.clamp_min.Tensor: torch.ops.aten.clamp_min.default,
                  torch.ops.aten.clamp_max.Tensor: torch.ops.aten.clamp_max.default}


@torch.library.custom_op("ortmod::clamp_number", mutates_args=())
def clamp_number(self: torch.Tensor, min: Optional[torch.Tensor] = None,
                 max: Optional[torch.Tensor] = None) -> torch.Tensor:
    """A clamp whose bounds were numbers in the module's code (eager's number kernel, and its
    gradient at a bound), carried as 0-d tensors of the clamped tensor's dtype. The bound must
    stay a tensor: the ONNX translator types a Python float as a float32 constant, so a float64
    clamp to 0.1 would clamp to float32's 0.1 (1.5e-9 above it) and give no gradient to values
    that sit between the two (F.gaussian_nll_loss's lifted var on 2.14 did). Only ever traced:
    ``clamp_translations`` gives it the number kernel's rule."""
    return torch.clamp(self, min, max)


@clamp_number.register_fake
def _clamp_number_fake(self, min=None, max=None):
    return torch.empty_like(self)


def mark_number_clamps(gm):
    """Before type promotion: clamp / clamp_min / clamp_max with number bounds (eager's number
    kernel, whose gradient at a bound 2.14 made differ from a tensor bound's)."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target in _NUMBER_CLAMPS.values():
            node.meta["ortmod_number_clamp"] = True


def _number_bound(gm, node, b, dtype):
    """A clamp's bound as a 0-d tensor node of the clamped tensor's ``dtype``, or None where it
    cannot be one exactly."""
    if b is None:
        return None, True
    if isinstance(b, torch.fx.Node) and b.target is torch.ops.aten.scalar_tensor.default:
        val = b.meta.get("val")
        if isinstance(val, torch.Tensor) and val.dtype == dtype:
            return b, True
        b = b.args[0] if isinstance(b.args[0], (int, float)) else b
    if isinstance(b, (int, float)) and not isinstance(b, bool):
        with gm.graph.inserting_before(node):
            t = gm.graph.call_function(torch.ops.aten.scalar_tensor.default, (b,), {"dtype": dtype})
        t.meta["val"] = torch.empty((), dtype=dtype, device=node.args[0].meta["val"].device)
        return t, True
    return None, False


def number_clamps_back(gm):
    """After type promotion, which makes a number bound a tensor in a float64 graph
    (scalar_tensor, clamp.Tensor): the number kernel's rule again, ``ortmod::clamp_number``, with
    the bound a 0-d tensor of the clamped dtype (a float64 graph's bound stays float64)."""
    changed = False
    names = {"min": 1, "max": 2}
    for node in gm.graph.nodes:
        if node.op != "call_function" or not node.meta.get("ortmod_number_clamp"):
            continue
        if node.target not in _NUMBER_CLAMPS and node.target not in _NUMBER_CLAMPS.values():
            continue
        self_val = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
        if not isinstance(self_val, torch.Tensor) or not self_val.is_floating_point():
            continue
        args = list(node.args) + [None] * (3 - len(node.args))
        for k, v in node.kwargs.items():
            if k not in names:
                break
            args[names[k]] = v
        else:
            name = str(node.target.overloadpacket.__name__)
            if name == "clamp_max":
                lo, hi = None, args[1]
            elif name == "clamp_min":
                lo, hi = args[1], None
            else:
                lo, hi = args[1], args[2]
            (lo, ok_lo), (hi, ok_hi) = (_number_bound(gm, node, lo, self_val.dtype),
                                        _number_bound(gm, node, hi, self_val.dtype))
            if ok_lo and ok_hi:
                node.target, node.args, node.kwargs = torch.ops.ortmod.clamp_number.default, (args[0], lo, hi), {}
                changed = True
    if changed:
        for node in list(gm.graph.nodes):
            if node.target is torch.ops.aten.scalar_tensor.default and not node.users:
                gm.graph.erase_node(node)
        gm.recompile()
