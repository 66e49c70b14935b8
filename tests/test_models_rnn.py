"""LSTM, GRU and RNN classifiers (nn.LSTM / nn.GRU / nn.RNN, batch_first) through the engine.

The TorchScript exporter emits one ONNX LSTM/GRU/RNN node per layer and direction set (with
the weights re-packed by Slice/Concat/Unsqueeze, Transpose/Squeeze around it; nn.RNN's
nonlinearity arrives as the RNN node's activations, ["Tanh"] or ["Relu"] per direction); the
engine runs them with csrc/ops/rnn.c (forward with GEMMs per time step, BPTT in
LSTMGrad/GRUGrad/RNNGrad). Stacked (2 layers) and bidirectional (1 layer) models are compared
with eager over 10 steps — SGD with momentum as the other model suites, and AdamW.
"""
import copy
import functools

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ortmod
from modelparity import assert_close, max_diff, train_parity, train_with_dropout
from ortmod import ORTModule

VOCAB, T, B, CLASSES = 50, 7, 6, 4


class RNNClassifier(nn.Module):
    def __init__(self, cell, p=0.0, num_layers=2, bidirectional=False):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, 16)
        self.drop = nn.Dropout(p)
        # dropout between stacked layers does not export in training mode (see below)
        self.rnn = cell(16, 32, num_layers=num_layers, batch_first=True, bidirectional=bidirectional)
        self.fc = nn.Linear(64 if bidirectional else 32, CLASSES)

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


SHAPES = [pytest.param(2, False, id="2layers"), pytest.param(1, True, id="bidirectional")]


@pytest.mark.parametrize("layers, bidir", SHAPES)
@pytest.mark.parametrize("cell", CELLS)
def test_rnn_parity_10_steps(cell, layers, bidir):
    train_parity(lambda: RNNClassifier(cell, num_layers=layers, bidirectional=bidir), make_batches(), ce)


@pytest.mark.parametrize("cell", CELLS)
def test_rnn_adamw_parity_10_steps(cell, steps=10):
    """10 AdamW steps, eager vs ORTModule from identical weights: per-step losses and
    final parameters (bidirectional stacked model: both directions, both layers)."""
    torch.manual_seed(0)
    base = RNNClassifier(cell, num_layers=2, bidirectional=True)
    eager, ort = copy.deepcopy(base).train(), ORTModule(copy.deepcopy(base)).train()
    opt_e = torch.optim.AdamW(eager.parameters(), lr=1e-2)
    opt_o = torch.optim.AdamW(ort.parameters(), lr=1e-2)
    batches = make_batches()
    losses_e, losses_o = [], []
    for step in range(steps):
        batch = batches[step % len(batches)]
        for model, opt, losses in ((eager, opt_e, losses_e), (ort, opt_o, losses_o)):
            loss = model(*batch)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(loss.item())
    print("losses eager   ", " ".join(f"{v:.6f}" for v in losses_e))
    print("losses ortmod  ", " ".join(f"{v:.6f}" for v in losses_o))
    assert_close("per-step losses", torch.tensor(losses_o), torch.tensor(losses_e))
    for (n, pe), po in zip(eager.named_parameters(), ort.parameters()):
        assert_close(f"final {n} (max abs diff {max_diff(po, pe):.2e})", po, pe)


@pytest.mark.parametrize("cell", CELLS)
def test_rnn_trains_with_dropout(cell):
    train_with_dropout(lambda: RNNClassifier(cell, p=0.3), make_batches(), ce, steps=12, lr=1e-2)


def test_rnn_interlayer_dropout_is_a_clear_export_error():
    """torch's ONNX exporter refuses RNN dropout between layers in training mode: the
    error names the exporter and its cause (no silent fallback)."""
    model = RNNClassifier(nn.LSTM)
    model.rnn = nn.LSTM(16, 32, num_layers=2, batch_first=True, dropout=0.2)
    model = ORTModule(model)
    # the TorchScript exporter fails naming it; the torch.export path refuses it by name
    with pytest.raises((ortmod.ExportError, ortmod.UnsupportedModelError),
                       match="torch.onnx.export failed.*dropout in training mode|dropout between recurrent layers"):
        model(*make_batches(1)[0])


ELMAN = [pytest.param("tanh", id="tanh"), pytest.param("relu", id="relu")]


@pytest.mark.parametrize("layers, bidir", SHAPES)
@pytest.mark.parametrize("nonlinearity", ELMAN)
def test_elman_rnn_parity_10_steps(nonlinearity, layers, bidir):
    cell = functools.partial(nn.RNN, nonlinearity=nonlinearity)
    train_parity(lambda: RNNClassifier(cell, num_layers=layers, bidirectional=bidir), make_batches(), ce)


def test_relu_rnn_gradient_at_the_kink_matches_eager():
    """relu'(0) = 0 in eager: a hidden unit held at pre-activation 0 (its weight rows and biases
    zero, in both layers' first direction) passes no gradient, and the engine agrees exactly;
    every other gradient matches eager."""
    torch.manual_seed(0)
    base = RNNClassifier(functools.partial(nn.RNN, nonlinearity="relu"), num_layers=2, bidirectional=True)
    with torch.no_grad():
        for layer in (0, 1):
            for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
                getattr(base.rnn, f"{k}_l{layer}")[3] = 0
    eager, ort = copy.deepcopy(base).train(), ORTModule(copy.deepcopy(base)).train()
    batch = make_batches(1)[0]
    eager(*batch).backward()
    ort(*batch).backward()
    for layer in (0, 1):
        for k in ("weight_ih", "weight_hh", "bias_ih", "bias_hh"):
            name = f"{k}_l{layer}"
            ge, go = getattr(eager.rnn, name).grad, getattr(ort.rnn, name).grad
            assert torch.all(ge[3] == 0), f"eager {name}[3]"
            assert torch.all(go[3] == 0), f"ORTModule {name}[3]: {go[3]}"
    for (n, pe), po in zip(eager.named_parameters(), ort.parameters()):
        assert_close(f"gradient of {n} (max abs diff {max_diff(po.grad, pe.grad):.2e})", po.grad, pe.grad)
