"""nn.LSTM with projections (proj_size > 0) through ORTModule against eager autograd
(ortmod/capture/rules/rnn.py: torch's exporter refuses "LSTMs with projections"; ortmod unrolls the
recurrence over the static sequence length in eager's equations).

Each case: the output sequence, h_n and c_n, then the gradients of the input, of a given
(h0, c0) and of every parameter for one random gradient on the three outputs, relative to each
tensor's size; float64 and float32. Plus: 3 SGD steps with parameter parity, a sequence length
that changes between calls, the plain LSTM still exported as ONNX's LSTM node, and the
refusals (inter-layer dropout in training, sequences above 512 steps, packed sequences).
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ortmod
from modelparity import exported_op_types
from ortmod import ORTModule

D = torch.float64
I, H, P, T, B = 5, 6, 3, 4, 2


class Flat(nn.Module):
    """nn.LSTM returning (output, h_n, c_n) flat; (h0, c0) as inputs when given."""

    def __init__(self, lstm):
        super().__init__()
        self.lstm = lstm

    def forward(self, x, h0=None, c0=None):
        out, (h, c) = self.lstm(x, None if h0 is None else (h0, c0))
        return out, h, c


def _scale(t):
    return max(t.abs().max().item(), 1.0)


def check(module, *inputs, rtol=1e-10, atol=1e-12):
    eager, ort = module, ORTModule(copy.deepcopy(module))
    xe = [x.clone().requires_grad_() for x in inputs]
    xo = [x.clone().requires_grad_() for x in inputs]
    ye, yo = eager(*xe), ort(*xo)
    assert len(ye) == len(yo) == 3
    for k, (a, b) in enumerate(zip(yo, ye)):
        assert a.shape == b.shape and a.dtype == b.dtype, f"output {k}: {a.shape} {a.dtype} vs {b.shape} {b.dtype}"
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol * _scale(b), msg=lambda m: f"output {k}: {m}")
    dys = [torch.randn(y.shape, dtype=y.dtype) for y in ye]
    sum((y * d).sum() for y, d in zip(ye, dys)).backward()
    sum((y * d).sum() for y, d in zip(yo, dys)).backward()
    names = [f"input {j}" for j in range(len(inputs))] + [n for n, _ in eager.named_parameters()]
    got = [x.grad for x in xo] + [p.grad for p in ort.parameters()]
    want = [x.grad for x in xe] + [p.grad for p in eager.parameters()]
    assert len(got) == len(want)
    for name, a, b in zip(names, got, want):
        assert a is not None and b is not None, f"gradient of {name}: ortmod {a is not None}, eager {b is not None}"
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol * _scale(b), msg=lambda m: f"gradient of {name}: {m}")
    return ort


CASES = [
    # layers, bidirectional, batch_first, bias, unbatched, given state
    pytest.param(1, False, False, True, False, False, id="1layer"),
    pytest.param(2, False, False, True, False, True, id="2layers-state"),
    pytest.param(1, True, False, True, False, False, id="bidirectional"),
    pytest.param(2, True, True, True, False, True, id="2layers-bidir-batch_first-state"),
    pytest.param(1, False, True, False, False, False, id="batch_first-nobias"),
    pytest.param(2, True, False, False, False, True, id="2layers-bidir-nobias-state"),
    pytest.param(1, False, False, True, True, False, id="unbatched"),
    pytest.param(2, True, True, True, True, True, id="unbatched-2layers-bidir-batch_first-state"),
]


@pytest.mark.parametrize("dtype", [D, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("layers, bidir, batch_first, bias, unbatched, state", CASES)
def test_lstm_proj_forward_and_gradients(layers, bidir, batch_first, bias, unbatched, state, dtype):
    torch.manual_seed(layers * 8 + bidir * 4 + batch_first * 2 + bias)
    lstm = nn.LSTM(I, H, num_layers=layers, bias=bias, batch_first=batch_first, bidirectional=bidir,
                   proj_size=P).to(dtype)
    shape = (T, I) if unbatched else ((B, T, I) if batch_first else (T, B, I))
    inputs = [torch.randn(shape, dtype=dtype)]
    if state:
        n = layers * (2 if bidir else 1)
        inputs += [torch.randn((n, P) if unbatched else (n, B, P), dtype=dtype),
                   torch.randn((n, H) if unbatched else (n, B, H), dtype=dtype)]
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else {}
    ort = check(Flat(lstm), *inputs, **tol)
    ops = exported_op_types(ort)
    assert "LSTM" not in ops and "MatMul" in ops


def test_lstm_proj_one_step_and_eval_with_dropout():
    """T = 1; dropout between layers in eval mode is no dropout (exported)."""
    torch.manual_seed(3)
    lstm = nn.LSTM(I, H, num_layers=2, dropout=0.5, proj_size=P).to(D)
    check(Flat(lstm).eval(), torch.randn(1, B, I, dtype=D))


def test_lstm_proj_dropout_one_layer_trains():
    """dropout with one layer is no dropout in eager (it falls between layers): exported."""
    torch.manual_seed(4)
    with pytest.warns(UserWarning):
        lstm = nn.LSTM(I, H, num_layers=1, dropout=0.3, proj_size=P).to(D).train()
    check(Flat(lstm), torch.randn(T, B, I, dtype=D))


def test_lstm_proj_long_sequence_and_many_layers():
    """More steps, and more layers x directions, than one engine node takes inputs (64; the
    Concats of h_t and of h_n/c_n are joined in chunks)."""
    torch.manual_seed(10)
    check(Flat(nn.LSTM(2, 3, bidirectional=True, proj_size=2).to(D)), torch.randn(70, 1, 2, dtype=D))
    check(Flat(nn.LSTM(2, 3, num_layers=32, bidirectional=True, proj_size=2).to(D)),
          torch.randn(1, 1, 2, dtype=D))


def test_lstm_proj_sequence_length_changes():
    torch.manual_seed(5)
    m = Flat(nn.LSTM(I, H, num_layers=2, bidirectional=True, proj_size=P).to(D))
    ort = ORTModule(copy.deepcopy(m))
    for steps in (4, 7, 4):
        x = torch.randn(steps, B, I, dtype=D)
        for a, b in zip(ort(x), m(x)):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


class Regressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.lstm = nn.LSTM(I, H, num_layers=2, batch_first=True, bidirectional=True, proj_size=P)
        self.fc = nn.Linear(2 * P, 1)

    def forward(self, x, y):
        out, (h, c) = self.lstm(x)
        return F.mse_loss(self.fc(out).squeeze(-1), y) + 0.1 * c.pow(2).mean()


def test_lstm_proj_trains_3_sgd_steps():
    torch.manual_seed(6)
    base = Regressor().to(D)
    eager, ort = copy.deepcopy(base).train(), ORTModule(copy.deepcopy(base)).train()
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.1, momentum=0.9)
    opt_o = torch.optim.SGD(ort.parameters(), lr=0.1, momentum=0.9)
    g = torch.Generator().manual_seed(7)
    batches = [(torch.randn(B, T, I, generator=g, dtype=D), torch.randn(B, T, generator=g, dtype=D))
               for _ in range(3)]
    for x, y in batches:
        le, lo = eager(x, y), ort(x, y)
        torch.testing.assert_close(lo, le, rtol=1e-10, atol=1e-12)
        for model, loss, opt in ((eager, le, opt_e), (ort, lo, opt_o)):
            opt.zero_grad()
            loss.backward()
            opt.step()
    for (name, a), b in zip(ort.named_parameters(), eager.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=lambda m: f"{name}: {m}")
    assert not torch.equal(next(eager.parameters()), next(base.parameters()))


def test_plain_lstm_keeps_the_onnx_lstm_node():
    torch.manual_seed(8)
    ort = check(Flat(nn.LSTM(I, H, num_layers=2, bidirectional=True).to(D)), torch.randn(T, B, I, dtype=D))
    assert "LSTM" in exported_op_types(ort)


def _refused(module, *inputs, match, export_match=None):
    """Refused by name: ``match`` the TorchScript path's words, ``export_match`` the torch.export
    path's (its audit names the aten op and why)."""
    errors = ortmod.UnsupportedModelError
    if export_match is not None and ortmod.DebugOptions().capture == "export":
        # or torch.export itself fails, which ortmod reports as an ExportError naming it
        match, errors = export_match, (ortmod.UnsupportedModelError, ortmod.ExportError)
    with pytest.raises(errors, match=match):
        ORTModule(module)(*inputs)


