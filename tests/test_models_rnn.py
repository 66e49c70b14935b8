"""LSTM and GRU classifiers (nn.LSTM / nn.GRU, batch_first) through the engine.

The TorchScript exporter emits one ONNX LSTM/GRU node per layer (with the weights
re-packed by Slice/Concat/Unsqueeze). Until the engine has those ops (forward, gradient
rule, CPU kernel) the parity tests are expected failures naming the op, and
``test_rnn_without_engine_op_raises_naming_it`` checks the error is the clear one.
"""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ortmod
from modelparity import engine_ops, train_parity, train_with_dropout
from ortmod import ORTModule

VOCAB, T, B, CLASSES = 50, 7, 6, 4


class RNNClassifier(nn.Module):
    def __init__(self, cell, p=0.0):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        self.drop = nn.Dropout(p)
        # dropout between stacked layers does not export in training mode (see below)
        self.rnn = cell(16, 32, num_layers=2, batch_first=True)
        self.fc = nn.Linear(32, CLASSES)

    def forward(self, tokens, labels):
        out, _ = self.rnn(self.drop(self.emb(tokens)))
        return F.cross_entropy(self.fc(out[:, -1]), labels)


def make_batches(n=3, seed=5):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(0, VOCAB, (B, T), generator=g), torch.randint(0, CLASSES, (B,), generator=g))
            for _ in range(n)]


def ce(model, batch):
    return model(*batch)


CELLS = [pytest.param(nn.LSTM, id="LSTM"), pytest.param(nn.GRU, id="GRU")]


@pytest.mark.parametrize("cell", CELLS)
def test_rnn_parity_10_steps(cell):
    train_parity(lambda: RNNClassifier(cell), make_batches(), ce)


@pytest.mark.parametrize("cell", CELLS)
def test_rnn_trains_with_dropout(cell):
    train_with_dropout(lambda: RNNClassifier(cell, p=0.3), make_batches(), ce, steps=12, lr=1e-2)


@pytest.mark.parametrize("cell", CELLS)
def test_rnn_without_engine_op_raises_naming_it(cell):
    op = cell.__name__
    if op in engine_ops():
        pytest.skip(f"the engine has {op}: the parity test covers it")
    model = ORTModule(RNNClassifier(cell))
    with pytest.raises(ortmod.UnsupportedOpError, match=f"'{op}'"):
        model(*make_batches(1)[0])


def test_rnn_interlayer_dropout_is_a_clear_export_error():
    """torch's ONNX exporter refuses RNN dropout between layers in training mode: the
    error names the exporter and its cause (no silent fallback)."""
    model = RNNClassifier(nn.LSTM)
    model.rnn = nn.LSTM(16, 32, num_layers=2, batch_first=True, dropout=0.2)
    model = ORTModule(model)
    with pytest.raises(ortmod.ExportError, match="torch.onnx.export failed.*dropout in training mode"):
        model(*make_batches(1)[0])
