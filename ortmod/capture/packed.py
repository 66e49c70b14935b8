"""Packed sequences (issue 37): ``pack_padded_sequence`` -> nn.LSTM / nn.GRU / nn.RNN ->
``pad_packed_sequence`` inside the forward.

**TorchScript path: captured.** torch's exporter turns the pair into what the engine runs: its
symbolics emit prim::PackPadded / prim::PadPacked around the RNN, whose ONNX node takes the
batch_sizes as ``sequence_lens``, and its peephole passes (pushPackingPastRnn, removeNopPacking)
replace them by the lengths and drop the pair. The engine's LSTM / GRU / RNN implement
``sequence_lens`` (csrc/ops/rnn.c): Y is zero and the state held past each length, the reverse
direction starts at len - 1, which is what a packed batch means; h_n is each sequence's last
state. enforce_sorted=False is traced as eager computes it (sort, index_select, the inverse
permutation of the outputs and of h_n).

What torch's rules leave out, and is done here while the module is traced (``_TracingVF``,
swapped in for torch.nn.utils.rnn's ``_VF``):

- the padded output's length. Eager pads to max(lengths), or to total_length; the graph's RNN
  output has the input's time length T. The padded output is cut (or extended) to the eager
  length from T, and what that takes is guarded: T - max(lengths), or whether T reaches
  total_length. A call that changes it exports again (a loader that pads each batch to its
  longest sequence keeps T - max(lengths) = 0: one export for every batch);
- the checks eager makes on the lengths (each > 0; sorted when enforce_sorted; total_length at
  least the longest): guarded too, so a call that breaks them exports again, and the export's
  eager run raises eager's error;
- ``padding_value`` (the graph's RNN gives zeros past each length): put back with a mask;
- the lengths ``pad_packed_sequence`` returns: the int64 lengths given to the pack (the
  exporter's are an int32 cast).

Refused by name (``UNPAIRED``): a PackedSequence made outside the forward (passed in), a pack
whose RNN output is not padded in the forward (returned, or only h_n used), a packed sequence
used any other way (an RNN cell looping over batch_sizes) — torch's exporter cannot drop the
pack there — and a pad of anything but RNNs' output on the pack (a pack padded again as it is,
packed data changed by another op): torch's exporter would hand back the padded input's own
values past each length, where eager pads.

**torch.export path: refused by name** (``refusing_packed_sequences``); the default capture
("auto") falls back to the TorchScript path, which captures them.

Leaf-level: imports errors, compat (torch's private _VF) and tracing (the guards)."""
import contextlib

import torch

from .compat import pytree, rnn_packing_vf, set_rnn_packing_vf, traced_value
from .errors import ExportError, UnsupportedModelError, user_frame
from .tracing import current_records, read_unguarded, record_guard

MESSAGE = ("packed sequences (torch.nn.utils.rnn.pack_padded_sequence / pack_sequence / pad_packed_sequence) "
           "are captured on ortmod's TorchScript path only, not on the torch.export path: the default capture "
           "(capture='auto') falls back to it, DebugOptions(capture='torchscript') or ORTMOD_CAPTURE=torchscript "
           "picks it")

UNPAIRED = ("packed sequences: ortmod captures pack_padded_sequence -> nn.LSTM / nn.GRU / nn.RNN -> "
            "pad_packed_sequence inside the forward, each pack's RNN output padded there (call "
            "pad_packed_sequence on it even if only h_n is used); not a PackedSequence passed in or returned, "
            "nor one used any other way (an RNN cell looping over batch_sizes): pass the padded batch and its "
            "lengths, and pack and pad inside the forward")


def refuse_packed_arguments(flat):
    """A PackedSequence among the call's arguments (``flat``: flatten.FlatInputs) is refused by
    name: it was packed outside the forward, where no capture sees the lengths."""
    if isinstance(flat.structure, tuple):      # ("tensors", ...): every argument a tensor
        return
    is_packed = (lambda v: isinstance(v, torch.nn.utils.rnn.PackedSequence))
    if any(is_packed(v) for v in pytree.tree_leaves(flat._tree, is_leaf=is_packed)):
        raise UnsupportedModelError(f"{UNPAIRED} (a PackedSequence is an argument of the call)")


