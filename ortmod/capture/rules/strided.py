"""as_strided and scatter_reduce on the TorchScript path (issue 37: Longformer's overlapping chunks,
torch_geometric's scatter max).

Eager's ``x.as_strided(size, stride)`` addresses x's *storage*, from x's own storage offset,
with the strides given. torch's symbolic flattens x in its logical (row-major) order and
applies the strides to that: the same only when x is contiguous. Longformer chunks a
transposed view (strides (8, 384, 96, 1) for a (8, 4, 4, 8) tensor), so torch's graph read
other elements than eager and trained silently wrong.

ortmod's rule uses what the trace recorded of x (its sizes and strides): every element of x
sits at a storage position; each element of the result reads one position, which must be one
of x's (a position no element of x covers is memory x does not hold: refused), so the result is
one Gather of x's flattened elements by a constant index. Its gradient is Gather's (a
scatter-add back into x), as eager's for windows that overlap. The index holds for the traced
shapes only: the export records that (``TraceGuards.shapes_frozen``) and a call with other
input sizes exports again.
"""
import torch

from ..onnx_util import _const, _refuse


def _traced_layout(value):
    """(sizes, strides) the trace recorded for a value, or None where either is unknown."""
    t = value.type()
    try:
        sizes, strides = t.sizes(), t.strides()
    except RuntimeError:       # an incomplete tensor type
        return None
    if sizes is None or strides is None or any(s is None for s in list(sizes) + list(strides)):
        return None
    return list(sizes), list(strides)


def _positions(sizes, strides):
    """The storage position, relative to the tensor's offset, of each element (row-major)."""
    pos = torch.zeros((), dtype=torch.int64)
    for k, (n, s) in enumerate(zip(sizes, strides)):
        shape = [1] * len(sizes)
        shape[k] = n
        pos = pos + torch.arange(n, dtype=torch.int64).reshape(shape) * s
    return pos.expand(sizes).reshape(-1) if sizes else pos.reshape(1)


def as_strided_index(in_sizes, in_strides, out_sizes, out_strides):
    """For each element of ``x.as_strided(out_sizes, out_strides)`` (row-major), the row-major
    index of the element of x it reads; a string saying why not where it reads memory x does not
    cover or x's elements overlap in memory."""
    if any(s < 0 for s in list(in_strides) + list(out_strides)):
        return "negative strides"
    have = _positions(in_sizes, in_strides)
    if have.numel() != torch.unique(have).numel():
        return "its input's elements overlap in memory (an expanded view)"
    want = _positions(out_sizes, out_strides)
    if not want.numel():
        return torch.zeros(out_sizes, dtype=torch.int64)
    top = int(max(have.max().item() if have.numel() else -1, want.max().item()))
    lookup = torch.full((top + 1,), -1, dtype=torch.int64)
    lookup[have] = torch.arange(have.numel(), dtype=torch.int64)
    index = lookup[want]
    if (index < 0).any():
        return "it reads storage its input's elements do not cover"
    return index.reshape(out_sizes)


def _as_strided_symbolic(g, self, size, stride, storage_offset=None):
    from ..compat import symbolic_helper as sh
    from ..tracing import _current_recorder
    if storage_offset is not None and not sh.is_none(storage_offset):
        _refuse("as_strided", "an explicit storage_offset: the trace does not record its input's")
    # the traced aten node's values: their types are the trace's (sizes and strides); the
    # converted graph's values may have lost them
    node = getattr(g, "original_node", None)
    layout = _traced_layout(next(node.inputs())) if node is not None else None
    out = _traced_layout(node.output()) if node is not None else None
    stride = sh.maybe_get_const(stride, "is")
    if layout is None or out is None or sh.is_value(stride):
        _refuse("as_strided", "ortmod needs the traced sizes and strides of its input and constant strides")
    index = as_strided_index(layout[0], layout[1], out[0], list(stride))
    if isinstance(index, str):
        _refuse("as_strided", index)
    recorder = _current_recorder()
    if recorder is not None:        # the index holds for the traced shapes only
        recorder.shapes_frozen = True
    flat = g.op("Reshape", self, _const(g, [-1], torch.int64))
    return g.op("Gather", flat, g.op("Constant", value_t=index), axis_i=0)


def symbolics(registration, opset):
    return {"aten::as_strided": _as_strided_symbolic, "aten::scatter_reduce": _scatter_reduce_symbolic}


def _scatter_reduce_symbolic(g, self, dim, index, src, reduce, include_self=True):
    """scatter_reduce: torch's symbolic wraps ScatterElements in two If nodes (for a 0-d self),
    which the engine does not run, so a model reached it as "unsupported op 'If'". ortmod's
    rule emits the scatter alone for what the engine reproduces (sum), and names the rest:
    the engine's ScatterElements has no max/min/mul reduction (torch_geometric's GATConv
    softmax takes a scatter max)."""
    from ..compat import symbolic_helper as sh
    reduce = sh.maybe_get_const(reduce, "s")
    include = sh.maybe_get_const(include_self, "b")
    dim = sh.maybe_get_const(dim, "i")
    if reduce != "sum":
        _refuse("scatter_reduce", f"reduce={reduce!r}: the engine's ScatterElements sums or overwrites only "
                                  "(no max, min, prod or mean reduction)")
    if not isinstance(dim, int) or not isinstance(include, (bool, int)):
        _refuse("scatter_reduce", "needs a constant dim and include_self")
    if not include:
        _refuse("scatter_reduce", "include_self=False is not reproduced by ortmod's rule")
    return g.op("ScatterElements", self, index, src, axis_i=dim, reduction_s="add")
