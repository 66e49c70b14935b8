"""TorchScript rules that replace torch's stock ones where those are not eager's: a stock rule
that loses eager's precision or range (log_sigmoid as Log(Sigmoid(x))), or writes an op the
engine refuses (movedim's negative perm)."""
import torch

from ..onnx_util import _input_rank_or_none, _refuse


def _log_sigmoid_symbolic(g, x):
    """eager (log_sigmoid CPU kernel): min(x, 0) - log1p(exp(-|x|)), as -Softplus(-x) (the
    engine's Softplus takes eager's two branches; the export path's rule). torch's rule,
    Log(Sigmoid(x)), is -inf where sigmoid underflows (x < -745 in float64, -104 in float32)
    and loses log1p's precision for large x: 3.6e-8 relative at x = 20 in float64, 0 for
    -exp(-x) past 37."""
    return g.op("Neg", g.op("Softplus", g.op("Neg", x)))


def _movedim_symbolic(g, x, source, destination):
    """eager (TensorShape.cpp movedim): source dims to destination positions, the others in
    order, negative dims counted from the end. torch's rule indexes its perm list with the
    negative dims as they are: movedim(-1, 1) on rank 4 gave Transpose perm [0, -1, 1, 2]
    (the engine refused its gradient: 'invalid perm'; model fuzzer, a channels-last norm)."""
    from ..compat import symbolic_helper as sh
    what = "movedim"
    rank = _input_rank_or_none(x)
    src, dst = sh.maybe_get_const(source, "t"), sh.maybe_get_const(destination, "t")
    if rank is None or sh.is_value(src) or sh.is_value(dst):
        _refuse(what, "ortmod needs the input's rank and constant dims at export")
    as_list = lambda v: torch.as_tensor(v).reshape(-1).tolist() if not isinstance(v, (list, tuple)) else list(v)
    src, dst = [int(v) for v in as_list(src)], [int(v) for v in as_list(dst)]
    norm = lambda d: d + rank if d < 0 else d
    src, dst = [norm(d) for d in src], [norm(d) for d in dst]
    if len(src) != len(dst) or len(set(src)) != len(src) or len(set(dst)) != len(dst) or \
            not all(0 <= d < max(rank, 1) for d in src + dst):
        _refuse(what, f"source {src} and destination {dst} are not distinct dims of a rank-{rank} input")
    perm = [-1] * rank
    for a, b in zip(src, dst):
        perm[b] = a
    rest = iter(d for d in range(rank) if d not in src)
    perm = [p if p >= 0 else next(rest) for p in perm]
    if perm == list(range(rank)):
        return x
    return g.op("Transpose", x, perm_i=perm)


def _one_hot_symbolic(g, x, num_classes):
    """eager (one_hot): a class below 0 or at least num_classes raises. torch's rule writes ONNX
    OneHot, which wraps a negative class (-1 is the last): a negative class is sent to
    num_classes here, out of range, so the engine's OneHot raises as eager does.
    num_classes=-1 (the largest class + 1: a size read from the data) is refused."""
    from ..compat import symbolic_helper as sh
    n = sh.maybe_get_const(num_classes, "i")
    if sh.is_value(n) or not isinstance(n, int) or n < 0:
        _refuse("one_hot", "needs num_classes as a number (not the largest class + 1, a size read from the data)")
    depth = g.op("Constant", value_t=torch.tensor(n, dtype=torch.int64))
    x = g.op("Cast", x, to_i=7)
    x = g.op("Where", g.op("Less", x, g.op("Constant", value_t=torch.tensor(0, dtype=torch.int64))), depth, x)
    return g.op("OneHot", x, depth, g.op("Constant", value_t=torch.tensor([0, 1], dtype=torch.int64)), axis_i=-1)
