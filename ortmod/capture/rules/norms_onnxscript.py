"""The torch.export path's rule for batch norm without running stats (group_norm and instance_norm
are written once for both paths: rules/aten_norms.py, whose decomposition this one shares):
onnxscript functions traced by torch's exporter where torchlib's translation does not mean what
eager training means.

Each function below is handed the opset ``op``, ``onnx_ir`` as ``ir`` and the engine's stop-gradient
op, and returns {aten op: rule} for the rules that share its helpers; ``translations`` is their
union, which ``capture.export_registry`` adds to torchlib's registry."""
import torch

from .aten_norms import affine
from .emitter import OnnxscriptEmitter


def norms(op, ir, stop_gradient):
    from typing import Optional, Tuple
    from onnxscript.function_libs.torch_lib.tensor_typing import TFloat

    I64 = ir.DataType.INT64

    def const(v, dt):
        return op.Constant(value=ir.tensor(v, dtype=dt))

    def ints(v):
        return const(list(v), I64)

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
        y = affine(OnnxscriptEmitter(op, ir, stop_gradient), op.Mul(centred, invstd), weight, bias, rank)
        return y, op.Reshape(mean, ints([-1])), op.Reshape(invstd, ints([-1]))

    return {
        # norms (issue 16; group_norm and instance_norm: rules/aten_norms.py)
        torch.ops.aten._native_batch_norm_legit.no_stats: batch_norm_no_stats,
    }


def translations(op, ir, stop_gradient):
    """{aten op: rule} of this family."""
    return {**norms(op, ir, stop_gradient)}
