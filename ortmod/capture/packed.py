"""Packed sequences (``pack_padded_sequence`` -> nn.LSTM / nn.GRU / nn.RNN -> ``pad_packed_sequence``)
while ortmod captures: refused by name on both capture paths.

The engine's LSTM / GRU / RNN ops implement ONNX's ``sequence_lens`` on the CPU, forward and
backward (csrc/ops/rnn.c), which is what a packed batch means; the capture does not yet turn the
packed pair into the padded RNN with the lengths as an input. Without this, torch.export fails deep
in torch ("zeros(): argument 'size' ... got FakeTensor") and the TorchScript exporter with "these
operations must occur in pairs"; this says what is not supported instead.

A leaf: imports nothing of ortmod but errors and compat (torch's private _VF)."""
import contextlib

from .compat import rnn_packing_vf, set_rnn_packing_vf
from .errors import UnsupportedModelError

MESSAGE = ("packed sequences (torch.nn.utils.rnn.pack_padded_sequence / pack_sequence / pad_packed_sequence) "
           "are not supported by ortmod's capture yet: pass the padded batch to the RNN instead (the engine's "
           "LSTM/GRU/RNN ops implement sequence_lens, but the capture does not produce them)")


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
    """While capturing: a packing op raises UnsupportedModelError naming packed sequences."""
    real = rnn_packing_vf()
    set_rnn_packing_vf(_RefusingVF(real))
    try:
        yield
    finally:
        set_rnn_packing_vf(real)
