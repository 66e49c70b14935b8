"""The torch.export path's rules for scatter_add, index_put, copy, masked_select: onnxscript functions traced by
torch's
exporter where torchlib's translation does not mean what eager training means.

Each function below is handed the opset ``op``, ``onnx_ir`` as ``ir`` and the engine's stop-gradient
op, and returns {aten op: rule} for the rules that share its helpers; ``translations`` is their
union, which ``capture.export_registry`` adds to torchlib's registry."""
import torch


def indexing(op, ir, stop_gradient):
    from typing import Optional, Sequence
    from onnxscript.function_libs.torch_lib.tensor_typing import TReal, TTensor, TInt
    from onnxscript.function_libs.torch_lib.ops import core as tl_core

    I64 = ir.DataType.INT64

    def const(v, dt):
        return op.Constant(value=ir.tensor(v, dtype=dt))

    def ints(v):
        return const(list(v), I64)

    # ---- scatter_add ---------------------------------------------------------------------------

    def scatter_add(self: TReal, dim: int, index: TInt, src: TReal) -> TReal:
        # eager (scatter_add): self[..index[p]..] += src[p] for every position p of index, src
        # may be larger than index (only its index-shaped corner is read); ONNX's
        # ScatterElements wants updates of index's shape, so src is sliced to it (a no-op when
        # they agree). Repeated indices add (reduction add), as eager.
        rank = len(index.shape)
        src = op.Slice(src, ints([0] * rank), op.Shape(index), ints(range(rank)))
        return op.ScatterElements(self, index, src, axis=dim, reduction="add")

    # ---- index_put -----------------------------------------------------------------------------

    def index_put(self: TReal, indices: Sequence[Optional[TTensor]], values: TReal,
                  accumulate: bool = False) -> TReal:
        # integer indices: torchlib's rule (ScatterND; accumulate: repeated indices add, as
        # eager; otherwise the engine lets the last write win, eager's deterministic order;
        # negative indices wrap). One boolean mask on the leading dims with a single value
        # (x[mask] = v, x[mask] += v) is a Where, whose gradients are eager's: v gets the sum of
        # dy over the selected positions, x gets dy where it was kept (accumulate: everywhere);
        # no data-dependent size. One mask with values per selected slice (x[mask] = f(x[mask]))
        # is ScatterND at NonZero(mask): the selection's length comes from NonZero's shape (the
        # engine's segmented plans), not from a count computed as data, which torchlib's rule
        # feeds to an Expand. What _CHECKS lets through.
        bool_masks = [i for i in indices if i is not None and i.dtype == ir.DataType.BOOL]
        one_value = all(d == 1 for d in values.shape)
        if bool_masks and not one_value:
            mask = indices[0]
            k = len(mask.shape)
            where = op.Transpose(op.NonZero(mask), perm=[1, 0])     # [count, k]
            target = op.Concat(op.Slice(op.Shape(where), ints([0]), ints([1]), ints([0])),
                               op.Slice(op.Shape(self), ints([k]), ints([len(self.shape)]), ints([0])), axis=0)
            v = values if values.dtype == self.dtype else op.Cast(values, to=self.dtype)
            return op.ScatterND(self, where, op.Expand(v, target), reduction="add" if accumulate else "none")
        if bool_masks:
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

    def masked_select(self: TTensor, mask: TTensor) -> TTensor:
        # eager: self and mask broadcast together, the elements where mask is true in row-major
        # order, as a 1-d tensor whose length is a value (the engine's segmented plans); torchlib
        # has no rule. Expand both ways is their broadcast; the gradient is GatherND's
        # (scattered back) summed to self's shape by Expand's.
        x = op.Expand(self, op.Shape(mask))
        m = op.Expand(mask, op.Shape(x))
        return op.GatherND(x, op.Transpose(op.NonZero(m), perm=[1, 0]), batch_dims=0)

    return {
        torch.ops.aten.masked_select.default: masked_select,
        torch.ops.aten.copy.default: copy,
        torch.ops.aten.index_put.default: index_put,
        torch.ops.aten.scatter_add.default: scatter_add,
    }


def translations(op, ir, stop_gradient):
    """{aten op: rule} of this family."""
    return {**indexing(op, ir, stop_gradient)}
