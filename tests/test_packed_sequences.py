"""Packed sequences (issue 37): pack_padded_sequence -> nn.LSTM / nn.GRU / nn.RNN ->
pad_packed_sequence inside the forward trains with parity against eager on the TorchScript path
and the default capture ("auto", which falls back to it); the torch.export path refuses them by
name (ortmod/capture/packed.py). The engine runs the RNN with sequence_lens (csrc/ops/rnn.c).

Each test pins the path it is about (`make test-export` runs the suite with ORTMOD_CAPTURE=export)."""
import copy

import pytest
import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

from modelparity import assert_close, referee_holds, train_parity
from ortmod import DebugOptions, ORTModule, UnsupportedModelError
from ortmod.capture.errors import TraceHazardWarning

CELLS = [nn.LSTM, nn.GRU, nn.RNN]


class Packed(nn.Module):
    """pack -> 2-layer bidirectional RNN -> pad -> Linear; returns the padded output, h_n (and
    c_n) and the lengths pad_packed_sequence gives back."""

    def __init__(self, cell, batch_first=True, enforce_sorted=False, total_length=None, padding_value=0.0):
        super().__init__()
        self.rnn = cell(4, 5, num_layers=2, bidirectional=True, batch_first=batch_first)
        self.out = nn.Linear(10, 3)
        self.batch_first, self.enforce_sorted = batch_first, enforce_sorted
        self.total_length, self.padding_value = total_length, padding_value

    def forward(self, x, lengths):
        p = pack_padded_sequence(x, lengths, batch_first=self.batch_first, enforce_sorted=self.enforce_sorted)
        y, state = self.rnn(p)
        y, out_lengths = pad_packed_sequence(y, batch_first=self.batch_first, padding_value=self.padding_value,
                                             total_length=self.total_length)
        states = state if isinstance(state, tuple) else (state,)
        return (self.out(y),) + states + (out_lengths,)


def _loss(outs):
    y, *states, _ = outs
    # weights by position: a wrong time step, batch order or padding changes the loss
    w = torch.arange(1, y.numel() + 1, dtype=y.dtype).reshape(y.shape).sin()
    return (y * w).sum() + sum((s * s).sum() for s in states)


def _batch(batch_first, lengths, time=None):
    time = time or max(lengths)
    x = torch.randn((len(lengths), time, 4) if batch_first else (time, len(lengths), 4))
    return x, torch.tensor(lengths)


def _set_path(ortmod_env, path):
    if path == "auto":
        ortmod_env.delenv("ORTMOD_CAPTURE", raising=False)
    else:
        ortmod_env.setenv("ORTMOD_CAPTURE", path)


@pytest.mark.parametrize("path", ["torchscript", "auto"])
@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("batch_first,enforce_sorted", [(True, False), (False, True)])
def test_packed_rnn_trains_with_sgd_parity(ortmod_env, path, cell, batch_first, enforce_sorted):
    """SGD steps on batches of other lengths and sizes (each padded to its longest sequence, as a
    loader pads): losses, step-0 gradients and final parameters as eager's, one export."""
    _set_path(ortmod_env, path)
    torch.manual_seed(1)
    lengths = [[6, 4, 1], [5, 5, 3, 2], [3, 1]] if enforce_sorted else [[4, 6, 1], [2, 5, 5, 3], [1, 3]]
    batches = [_batch(batch_first, ls) for ls in lengths]
    train_parity(lambda: Packed(cell, batch_first, enforce_sorted), batches,
                 lambda m, b: _loss(m(*b)), steps=4)


def _compare_call(eager, ort, x, lengths, double_of=None):
    """One call: every output (the padded output, h_n, c_n, lengths), the input's gradient and the
    parameters' gradients as eager's, each relative to its own size; where fp32 disagree, an fp64
    eager copy referees."""
    xe, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    oe, oo = eager(xe, lengths), ort(xo, lengths)
    assert len(oe) == len(oo)
    for k, (a, b) in enumerate(zip(oe, oo)):
        assert a.shape == b.shape and a.dtype == b.dtype, (k, a.shape, b.shape, a.dtype, b.dtype)
    _loss(oe).backward()
    _loss(oo).backward()
    pairs = [(f"output {k}", b, a) for k, (a, b) in enumerate(zip(oe, oo))]
    pairs.append(("input grad", xo.grad, xe.grad))
    pairs += [(f"grad {n}", po.grad, pe.grad) for (n, pe), po in zip(eager.named_parameters(), ort.parameters())]
    ref = None
    for what, got, want in pairs:
        try:
            assert_close(what, got, want)
        except AssertionError:
            if ref is None:     # the fp64 referee, computed once
                dbl = copy.deepcopy(eager).double()
                for p in dbl.parameters():
                    p.grad = None
                xd = x.double().requires_grad_()
                od = dbl(xd, lengths)
                _loss(od).backward()
                ref = [(f"output {k}", t) for k, t in enumerate(od)] + [("input grad", xd.grad)]
                ref += [(f"grad {n}", p.grad) for n, p in dbl.named_parameters()]
                ref = dict(ref)
            if not referee_holds(got, want, ref[what]):
                raise
    for p in list(eager.parameters()) + list(ort.parameters()):
        p.grad = None


