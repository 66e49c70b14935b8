"""TorchScript rules that replace torch's stock ones where those are not eager's: a stock rule
that writes an op the engine refuses (movedim's negative perm). (log_sigmoid, which torch's rule
computed as Log(Sigmoid(x)), is written once for both paths: rules/aten_activations.py.)"""
import torch

from ..onnx_util import _input_rank_or_none, _refuse


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


def _squeeze_symbolic(original):
    """eager squeeze(x, dim): drops dim when its size is 1, else returns x. Where the exporter's
    shape inference lost that dim's size (a dynamic Reshape upstream: nn.MultiheadAttention's
    packed in-projection, ``unflatten(-1, (3, E)).unsqueeze(0).transpose(0, -2).squeeze(-2)``),
    torch's rule writes an ONNX If on Shape(x)[dim] == 1, which the engine does not run (model
    fuzzer: "unsupported op 'If'" in every MHA on this path). The same choice without a branch:
    Reshape(x, Shape(x) with [dim] kept only where its size is not 1). Its numbers are all
    shape arithmetic, which the engine folds at plan time for the call's shapes, so every
    input shape gets eager's result (and Reshape's gradient). Known sizes keep torch's rule."""
    from ..compat import symbolic_helper as sh

    def rule(g, x, dim=None):
        if dim is None or not sh.is_constant(dim):
            return original(g, x, dim)
        d = torch.as_tensor(sh.maybe_get_const(dim, "t")).reshape(-1).tolist()   # squeeze.dim or .dims
        if len(d) != 1:
            return original(g, x, dim)
        d = int(d[0])
        rank = _input_rank_or_none(x)
        known = rank is not None and sh.get_tensor_dim_size(x, d + rank if d < 0 else d) is not None
        if known or rank == 0:
            return original(g, x, dim)
        i64 = lambda v: g.op("Constant", value_t=torch.tensor(v, dtype=torch.int64))
        shape = g.op("Shape", x)
        if d >= 0:
            lo = i64([d])
        elif rank is not None:
            lo = i64([d + rank])
        else:
            lo = g.op("Add", g.op("Shape", shape), i64([d]))
        hi = g.op("Add", lo, i64([1]))
        is_one = g.op("Cast", g.op("Equal", g.op("Slice", shape, lo, hi), i64([1])), to_i=7)  # int64
        kept = g.op("Slice", shape, lo, g.op("Sub", hi, is_one))     # [] where the size is 1
        target = g.op("Concat", g.op("Slice", shape, i64([0]), lo), kept,
                      g.op("Slice", shape, hi, i64([2 ** 63 - 1])), axis_i=0)
        return g.op("Reshape", x, target, allowzero_i=1)
    return rule