def test_lstm_proj_refusals():
    torch.manual_seed(9)
    # inter-layer dropout in training: eager's random mask cannot be reproduced
    _refused(Flat(nn.LSTM(I, H, num_layers=2, dropout=0.2, proj_size=P).train()), torch.randn(T, B, I),
             match=r"^nn.LSTM\(proj_size>0\): dropout between layers in training mode",
             export_match=r"aten::lstm.input .*dropout between recurrent layers in training mode")
    # the unrolled graph grows with the sequence length
    _refused(Flat(nn.LSTM(I, H, proj_size=P)), torch.randn(513, 1, I),
             match=r"^nn.LSTM\(proj_size>0\): sequence length 513 is above 512",
             export_match=r"aten::lstm.input .*a sequence of 513 steps: ortmod unrolls 1 to 512")

    class Packed(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(I, H, proj_size=P)

        def forward(self, x, lengths):
            packed = nn.utils.rnn.pack_padded_sequence(x, lengths, enforce_sorted=False)
            out, (h, c) = self.lstm(packed)
            return h, c
    # packed sequences are captured on the TorchScript path (tests/test_packed_sequences.py), but not
    # through the projection's unrolled rule; the torch.export path refuses every packed sequence
    _refused(Packed(), torch.randn(T, B, I), torch.tensor([T, T - 1]),
             match=r"^nn.LSTM\(proj_size>0\): packed sequences \(PackedSequence\) with projections",
             export_match=r"^packed sequences")
