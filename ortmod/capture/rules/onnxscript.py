"""ortmod's translations of aten ops for the torch.export capture path, where torchlib's rule
(onnxscript's torch_lib, the translator torch ships) does not mean what eager training means, or
is an ONNX local function the engine does not take. Each is read against eager's kernel and its
backward (derivatives.yaml) for every argument; arguments a rule cannot honour are refused by
name in ``audit._CHECKS`` before translation.

``translations(op, ir, stop_gradient)`` returns {aten overload: onnxscript function}; the
functions are traced by torch's exporter (trace mode: Python branches on the arguments)."""
from typing import Optional, Sequence

import torch
from ..errors import UnsupportedModelError


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
                raise UnsupportedModelError(f"{aten_op.name()}: ortmod keeps its numbers only as constants")
            node.target = ortmod_op
            node.args = tuple(a if convert is None else convert(a) for a, (_, _, convert) in zip(args, names))
            node.kwargs = {}
            count += 1
    if count:
        gm.recompile()
    return count




def zoo_translations(op, ir, stop_gradient):
    """The rules the model zoo needs on this path (issue 16): numbers made tensors (scalar_tensor),
    where and fill with a number, fill with a tensor, ceil of ints, remainder,
    baddbmm, view_copy (what ``fx_passes._views_to_view_copies`` makes of a view); any, all,
    amin and amax."""
    from typing import Optional, Sequence
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
        torch.ops.aten.remainder.Scalar: remainder_scalar,
        torch.ops.aten.remainder.Tensor: remainder_tensor,
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


def nearest_takes_channels_last_kernel(sizes, strides):
    """Whether eager's 2-d / 3-d nearest kernels take their channels-last ("vectorized") form for
    an input of these sizes and strides: contiguous in channels-last order with more than 3
    channels (UpSampleKernel.cpp, _use_vectorized_kernel_cond_2d / _3d). That form reads at the
    backward's index (nearest_idx), the other at the formula's; None where a stride is not known.
    Both capture paths ask it (rules/nn._nearest_symbolic, mark_channels_last_nearest)."""
    if len(sizes) not in (4, 5) or (sizes[1] is not None and sizes[1] <= 3):
        return False
    if strides is None or None in strides or None in sizes:
        return None
    fmt = torch.channels_last if len(sizes) == 4 else torch.channels_last_3d
    return torch.empty_strided(sizes, strides, device="meta").is_contiguous(memory_format=fmt)


@torch.library.custom_op("ortmod::nearest_channels_last", mutates_args=())
def nearest_channels_last(input: torch.Tensor, output_size: Optional[Sequence[int]],
                          scale_factors: Optional[Sequence[float]], exact: bool) -> torch.Tensor:
    """Nearest (or nearest-exact) upsampling of an input eager hands to its channels-last kernel
    (nearest_takes_channels_last_kernel), which reads at the backward's index
    (nearest_idx) where the other kernel uses the formula. A scale of 0 is no scale. Only ever
    traced: ``translations`` gives it its rule."""
    rank = input.dim() - 2
    aten = getattr(torch.ops.aten, f"{'_upsample_nearest_exact' if exact else 'upsample_nearest'}{rank}d")
    scales = None if scale_factors is None else [s if s > 0 else None for s in scale_factors]
    if output_size is None:
        return aten.vec(input, None, scales)
    return aten.default(input, output_size, *(scales or [None] * rank))


@nearest_channels_last.register_fake
def _nearest_channels_last_fake(input, output_size, scale_factors, exact):
    rank = input.dim() - 2
    if output_size is None:
        output_size = [int(torch.sym_float(n) * s) for n, s in
                       zip(input.shape[2:], scale_factors * rank if len(scale_factors) == 1 else scale_factors)]
    return input.new_empty(list(input.shape[:2]) + list(output_size))


def nearest_kernel_of_fake(val):
    """nearest_takes_channels_last_kernel for a traced (fake) tensor whose sizes and
    strides may be symbolic: True or False where its sizes' ranges decide, else None."""
    from torch.fx.experimental.symbolic_shapes import guard_or_false, guard_or_true
    if val.dim() not in (4, 5) or guard_or_false(val.shape[1] <= 3):
        return False
    fmt = torch.channels_last if val.dim() == 4 else torch.channels_last_3d
    laid = val.is_contiguous(memory_format=fmt)
    if not guard_or_true(laid):
        return False
    if guard_or_false(laid) and guard_or_false(val.shape[1] > 3):
        return True
    return None


def _nearest_targets():
    out = {}
    for rank in (2, 3):
        for exact, name in ((False, f"upsample_nearest{rank}d"), (True, f"_upsample_nearest_exact{rank}d")):
            packet = getattr(torch.ops.aten, name)
            out[packet.vec], out[packet.default] = exact, exact
    return out


def reads_layout(gm, ranks=(2, 3)):
    """Whether the graph holds a kernel that eager picks by memory layout (nearest upsampling of
    more than 3 channels, of a rank in ``ranks``): its export holds only for the call's input
    layouts."""
    from torch.fx.experimental.symbolic_shapes import guard_or_false
    targets = set(_nearest_targets()) | {torch.ops.ortmod.nearest_channels_last.default}
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in targets:
            continue
        val = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
        if not isinstance(val, torch.Tensor):
            return True
        if val.dim() - 2 in ranks and not guard_or_false(val.shape[1] <= 3):
            return True
    return False


def mark_channels_last_nearest(gm):
    """After decomposition: nearest upsampling whose input eager hands to its channels-last kernel
    (contiguous in channels-last order, more than 3 channels: read from the node's traced strides)
    becomes ortmod::nearest_channels_last, whose rule reads at that kernel's index."""
    targets = _nearest_targets()
    changed = False
    for node in gm.graph.nodes:
        if node.op != "call_function" or node.target not in targets:
            continue
        val = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
        if not isinstance(val, torch.Tensor) or not nearest_kernel_of_fake(val):
            continue        # not known (None) is the audit's refusal: audit._check_upsample_nearest
        rank = val.dim() - 2
        args = list(node.args)
        if node.target == node.target.overloadpacket.vec:
            args += [None] * (3 - len(args))
            output_size, scales = args[1], args[2]
        else:
            scales = [node.kwargs.get(k) for k in ("scales_d", "scales_h", "scales_w")[3 - rank:]]
            given = args[2:] + [None] * (rank - len(args[2:]))
            scales = [g if g is not None else s for g, s in zip(given, scales)]
            output_size, scales = args[1], [0.0 if s is None else float(s) for s in scales]
        exact = targets[node.target]
        node.target = torch.ops.ortmod.nearest_channels_last.default
        node.args, node.kwargs = (args[0], output_size, scales, exact), {}
        changed = True
    if changed:
        gm.recompile()


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