class _RefusingVF:
    """torch.nn.utils.rnn's ``_VF`` with its two packing ops refused; everything else as torch's."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        if name in ("_pack_padded_sequence", "_pad_packed_sequence"):
            raise UnsupportedModelError(MESSAGE)
        return getattr(self._real, name)


@contextlib.contextmanager
def refusing_packed_sequences():
    """While capturing on the torch.export path: a packing op raises UnsupportedModelError naming
    packed sequences."""
    real = rnn_packing_vf()
    set_rnn_packing_vf(_RefusingVF(real))
    try:
        yield
    finally:
        set_rnn_packing_vf(real)


class _Pack:
    """What one traced pack keeps for its pad: the batch_sizes it made (the pad's key), the
    padded input's time length (a traced size) and the int64 lengths it packed (traced)."""
    __slots__ = ("data", "batch_sizes", "time", "lengths", "padded")

    def __init__(self, data, batch_sizes, time, lengths):
        self.data, self.batch_sizes, self.time, self.lengths, self.padded = data, batch_sizes, time, lengths, False


class _TracingVF:
    """torch.nn.utils.rnn's ``_VF`` while the TorchScript path traces: the two packing ops run as
    torch's, with the length, checks and padding value eager's graph needs (the module docstring).
    Outside a trace (the export's eager run) they are torch's."""

    def __init__(self, real):
        self._real = real
        self.packs = []

    def __getattr__(self, name):
        return getattr(self._real, name)

    def _pack_padded_sequence(self, input, lengths, batch_first):
        data, batch_sizes = self._real._pack_padded_sequence(input, lengths, batch_first)
        if torch.jit.is_tracing():
            where = user_frame(3)
            # eager's checks on the lengths, which the graph does not make (what the pack gets is
            # sorted by the traced sort when enforce_sorted=False)
            valid = (lengths.min() > 0) & (lengths[:-1] >= lengths[1:]).all()
            record_guard(valid, "packed sequence lengths (each > 0, decreasing when enforce_sorted)", where)
            self.packs.append(_Pack(data, batch_sizes, input.shape[1 if batch_first else 0], lengths))
        return data, batch_sizes

    def _pad_packed_sequence(self, data, batch_sizes, batch_first, padding_value, total_length):
        if not torch.jit.is_tracing():
            return self._real._pad_packed_sequence(data, batch_sizes, batch_first, padding_value, total_length)
        pack = next((p for p in self.packs if p.batch_sizes is batch_sizes), None)
        if pack is None:
            raise UnsupportedModelError(f"{UNPAIRED} (a PackedSequence not packed in this forward is padded at "
                                        f"{user_frame(3)})")
        where = user_frame(3)
        if not _from_rnns(data, pack):
            raise UnsupportedModelError(f"{UNPAIRED} (what is padded at {where} is not an nn.LSTM / nn.GRU / "
                                        "nn.RNN output on the packed input: torch's exporter would give the padded "
                                        "input's own values past each length, where eager pads)")
        pack.padded = True
        _drop_guards_on(pack)
        axis = 1 if batch_first else 0
        # padded to the input's length T, as the graph's RNN output is; then cut or extended to eager's
        # (the length as a number: the exporter's rule ignores it, a traced one would be guarded)
        padded, _ = self._real._pad_packed_sequence(data, batch_sizes, batch_first, padding_value,
                                                    read_unguarded(pack.time))
        lengths = pack.lengths
        if padding_value != 0:      # the graph's RNN gives zeros past each length
            steps = torch.arange(padded.shape[axis]).unsqueeze(1)           # (T, 1) < (B,): (T, B)
            inside = steps < lengths
            inside = (inside.transpose(0, 1) if batch_first else inside).unsqueeze(-1)
            padded = torch.where(inside, padded, torch.full_like(padded, padding_value))
        padded = _to_length(padded, axis, lengths, _target_length(total_length, pack), padding_value, where)
        # the traced call must give eager's length (pad_packed_sequence's total_length, or the longest)
        if _number(padded.shape[axis]) != _number(total_length):
            raise RuntimeError(f"ortmod: the padded packed sequence at {where} has {_number(padded.shape[axis])} "
                               f"steps in the trace, eager's {_number(total_length)}")
        return padded, lengths


def _number(v):
    return read_unguarded(v) if isinstance(v, torch.Tensor) else int(v)


def _to_length(padded, axis, lengths, target, padding_value, where):
    """``padded`` (T steps on ``axis``, as the graph's RNN output) cut or extended to eager's
    length: the longest sequence's (``target`` None) or ``target``; what that takes, guarded."""
    rows = padded.shape[axis]   # traced from the RNN's output: keeps the pad in the graph
    if target is None:          # the longest sequence: T - (T - max), with T - max guarded
        slack = record_guard(rows - lengths.max(), "packed sequence: padded length - longest length", where)
        return padded.narrow(axis, 0, rows - slack) if slack else padded
    record_guard(lengths.max() <= target, "packed sequence: total_length >= longest length", where)
    if record_guard(rows >= target, "packed sequence: padded length >= total_length", where):
        return padded.narrow(axis, 0, target)
    fill = torch.full_like(padded.narrow(axis, 0, 1), padding_value)
    shape = list(padded.shape)
    shape[axis] = target - rows
    return torch.cat([padded, fill.expand(shape)], axis)


_RNN_OPS = ("aten::lstm", "aten::gru", "aten::rnn_tanh", "aten::rnn_relu")


def _from_rnns(data, pack):
    """Whether the trace computes the packed ``data`` by RNNs from the pack's data, one or more in a
    chain: what torch's exporter turns into RNN nodes with sequence_lens, whose outputs are zero
    past each length as eager's padding. (A pack padded again as it is, or packed data changed
    by another op, would keep the padded input's own values there.)"""
    source = traced_value(pack.data).unique()
    v, rnns = traced_value(data), 0
    while v.unique() != source:
        node = v.node()
        if node.kind() not in _RNN_OPS or list(node.outputs())[0].unique() != v.unique():   # (not h_n)
            return False
        v, rnns = list(node.inputs())[0], rnns + 1
    return rnns > 0


def _drop_guards_on(pack):
    """The guards torch's own code took on the pack's sizes (the RNN's input checks: the packed
    data's feature size, int(batch_sizes[0]) as the batch size; pad_packed_sequence's total_length
    against batch_sizes.size(0)) are dropped: as graph outputs they would keep the pack's outputs in
    the graph, and torch's exporter drops the pack only when the RNN and the pad are their sole
    users. They hold by construction once the pack's guards do (the lengths > 0 make
    batch_sizes[0] the batch size; total_length is guarded against the lengths here). A value the
    user's code read from the pack (a loop over batch_sizes), or any code from the packed data's
    values, is refused by name (``UNPAIRED``)."""
    records = current_records()
    if not records:
        return
    # (tensor, kind, value, where, internal): internal, taken in a library's code (torch's)
    reads = [(r, _pack_reads(r[0], pack)) for r in records]
    refused = next((r for r, how in reads if how == "values" or how and not r[4]), None)
    if refused is not None:
        raise UnsupportedModelError(f"{UNPAIRED} (the forward reads the packed sequence: {refused[1]} at "
                                    f"{refused[3]})")
    records[:] = [r for r, how in reads if how is None]


def _pack_reads(tensor, pack):
    """How the trace computes ``tensor`` from the pack's outputs: "values" where it reads the packed
    data's values, "sizes" where it reads only the batch_sizes or the data's sizes, None where it
    does not read them."""
    return _value_reads(traced_value(tensor), pack)


def _value_reads(value, pack):
    """``_pack_reads`` of a value of the trace's graph."""
    data, batch_sizes = traced_value(pack.data).unique(), traced_value(pack.batch_sizes).unique()
    stack, seen, found = [value], set(), None
    while stack:
        v = stack.pop()
        if v.unique() in seen:
            continue
        seen.add(v.unique())
        if v.unique() == data:
            return "values"
        node = v.node()
        if v.unique() == batch_sizes or node.kind() == "aten::size" and _value_reads(list(node.inputs())[0], pack):
            found = "sizes"     # (the size of the data, or of an RNN's output on it)
            continue
        stack.extend(node.inputs())
    return found


def _target_length(total_length, pack):
    """The length eager pads to: None for the longest sequence's, else the caller's total_length
    (an int, or a size the trace follows). pad_packed_sequence passes batch_sizes.size(0) (the
    longest length) when it is given no total_length: a traced value read from the pack is that."""
    if not isinstance(total_length, torch.Tensor):
        return int(total_length)
    return None if _pack_reads(total_length, pack) else total_length


@contextlib.contextmanager
def tracing_packed_sequences():
    """While the TorchScript path captures: packed pairs traced as ``_TracingVF`` says; what
    torch's exporter cannot drop is refused by name."""
    real = rnn_packing_vf()
    vf = _TracingVF(real)
    set_rnn_packing_vf(vf)
    try:
        yield
    except ExportError as e:
        # torch's "Cannot export individual pack_padded_sequence or pad_packed_sequence; these
        # operations must occur in pairs": said by name; any other failure is the exporter's own
        if vf.packs and ("must occur in pairs" in str(e) or not all(p.padded for p in vf.packs)):
            raise UnsupportedModelError(f"{UNPAIRED} (torch's exporter: {str(e)[:300]})") from e
        raise
    finally:
        set_rnn_packing_vf(real)
    unpadded = [p for p in vf.packs if not p.padded]
    if unpadded:
        raise UnsupportedModelError(f"{UNPAIRED} (a packed sequence's RNN output is not padded in the forward)")
