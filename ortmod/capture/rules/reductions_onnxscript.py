"""The torch.export path's rules for var/std, max/min along a dim, argmax/argmin: onnxscript
functions traced by torch's exporter where torchlib's
translation does not mean what eager training means.

Each function below is handed the opset ``op``, ``onnx_ir`` as ``ir`` and the engine's stop-gradient
op, and returns {aten op: rule} for the rules that share its helpers; ``translations`` is their
union, which ``capture.export_registry`` adds to torchlib's registry."""
import torch


def reductions(op, ir, stop_gradient):
    from typing import Optional, Sequence, Tuple
    from onnxscript.function_libs.torch_lib.tensor_typing import TFloat, TReal, TInt

    I64 = ir.DataType.INT64

    def const(v, dt):
        return op.Constant(value=ir.tensor(v, dtype=dt))

    def ints(v):
        return const(list(v), I64)

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

    return {
        torch.ops.aten.max.dim: extremum_dim(op.ArgMax),
        torch.ops.aten.min.dim: extremum_dim(op.ArgMin),
        torch.ops.aten.argmax.default: arg_extremum(op.ArgMax),
        torch.ops.aten.argmin.default: arg_extremum(op.ArgMin),
        torch.ops.prims.var.default: prims_var,
    }


def translations(op, ir, stop_gradient):
    """{aten op: rule} of this family."""
    return {**reductions(op, ir, stop_gradient)}
