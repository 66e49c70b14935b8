"""The torch.export path's rules for cross_entropy: onnxscript functions traced by torch's exporter where torchlib's
translation does not mean what eager training means.

Each function below is handed the opset ``op``, ``onnx_ir`` as ``ir`` and the engine's stop-gradient
op, and returns {aten op: rule} for the rules that share its helpers; ``translations`` is their
union, which ``capture.export_registry`` adds to torchlib's registry."""
import torch


def losses(op, ir, stop_gradient):
    from typing import Optional
    from onnxscript.function_libs.torch_lib.tensor_typing import TFloat, TTensor
    from onnxscript.function_libs.torch_lib.ops import nn as tl_nn

    I64 = ir.DataType.INT64

    def const(v, dt):
        return op.Constant(value=ir.tensor(v, dtype=dt))

    def ints(v):
        return const(list(v), I64)

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

    return {
        torch.ops.aten.cross_entropy_loss.default: cross_entropy,
        torch.ops.ortmod.cross_entropy_loss.default: cross_entropy,       # unbatched_cross_entropy_loss
    }


def translations(op, ir, stop_gradient):
    """{aten op: rule} of this family."""
    return {**losses(op, ir, stop_gradient)}
