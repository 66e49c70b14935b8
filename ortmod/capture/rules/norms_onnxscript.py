"""The torch.export path's rules for group_norm, instance_norm, batch norm without running stats:
onnxscript functions traced by torch's exporter where torchlib's
translation does not mean what eager training means.

Each function below is handed the opset ``op``, ``onnx_ir`` as ``ir`` and the engine's stop-gradient
op, and returns {aten op: rule} for the rules that share its helpers; ``translations`` is their
union, which ``capture.export_registry`` adds to torchlib's registry."""
import torch


def norms(op, ir, stop_gradient):
    from typing import Optional, Tuple
    from onnxscript.function_libs.torch_lib.tensor_typing import TFloat

    I64 = ir.DataType.INT64

    def const(v, dt):
        return op.Constant(value=ir.tensor(v, dtype=dt))

    def ints(v):
        return const(list(v), I64)

    # ---- norms: group_norm, instance_norm, batch norm without running stats (issue 16) ---------
    # The TorchScript path's decomposition (rules/symbolics.py _normalized/_affine): per group
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

    return {
        # norms (issue 16)
        torch.ops.aten.group_norm.default: group_norm,
        torch.ops.aten.instance_norm.default: instance_norm,
        torch.ops.aten._native_batch_norm_legit.no_stats: batch_norm_no_stats,
    }


def translations(op, ir, stop_gradient):
    """{aten op: rule} of this family."""
    return {**norms(op, ir, stop_gradient)}
