"""The torch.export path's rules for .item(), add/sub with alpha: onnxscript functions
traced by torch's
exporter where torchlib's translation does not mean what eager training means.

Each function below is handed the opset ``op``, ``onnx_ir`` as ``ir`` and the engine's stop-gradient
op, and returns {aten op: rule} for the rules that share its helpers; ``translations`` is their
union, which ``capture.export_registry`` adds to torchlib's registry."""
import torch


def elementwise(op, ir, stop_gradient):
    from onnxscript.function_libs.torch_lib.tensor_typing import TReal, TTensor
    from onnxscript.function_libs.torch_lib.ops import core as tl_core

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

    return {
        torch.ops.aten.add.Tensor: add_sub(op.Add, tl_core.aten_add, scalar=False),
        torch.ops.aten.sub.Tensor: add_sub(op.Sub, tl_core.aten_sub, scalar=False),
        torch.ops.aten.add.Scalar: add_sub(op.Add, tl_core.aten_add, scalar=True),
        torch.ops.aten.sub.Scalar: add_sub(op.Sub, tl_core.aten_sub, scalar=True),
        torch.ops.aten._local_scalar_dense.default: local_scalar_dense,
    }


def translations(op, ir, stop_gradient):
    """{aten op: rule} of this family."""
    return {**elementwise(op, ir, stop_gradient)}
