"""Packed sequences (issue 37): pack_padded_sequence -> nn.LSTM / nn.GRU / nn.RNN ->
pad_packed_sequence is refused by name on both capture paths (the engine implements sequence_lens,
tests/test_ops_rnn.py; the capture does not yet produce it). Before, torch.export failed deep in
torch ("zeros(): argument 'size' ... got FakeTensor") and the TorchScript exporter with "must
occur in pairs". The refusal must not leak: eager packing outside a capture still works, and the
same model on the padded batch still trains."""
import copy

import pytest
import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from ortmod import DebugOptions, ORTModule, UnsupportedModelError

PATHS = ["torchscript", "export"]


class Packed(nn.Module):
    def __init__(self, cell, batch_first, enforce_sorted):
        super().__init__()
        self.rnn = cell(4, 5, num_layers=2, bidirectional=True, batch_first=batch_first)
        self.out = nn.Linear(10, 3)
        self.batch_first, self.enforce_sorted = batch_first, enforce_sorted

    def forward(self, x, lengths):
        p = pack_padded_sequence(x, lengths, batch_first=self.batch_first, enforce_sorted=self.enforce_sorted)
        y, _ = self.rnn(p)
        y, _ = pad_packed_sequence(y, batch_first=self.batch_first)
        return self.out(y).sum()


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("cell", [nn.LSTM, nn.GRU, nn.RNN])
@pytest.mark.parametrize("batch_first,enforce_sorted", [(True, False), (False, True)])
def test_packed_pair_is_refused_by_name(path, cell, batch_first, enforce_sorted):
    torch.manual_seed(0)
    m = Packed(cell, batch_first, enforce_sorted)
    x = torch.randn(3, 6, 4) if batch_first else torch.randn(6, 3, 4)
    lengths = torch.tensor([6, 4, 1])
    w = ORTModule(copy.deepcopy(m), DebugOptions(capture=path))
    with pytest.raises(UnsupportedModelError, match="packed sequences"):
        w(x, lengths)
    # the capture's patch is gone: eager packing works after the refusal
    assert torch.isfinite(m(x, lengths)).all()


@pytest.mark.parametrize("path", PATHS)
def test_the_padded_batch_still_trains(path):
    """The refusal names the way around it: the RNN on the padded batch (no packing) trains with
    SGD parity against eager."""
    torch.manual_seed(0)
    rnn = nn.LSTM(4, 5, batch_first=True)
    ref = copy.deepcopy(rnn)
    w = ORTModule(copy.deepcopy(rnn), DebugOptions(capture=path))
    opt_e = torch.optim.SGD(ref.parameters(), lr=0.1)
    opt_w = torch.optim.SGD(w.parameters(), lr=0.1)
    for step in range(2):
        x = torch.randn(3, 6, 4)
        le, lw = ref(x)[0].pow(2).sum(), w(x)[0].pow(2).sum()
        assert abs(le.item() - lw.item()) <= 1e-4 * max(1.0, abs(le.item()))
        opt_e.zero_grad(), opt_w.zero_grad()
        le.backward(), lw.backward()
        for (name, a), b in zip(ref.named_parameters(), w.parameters()):
            err = (a.grad - b.grad).abs().max() / a.grad.abs().max().clamp_min(1e-12)
            assert err < 1e-4, (step, name, err.item())
        opt_e.step(), opt_w.step()
