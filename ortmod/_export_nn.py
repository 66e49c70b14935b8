"""ortmod's export rules for nn layers whose stock TorchScript rule is missing or narrower than
eager (pools on unbatched inputs or with output sizes that do not divide the input, norms):
each a faithful decomposition into ops the engine runs, checked against eager, or a refusal
that names what it cannot reproduce.

``symbolics(registration, opset)`` returns {aten name: symbolic}; ``semantic_export``
registers them only while ortmod exports."""
import torch


def symbolics(registration, opset):
    rules = {}
    rules["aten::fractional_max_pool2d"] = _fractional_max_pool_symbolic(2)
    rules["aten::fractional_max_pool3d"] = _fractional_max_pool_symbolic(3)
    return rules


# ---------------------------------------------------------------------------------------------
# fractional max pooling

# which entry of a plane's random samples places the windows along each spatial dim (found
# against eager: 2-D takes W from sample 0 and H from sample 1; 3-D takes T, H, W in order)
_FRACTIONAL_SAMPLE_OF_DIM = {2: (1, 0), 3: (0, 1, 2)}


def _fractional_starts(g, x, samples, axis, d, length_k, o, k, dtype):
    """Window starts along spatial dim d for every plane, (N, C, o) int64, computed in the
    graph as eager's generate_intervals does in the input's dtype: alpha = float(L - k) /
    float(o - 1); start j = int((j + u) * alpha) - int(u * alpha) for j < o - 1 (floor: every
    term is >= 0); the last window starts at L - k. The samples are a graph input (the module's
    ``_random_samples``), so new samples need no new export."""
    from ._semantics import _const
    import torch as _t
    u = g.op("Gather", samples, _const(g, _FRACTIONAL_SAMPLE_OF_DIM[len(k)][d], _t.int64), axis_i=2)   # (N, C)
    u = g.op("Unsqueeze", u, _const(g, [2], _t.int64))                                                  # (N, C, 1)
    last = g.op("Expand", g.op("Reshape", length_k, _const(g, [1, 1, 1], _t.int64)), g.op("Shape", u))
    if o[d] == 1:
        return last
    alpha = g.op("Div", g.op("Cast", length_k, to_i=_onnx_type(dtype)), _const(g, float(o[d] - 1), dtype))
    j = _const(g, [float(v) for v in range(o[d] - 1)], dtype)
    first = g.op("Floor", g.op("Mul", g.op("Add", u, j), alpha))
    shift = g.op("Floor", g.op("Mul", u, alpha))
    starts = g.op("Cast", g.op("Sub", first, shift), to_i=_onnx_type(_t.int64))
    return g.op("Concat", starts, last, axis_i=2)


def _onnx_type(dtype):
    from ._semantics import _onnx_dtype
    return _onnx_dtype(dtype)


def _fractional_max_pool_symbolic(rank):
    """eager (FractionalMaxPool{2,3}d.cpp): along each dim the windows start as
    ``_fractional_starts`` computes from the plane's sample; each output is its window's max
    (NaN wins, else the first max in row-major order) and its gradient goes to that one tap.
    Exported as: the taps gathered into a tensor where every window is one k1 x k2 (x k3) block
    (GatherElements over the flattened plane; overlapping windows' gradients add, as eager's
    do), then MaxPool with kernel = stride = k, which scans each block in eager's order; its
    Indices map back through the tap table to eager's flat index in the plane. The samples must
    be a tensor of the module (``_random_samples``): windows drawn from torch's RNG on every call
    cannot be replayed."""
    what = f"fractional_max_pool{rank}d"

    def symbolic(g, x, kernel_size, output_size, random_samples):
        from torch.onnx import symbolic_helper as sh
        from ._semantics import _const, _refuse, _dtype_of, _input_rank_or_none
        kernel = sh._maybe_get_const(kernel_size, "is")
        out_size = sh._maybe_get_const(output_size, "is")
        if sh._is_value(kernel) or sh._is_value(out_size):
            _refuse(what, "ortmod needs kernel_size and output_size as constants")
        k, o = [int(v) for v in kernel], [int(v) for v in out_size]
        if random_samples.node().kind() not in ("prim::Param", "onnx::Constant"):
            _refuse(what, "its windows are drawn from torch's random generator on every call, which the "
                    "engine cannot replay; pass _random_samples to fix them")
        x_rank = _input_rank_or_none(x)
        if x_rank not in (rank + 1, rank + 2) or _input_rank_or_none(random_samples) != 3:
            _refuse(what, f"ortmod needs an input of rank {rank + 1} or {rank + 2} and samples of rank 3")
        dtype = _dtype_of(x)
        if _dtype_of(random_samples, None) != dtype:
            _refuse(what, "ortmod needs the random samples in the input's dtype (as eager's kernel reads them)")
        i64 = torch.int64
        if x_rank == rank + 1:   # unbatched: eager takes the samples' batch of one
            x = g.op("Unsqueeze", x, _const(g, [0], i64))
        shape = g.op("Shape", x)
        # eager reads the samples of plane (n, c) and ignores any beyond the input's (an
        # unbatched input takes batch entry 0)
        random_samples = g.op("Slice", random_samples, _const(g, [0, 0], i64),
                              g.op("Slice", shape, _const(g, [0], i64), _const(g, [2], i64)), _const(g, [0, 1], i64))
        lengths = [g.op("Gather", shape, _const(g, [2 + d], i64), axis_i=0) for d in range(rank)]
        table = None
        stride = _const(g, [1], i64)
        for d in reversed(range(rank)):   # tap (n, c, o1, p1, ..., ok, pk) -> flat index in its plane
            starts = _fractional_starts(g, x, random_samples, 2 + d, d,
                                        g.op("Sub", lengths[d], _const(g, [k[d]], i64)), o, k, dtype)
            spread = [a for a in range(2, 2 + 2 * rank) if a != 2 + 2 * d]   # (N, C, .., o_d, ..)
            taps = [1] * (2 * rank)
            taps[2 * d + 1] = k[d]
            pos = g.op("Add", g.op("Unsqueeze", starts, _const(g, spread, i64)),
                       _const(g, torch.arange(k[d]).reshape([1, 1] + taps), i64))
            term = g.op("Mul", pos, stride)
            table = term if table is None else g.op("Add", term, table)
            stride = g.op("Mul", stride, lengths[d])
        # the table is built in ONNX broadcasting: (N, C, o1, p1, ...) once both sides met
        flat = g.op("Reshape", x, _const(g, [0, 0, -1], i64))
        table = g.op("Reshape", table, _const(g, [0, 0, -1], i64))
        gathered = g.op("GatherElements", flat, table, axis_i=2)
        blocks = g.op("Concat", g.op("Slice", shape, _const(g, [0], i64), _const(g, [2], i64)),
                      _const(g, [a * b for a, b in zip(o, k)], i64), axis_i=0)
        gathered = g.op("Reshape", gathered, blocks)
        y, idx = g.op("MaxPool", gathered, kernel_shape_i=k, strides_i=k, outputs=2)
        idx = g.op("Gather", g.op("Reshape", table, _const(g, [-1], i64)), idx, axis_i=0)
        if x_rank == rank + 1:
            y = g.op("Squeeze", y, _const(g, [0], i64))
            idx = g.op("Squeeze", idx, _const(g, [0], i64))
        return y, idx

    return symbolic