@pytest.mark.parametrize("cell", CELLS)
@pytest.mark.parametrize("batch_first", [True, False])
def test_lengths_change_between_calls(ortmod_env, cell, batch_first):
    """Lengths are an input, not frozen: other lengths (the order too), a changed longest length
    (shorter than the padded input: eager's output is cut to it) and a changed padded length give
    eager's outputs and gradients; a change of T - max(lengths) exports again, with a warning."""
    _set_path(ortmod_env, "torchscript")
    torch.manual_seed(2)
    base = Packed(cell, batch_first)
    eager, ort = copy.deepcopy(base), ORTModule(copy.deepcopy(base))
    calls = [([6, 4, 1], 6), ([2, 6, 5], 6), ([3, 3, 1], 3), ([7, 2, 2, 5], 7)]
    for lengths, time in calls:
        _compare_call(eager, ort, *_batch(batch_first, lengths, time))
    assert ort._ortmod_export_count == 1
    with pytest.warns(TraceHazardWarning, match="padded length - longest length"):
        _compare_call(eager, ort, *_batch(batch_first, [3, 2, 1], 6))     # cut to 3 of 6
    _compare_call(eager, ort, *_batch(batch_first, [4, 2, 2], 7))         # T - max = 3 again
    _compare_call(eager, ort, *_batch(batch_first, [1, 4, 2], 7))
    assert ort._ortmod_export_count == 2


@pytest.mark.parametrize("cell", [nn.LSTM, nn.GRU])
def test_total_length_padding_value_and_list_lengths(ortmod_env, cell):
    """total_length (above and below the padded input's length), a padding_value, and lengths
    given as a Python list (a constant of the graph: a new list exports again) as eager."""
    _set_path(ortmod_env, "torchscript")
    torch.manual_seed(3)
    for kwargs in ({"total_length": 8}, {"total_length": 6}, {"padding_value": -2.5},
                   {"total_length": 9, "padding_value": 1.5}):
        base = Packed(cell, True, False, **kwargs)
        eager, ort = copy.deepcopy(base), ORTModule(copy.deepcopy(base))
        for lengths, time in (([6, 4, 1], 6), ([3, 5], 5), ([2, 2, 1, 6], 7)):
            if kwargs.get("total_length", 99) < time:
                continue
            _compare_call(eager, ort, *_batch(True, lengths, time))
    base = Packed(cell, True, False)
    eager, ort = copy.deepcopy(base), ORTModule(copy.deepcopy(base))
    for lengths in ([6, 4, 1], [2, 6, 5]):
        x, _ = _batch(True, lengths)
        _compare_call(eager, ort, x, lengths)
    assert ort._ortmod_export_count == 2


def test_initial_state_and_unsorted_batch_order(ortmod_env):
    """A given (h0, c0) with enforce_sorted=False: torch sorts the state with the batch and
    unsorts h_n / c_n; ortmod's as eager's."""
    _set_path(ortmod_env, "torchscript")
    torch.manual_seed(4)

    class WithState(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = nn.LSTM(4, 5, num_layers=2, batch_first=True)

        def forward(self, x, lengths, h0, c0):
            y, (h, c) = self.rnn(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False), (h0, c0))
            return pad_packed_sequence(y, batch_first=True)[0], h, c

    base = WithState()
    eager, ort = copy.deepcopy(base), ORTModule(copy.deepcopy(base))
    for lengths in ([2, 6, 4], [5, 1, 3, 3]):
        x, lens = _batch(True, lengths)
        h0, c0 = torch.randn(2, len(lengths), 5), torch.randn(2, len(lengths), 5)
        ins_e = [t.clone().requires_grad_() for t in (x, h0, c0)]
        ins_o = [t.clone().requires_grad_() for t in (x, h0, c0)]
        oe, oo = eager(ins_e[0], lens, *ins_e[1:]), ort(ins_o[0], lens, *ins_o[1:])
        sum((t * t).sum() for t in oe).backward()
        sum((t * t).sum() for t in oo).backward()
        for k, (a, b) in enumerate(zip(oe, oo)):
            assert_close(f"output {k}", b, a)
        for k, (a, b) in enumerate(zip(ins_e, ins_o)):
            assert_close(f"input {k} grad", b.grad, a.grad)
        for (n, pe), po in zip(eager.named_parameters(), ort.parameters()):
            assert_close(n, po.grad, pe.grad)
            pe.grad = po.grad = None


