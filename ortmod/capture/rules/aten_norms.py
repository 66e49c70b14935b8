"""Norm rules written once for both capture paths (``emitter.aten_rule``): group_norm,
instance_norm, decomposed: per group of channels of each sample, (x - mean) / sqrt(var + eps),
var biased and two-pass, as eager's kernels. torch's rules go through InstanceNormalization (an
op the engine does not differentiate), need a static channel count (TorchScript) or build float32
default weights whatever the input's dtype (torchlib). Gradients are the engine's autodiff of
these ops: eager's, the mean and variance differentiated as functions of x."""
from typing import Optional

from .emitter import Tensor, aten_rule


def rank_at_least_2(a):
    if a.input.rank is None or a.input.rank < 2:
        return "ortmod needs the input's rank (at least 2) at export"
    return None


def normalized(e, x, groups, eps):
    """(x - mean) / sqrt(var + eps) over each of ``groups`` groups of channels of every sample
    (groups 0: each channel its own group; Reshape's 0 keeps the channel count)."""
    grouped = e.op("Reshape", x, e.ints([0, groups, -1]))
    axes = e.ints([-1])
    mean = e.op("ReduceMean", grouped, axes, keepdims=1)
    centred = e.op("Sub", grouped, mean)
    var = e.op("ReduceMean", e.op("Mul", centred, centred), axes, keepdims=1)
    normed = e.op("Div", centred, e.op("Sqrt", e.op("Add", var, e.const(eps, e.dtype(x)))))
    return e.op("Reshape", normed, e.op("Shape", x))


def per_channel(e, v, rank):
    """A (C,) vector shaped to broadcast over (N, C, *spatial) of the given rank."""
    return e.op("Reshape", v, e.ints([-1] + [1] * (rank - 2)))


def affine(e, y, weight, bias, rank):
    if weight is not None:
        y = e.op("Mul", y, per_channel(e, weight, rank))
    if bias is not None:
        y = e.op("Add", y, per_channel(e, bias, rank))
    return y


@aten_rule("aten::group_norm", checks=(rank_at_least_2,),
           why="decomposed (torch's rules: InstanceNormalization, which the engine does not differentiate)")
def group_norm(e, input: Tensor, num_groups: int, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
               eps: float = 1e-05, cudnn_enabled: bool = True):
    return affine(e, normalized(e, input, num_groups, eps), weight, bias, e.rank(input))


def _statistics_as_eager(a):
    # eager updates the running statistics in place in training; ortmod does not
    stats = a.running_mean is not None and a.running_var is not None
    if a.use_input_stats and stats:
        return ("InstanceNorm with track_running_stats=True in training: ortmod does not update instance "
                "norm's running statistics")
    if not a.use_input_stats and not stats:
        return "instance_norm without input statistics needs running statistics"
    return None


@aten_rule("aten::instance_norm", checks=(rank_at_least_2, _statistics_as_eager),
           why="decomposed; eval reads the running statistics (training with them refused by name)")
def instance_norm(e, input: Tensor, weight: Optional[Tensor] = None, bias: Optional[Tensor] = None,
                  running_mean: Optional[Tensor] = None, running_var: Optional[Tensor] = None,
                  use_input_stats: bool = True, momentum: float = 0.1, eps: float = 1e-05,
                  cudnn_enabled: bool = False):
    """eager: input statistics per (sample, channel) unless use_input_stats is False (eval with
    track_running_stats), where the running statistics are read. The module unsqueezes an
    unbatched input before the op."""
    rank = e.rank(input)
    if use_input_stats:
        y = normalized(e, input, 0, eps)
    else:
        centred = e.op("Sub", input, per_channel(e, running_mean, rank))
        var = e.op("Add", per_channel(e, running_var, rank), e.const(eps, e.dtype(input)))
        y = e.op("Div", centred, e.op("Sqrt", var))
    return affine(e, y, weight, bias, rank)
