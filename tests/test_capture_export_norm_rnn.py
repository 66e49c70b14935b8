"""Norms and recurrent layers on the torch.export capture path (issue 16): InstanceNorm, GroupNorm,
BatchNorm without running statistics, Bilinear, LSTM/GRU/RNN and their cells train as eager
does (outputs, input and parameter gradients relative to their own size, float32 and float64,
over steps that change the parameters; buffers after each step), and what the path cannot
reproduce is refused by name, as on the TorchScript path.
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.utils._pytree as pytree

from ortmod import DebugOptions, ORTModule, UnsupportedModelError
from test_semantics import rel_close


def _tensors(y):
    return [t for t in pytree.tree_leaves(y) if isinstance(t, torch.Tensor)]


def parity(module, *inputs, calls=2, dtypes=(torch.float32, torch.float64), lr=0.1):
    """Eager and ORTModule(capture="export") on copies of ``module``, per dtype: each call's
    outputs, input and parameter gradients, then an SGD step on both, and the buffers."""
    for dt in dtypes:
        torch.manual_seed(0)
        m = copy.deepcopy(module).to(dt)
        eager = copy.deepcopy(m)
        ort = ORTModule(copy.deepcopy(m), DebugOptions(capture="export"))
        for call in range(calls):
            xs = [x.to(dt) if x.is_floating_point() else x for x in inputs]
            xe = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in xs]
            xo = [x.detach().clone().requires_grad_(x.is_floating_point()) for x in xs]
            ye, yo = _tensors(eager(*xe)), _tensors(ort(*xo))
            assert len(ye) == len(yo), f"{dt} call {call}: {len(yo)} outputs, eager {len(ye)}"
            for k, (a, b) in enumerate(zip(yo, ye)):
                rel_close(f"{dt} call {call} output {k}", a, b)
            ws = [torch.randn_like(y) for y in ye]
            sum((y * w).sum() for y, w in zip(ye, ws)).backward()
            sum((y * w).sum() for y, w in zip(yo, ws)).backward()
            for i, (a, b) in enumerate(zip(xo, xe)):
                assert (a.grad is None) == (b.grad is None), f"{dt} call {call} input {i}: gradient presence"
                if b.grad is not None:
                    rel_close(f"{dt} call {call} grad of input {i}", a.grad, b.grad)
            with torch.no_grad():
                for (n, pe), (_, po) in zip(eager.named_parameters(), ort.named_parameters()):
                    assert (po.grad is None) == (pe.grad is None), f"{dt} call {call} {n}: gradient presence"
                    if pe.grad is not None:
                        rel_close(f"{dt} call {call} grad of {n}", po.grad, pe.grad)
                        pe -= lr * pe.grad
                        po -= lr * po.grad
                        pe.grad = po.grad = None
            for (n, be), (_, bo) in zip(eager.named_buffers(), ort.named_buffers()):
                rel_close(f"{dt} call {call} buffer {n}", bo, be)
        records = list(ort._ortmod_exports.values())
        assert records and {r.exported.capture for r in records} == {"export"}


def _randomized_stats(m):
    """Running statistics away from their initial 0 and 1, so reading them is tested."""
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        m.running_mean.copy_(torch.randn(m.running_mean.shape, generator=g))
        m.running_var.copy_(torch.rand(m.running_var.shape, generator=g) + 0.5)
    return m


def _eval(m):
    return m.eval()


def _x(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape) + len(shape)))


# ---- instance norm ------------------------------------------------------------------------------

@pytest.mark.parametrize("make, shape", [
    (lambda: nn.InstanceNorm1d(3), (2, 3, 5)),
    (lambda: nn.InstanceNorm1d(3, affine=True, eps=1e-3), (2, 3, 5)),
    (lambda: nn.InstanceNorm1d(3, affine=True), (3, 6)),                      # unbatched
    (lambda: nn.InstanceNorm2d(4, affine=True), (2, 4, 3, 5)),
    (lambda: nn.InstanceNorm3d(2, affine=True), (2, 2, 3, 2, 4)),
    (lambda: _eval(_randomized_stats(nn.InstanceNorm2d(3, affine=True, track_running_stats=True))), (2, 3, 4, 4)),
    (lambda: _eval(_randomized_stats(nn.InstanceNorm1d(3, track_running_stats=True))), (3, 5)),
    (lambda: _eval(nn.InstanceNorm2d(3)), (2, 3, 4, 4)),                     # eval without stats: input stats
], ids=lambda v: None if callable(v) else str(v))
def test_instance_norm(make, shape):
    parity(make(), _x(*shape))


def test_instance_norm_updating_running_stats_is_refused():
    m = ORTModule(nn.InstanceNorm2d(3, track_running_stats=True), DebugOptions(capture="export"))
    with pytest.raises(UnsupportedModelError, match="InstanceNorm with track_running_stats=True in training"):
        m(_x(2, 3, 4, 4))


# ---- group norm, bilinear ------------------------------------------------------------------------

@pytest.mark.parametrize("make, shape", [
    (lambda: nn.GroupNorm(2, 4), (3, 4, 5)),
    (lambda: nn.GroupNorm(3, 6, eps=1e-3, affine=False), (2, 6, 3, 2)),
    (lambda: nn.GroupNorm(1, 3), (2, 3)),
    (lambda: nn.GroupNorm(4, 4), (2, 4, 2, 2, 3)),
], ids=lambda v: None if callable(v) else str(v))
def test_group_norm(make, shape):
    parity(make(), _x(*shape))


@pytest.mark.parametrize("make, s1, s2", [
    (lambda: nn.Bilinear(3, 4, 5), (6, 3), (6, 4)),
    (lambda: nn.Bilinear(3, 4, 2, bias=False), (2, 5, 3), (2, 5, 4)),
    (lambda: nn.Bilinear(3, 2, 4), (3,), (2,)),                                # unbatched
], ids=lambda v: None if callable(v) else str(v))
def test_bilinear(make, s1, s2):
    parity(make(), _x(*s1), _x(*s2))


# ---- batch norm without running stats; momentum=None --------------------------------------------

@pytest.mark.parametrize("make, shape", [
    (lambda: nn.BatchNorm1d(3, track_running_stats=False), (5, 3)),
    (lambda: nn.BatchNorm1d(3, affine=False, track_running_stats=False), (4, 3, 6)),
    (lambda: nn.BatchNorm2d(2, eps=1e-3, track_running_stats=False), (3, 2, 4, 3)),
    (lambda: _eval(nn.BatchNorm3d(2, track_running_stats=False)), (2, 2, 3, 2, 2)),   # eval: batch stats too
], ids=lambda v: None if callable(v) else str(v))
def test_batch_norm_without_running_stats(make, shape):
    parity(make(), _x(*shape))


def test_batch_norm_cumulative_average_is_refused_by_name():
    m = ORTModule(nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3, momentum=None)), DebugOptions(capture="export"))
    with pytest.raises(UnsupportedModelError, match=r"BatchNorm '1' has momentum=None \(cumulative moving average\)"):
        m(_x(4, 3))


def test_batch_norm_cumulative_average_in_eval_reads_the_stats():
    parity(_eval(_randomized_stats(nn.BatchNorm1d(3, momentum=None))), _x(4, 3))


# ---- recurrent layers ---------------------------------------------------------------------------

class WithState(nn.Module):
    """A recurrent layer called with its initial state (h0, or (h0, c0) for an LSTM)."""

    def __init__(self, rnn):
        super().__init__()
        self.rnn = rnn

    def forward(self, x, h, c=None):
        return self.rnn(x, h if c is None else (h, c))


@pytest.mark.parametrize("make, shape", [
    (lambda: nn.LSTM(3, 4), (5, 2, 3)),
    (lambda: nn.LSTM(3, 4, num_layers=2, bidirectional=True), (4, 3, 3)),
    (lambda: nn.LSTM(3, 4, batch_first=True, bias=False), (2, 5, 3)),
    (lambda: nn.LSTM(3, 4, num_layers=3), (4, 3)),                             # unbatched
    (lambda: _eval(nn.LSTM(3, 4, num_layers=2, dropout=0.5)), (4, 2, 3)),      # eval: no dropout
    (lambda: nn.GRU(3, 4), (5, 2, 3)),
    (lambda: nn.GRU(3, 4, num_layers=2, bidirectional=True, batch_first=True), (3, 4, 3)),
    (lambda: nn.GRU(3, 5, bias=False, bidirectional=True), (4, 3)),           # unbatched
    (lambda: nn.RNN(3, 4), (5, 2, 3)),
    (lambda: nn.RNN(3, 4, nonlinearity="relu", num_layers=2, bidirectional=True), (4, 3, 3)),
    (lambda: nn.RNN(3, 4, batch_first=True, bias=False, num_layers=2), (2, 5, 3)),
    (lambda: nn.RNN(3, 4, nonlinearity="relu"), (4, 3)),                       # unbatched
], ids=lambda v: None if callable(v) else str(v))
def test_recurrent_layer(make, shape):
    parity(make(), _x(*shape))


@pytest.mark.parametrize("make, shape, state", [
    (lambda: nn.LSTM(3, 4, num_layers=2, bidirectional=True), (4, 2, 3), [(4, 2, 4), (4, 2, 4)]),
    (lambda: nn.LSTM(3, 4, batch_first=True), (2, 5, 3), [(1, 2, 4), (1, 2, 4)]),
    (lambda: nn.LSTM(3, 4), (5, 3), [(1, 4), (1, 4)]),                         # unbatched
    (lambda: nn.GRU(3, 4, num_layers=2), (5, 2, 3), [(2, 2, 4)]),
    (lambda: nn.GRU(3, 4, bidirectional=True), (5, 3), [(2, 4)]),              # unbatched
    (lambda: nn.RNN(3, 4, nonlinearity="relu", bidirectional=True, batch_first=True), (2, 5, 3), [(2, 2, 4)]),
], ids=lambda v: None if callable(v) else str(v))
def test_recurrent_layer_with_initial_state(make, shape, state):
    parity(WithState(make()), _x(*shape), *[_x(*s) for s in state])


@pytest.mark.parametrize("make, shape, state", [
    (lambda: nn.LSTMCell(3, 4), (2, 3), None),
    (lambda: nn.LSTMCell(3, 4, bias=False), (2, 3), [(2, 4), (2, 4)]),
    (lambda: nn.LSTMCell(3, 4), (3,), [(4,), (4,)]),                           # unbatched
    (lambda: nn.GRUCell(3, 4), (2, 3), None),
    (lambda: nn.GRUCell(3, 4, bias=False), (2, 3), [(2, 4)]),
    (lambda: nn.RNNCell(3, 4, nonlinearity="relu"), (2, 3), [(2, 4)]),
], ids=lambda v: None if callable(v) else str(v))
def test_recurrent_cell(make, shape, state):
    cell = make()
    parity(WithState(cell) if state else cell, _x(*shape), *[_x(*s) for s in state or []])


def test_user_unbind_becomes_selects():
    class Steps(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def forward(self, x):
            return torch.stack([self.lin(t) * (k + 1) for k, t in enumerate(x.unbind(1))], dim=2)
    parity(Steps(), _x(2, 4, 3))


@pytest.mark.parametrize("make, shape, state", [
    (lambda: nn.LSTM(3, 4, proj_size=2), (5, 2, 3), None),
    (lambda: nn.LSTM(3, 5, proj_size=3, num_layers=2, bidirectional=True), (4, 2, 3), None),
    (lambda: nn.LSTM(3, 4, proj_size=2, batch_first=True, bias=False), (2, 6, 3), None),
    (lambda: nn.LSTM(3, 4, proj_size=3), (5, 3), None),                               # unbatched
    (lambda: nn.LSTM(3, 4, proj_size=2, num_layers=2), (4, 2, 3), [(2, 2, 2), (2, 2, 4)]),
    (lambda: nn.LSTM(3, 4, proj_size=2, bidirectional=True, batch_first=True), (2, 3, 3), [(2, 2, 2), (2, 2, 4)]),
], ids=lambda v: None if callable(v) else str(v))
def test_lstm_with_projections_unrolled(make, shape, state):
    lstm = make()
    parity(WithState(lstm) if state else lstm, _x(*shape), *[_x(*s) for s in state or []])


def test_lstm_with_projections_exports_again_for_another_length():
    torch.manual_seed(0)
    lstm = nn.LSTM(3, 4, proj_size=2, num_layers=2)
    eager, ort = copy.deepcopy(lstm), ORTModule(copy.deepcopy(lstm), DebugOptions(capture="export"))
    for steps in (5, 7, 5):
        x = _x(steps, 2, 3)
        for k, (a, b) in enumerate(zip(_tensors(ort(x)), _tensors(eager(x)))):
            rel_close(f"length {steps} output {k}", a, b)
    # every change of length exports again (the graph is unrolled for one length): never a stale graph
    assert ort._ortmod_export_count == 3


@pytest.mark.parametrize("make, why", [
    (lambda: nn.LSTM(3, 4, proj_size=2), r"nn.LSTM\(proj_size > 0\) with a sequence of 513 steps"),
    (lambda: nn.LSTM(3, 4, num_layers=2, dropout=0.3), "dropout between recurrent layers in training mode"),
    (lambda: nn.GRU(3, 4, num_layers=2, dropout=0.3), "dropout between recurrent layers in training mode"),
    (lambda: nn.RNN(3, 4, num_layers=2, dropout=0.3), "dropout between recurrent layers in training mode"),
], ids=lambda v: None if callable(v) else str(v))
def test_recurrent_refusals_are_by_name(make, why):
    m = ORTModule(make(), DebugOptions(capture="export"))
    with pytest.raises(UnsupportedModelError, match=why):
        m(_x(513 if "513" in why else 5, 2, 3))