@pytest.mark.parametrize("cell", CELLS)
def test_classifier_on_h_n_with_the_pad_unused(ortmod_env, cell):
    """The refusal's advice for a model that reads only h_n: pad the RNN's output anyway (its
    result unused); it then trains with SGD parity, lengths changing, one export."""
    _set_path(ortmod_env, "torchscript")

    class Classifier(nn.Module):
        def __init__(self):
            super().__init__()
            self.rnn = cell(4, 5, num_layers=2, bidirectional=True, batch_first=True)
            self.out = nn.Linear(10, 3)

        def forward(self, x, lengths):
            y, state = self.rnn(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
            pad_packed_sequence(y, batch_first=True)
            h = state[0] if isinstance(state, tuple) else state
            return self.out(torch.cat([h[-2], h[-1]], 1))

    torch.manual_seed(6)
    batches = [_batch(True, ls) for ls in ([4, 6, 1], [2, 5, 5, 3], [1, 3])]
    labels = [torch.randint(0, 3, (len(x),)) for x, _ in batches]
    batches = [(x, lens, y) for (x, lens), y in zip(batches, labels)]
    train_parity(Classifier, batches, lambda m, b: nn.functional.cross_entropy(m(b[0], b[1]), b[2]), steps=4)


@pytest.mark.parametrize("path", ["torchscript", "auto"])
def test_invalid_lengths_stay_eager_errors(ortmod_env, path):
    """Eager refuses a length of 0 and, with enforce_sorted=True, unsorted lengths: so does ortmod,
    on the first call and on a later one (the graph's guards break, the new export's eager run
    raises eager's error)."""
    _set_path(ortmod_env, path)
    torch.manual_seed(5)
    ort = ORTModule(Packed(nn.GRU, True, enforce_sorted=False))
    x, _ = _batch(True, [6, 4, 1])
    with pytest.raises(RuntimeError, match="greater than 0"):
        ort(x, torch.tensor([6, 0, 1]))
    ort(x, torch.tensor([6, 4, 1]))
    with pytest.raises(RuntimeError, match="greater than 0"):
        ort(x, torch.tensor([6, 0, 1]))
    ort = ORTModule(Packed(nn.GRU, True, enforce_sorted=True))
    ort(x, torch.tensor([6, 4, 1]))
    with pytest.raises(RuntimeError, match="sorted in decreasing order"):
        ort(x, torch.tensor([6, 1, 4]))
    ort = ORTModule(Packed(nn.GRU, True, enforce_sorted=False, total_length=6))
    ort(x, torch.tensor([6, 4, 1]))
    with pytest.raises(ValueError, match="total_length"):
        ort(torch.randn(3, 7, 4), torch.tensor([7, 4, 1]))


@pytest.mark.parametrize("cell", CELLS)
def test_export_path_refuses_by_name(cell):
    torch.manual_seed(0)
    m = Packed(cell)
    w = ORTModule(copy.deepcopy(m), DebugOptions(capture="export"))
    x, lengths = _batch(True, [6, 4, 1])
    with pytest.raises(UnsupportedModelError, match="captured on ortmod's TorchScript path only, not on the torch.export path"):
        w(x, lengths)
    # the capture's patch is gone: eager packing works after the refusal
    assert torch.isfinite(m(x, lengths)[0]).all()


class _Chain(nn.Module):
    """Two RNN modules in a row on one packed batch (an LSTM into a bidirectional GRU)."""

    def __init__(self):
        super().__init__()
        self.a = nn.LSTM(4, 5, batch_first=True)
        self.b = nn.GRU(5, 6, batch_first=True, bidirectional=True)

    def forward(self, x, lengths):
        y, _ = self.a(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
        y, h = self.b(y)
        return pad_packed_sequence(y, batch_first=True)[0], h


def test_rnns_in_a_chain_train_with_sgd_parity(ortmod_env):
    _set_path(ortmod_env, "torchscript")
    torch.manual_seed(7)
    batches = [_batch(True, ls) for ls in ([4, 6, 1], [2, 5, 5, 3], [1, 3])]
    train_parity(_Chain, batches, lambda m, b: _loss(m(*b) + (None,)), steps=4)


class _PadOfPack(nn.Module):
    """pack then pad with no RNN between: torch's exporter would return x itself, whose values
    past each length eager's pad replaces by zeros (measured: off by 6.8 before the refusal)."""

    def forward(self, x, lengths):
        p = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        return pad_packed_sequence(p, batch_first=True)[0] * 2


class _DataChanged(nn.Module):
    """The packed data changed by another op before the RNN."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(4, 5, batch_first=True)

    def forward(self, x, lengths):
        p = pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False)
        y, _ = self.rnn(p._replace(data=torch.relu(p.data)))
        return pad_packed_sequence(y, batch_first=True)[0]


class _HiddenOnly(nn.Module):
    """Classification from h_n, the packed output never padded."""

    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(4, 5, batch_first=True)

    def forward(self, x, lengths):
        _, h = self.rnn(pack_padded_sequence(x, lengths, batch_first=True, enforce_sorted=False))
        return h[-1]


class _PackedIn(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(4, 5)

    def forward(self, packed):
        return pad_packed_sequence(self.rnn(packed)[0])[0]


class _PackedOut(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.GRU(4, 5, batch_first=True)

    def forward(self, x, lengths):
        return self.rnn(pack_padded_sequence(x, lengths, batch_first=True))[0]


class _CellLoop(nn.Module):
    """An RNN cell stepped over the packed batch's batch_sizes."""

    def __init__(self):
        super().__init__()
        self.cell = nn.GRUCell(4, 5)

    def forward(self, x, lengths):
        p = pack_padded_sequence(x, lengths, batch_first=True)
        h, start, outs = torch.zeros(x.shape[0], 5), 0, []
        for n in p.batch_sizes.tolist():
            h = torch.cat([self.cell(p.data[start:start + n], h[:n]), h[n:]])
            outs.append(h[:n])
            start += n
        return pad_packed_sequence(p._replace(data=torch.cat(outs)), batch_first=True)[0]


@pytest.mark.parametrize("path", ["torchscript", "auto"])
@pytest.mark.parametrize("make", [_HiddenOnly, _PackedIn, _PackedOut, _CellLoop, _PadOfPack, _DataChanged])
def test_unsupported_uses_refused_by_name(ortmod_env, path, make):
    _set_path(ortmod_env, path)
    torch.manual_seed(0)
    m = make()
    x, lengths = _batch(True, [6, 4, 1])
    args = (pack_padded_sequence(x.transpose(0, 1), lengths),) if make is _PackedIn else (x, lengths)
    m(*args)
    with pytest.raises(UnsupportedModelError, match="packed sequence") as caught:
        ORTModule(copy.deepcopy(m))(*args)
    # on the default capture, the torch.export path's refusal notes the TorchScript path's
    assert "pack and pad inside the forward" in str(caught.value) + "".join(getattr(caught.value, "__notes__", []))
    m(*args)      # eager packing works after the refusal


def test_interlayer_dropout_keeps_the_exporters_refusal(ortmod_env):
    """Dropout between packed layers in training: torch's exporter refuses it, and that is the
    error (not a packed-sequence one)."""
    _set_path(ortmod_env, "torchscript")
    m = Packed(nn.LSTM)
    m.rnn = nn.LSTM(4, 5, num_layers=2, bidirectional=True, batch_first=True, dropout=0.2)
    with pytest.raises(Exception, match="dropout") as caught:
        ORTModule(m)(*_batch(True, [6, 4, 1]))
    assert "packed sequences:" not in str(caught.value)


@pytest.mark.parametrize("path", ["torchscript", "export"])
def test_the_padded_batch_still_trains(path):
    """The RNN on the padded batch (no packing) trains with SGD parity against eager on both
    paths."""
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


def test_strict_trace_accepts_the_packed_pair():
    """ortmod's guards on a packed pair are its own, not values the user's code froze: strict_trace
    (which refuses those) captures it."""
    torch.manual_seed(8)
    m = Packed(nn.GRU)
    w = ORTModule(copy.deepcopy(m), DebugOptions(capture="torchscript", strict_trace=True))
    x, lengths = _batch(True, [2, 6, 3])
    for a, b in zip(m(x, lengths), w(x, lengths)):
        assert_close("output", b, a)
