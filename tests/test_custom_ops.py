"""A library's custom op (torch.library.custom_op with register_autograd) inside ORTModule: a
callback node like a user's autograd.Function (ortmod/capture/export.py _LibraryOpCalls), its
own kernel and its registered backward run in PyTorch, the engine's ops around it. On the
torch.export path (the default's first choice); the TorchScript exporter refuses an op of an
unknown namespace by name."""
import copy

import pytest
import torch
import torch.nn as nn

import ortmod
from ortmod import ORTModule
from test_semantics import rel_close


@torch.library.custom_op("ortmod_test::scaled_tanh", mutates_args=())
def scaled_tanh(x: torch.Tensor, s: float) -> torch.Tensor:
    return torch.tanh(x) * s


@scaled_tanh.register_fake
def _(x, s):
    return torch.empty_like(x)


def _tanh_setup(ctx, inputs, output):
    ctx.save_for_backward(output)
    ctx.s = inputs[1]


def _tanh_backward(ctx, g):
    (y,) = ctx.saved_tensors
    return g * (ctx.s - y * y / ctx.s), None


scaled_tanh.register_autograd(_tanh_backward, setup_context=_tanh_setup)


@torch.library.custom_op("ortmod_test::gate_mix", mutates_args=())
def gate_mix(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.sigmoid(a)
    return g * b, (1 - g) * b


@gate_mix.register_fake
def _(a, b):
    return torch.empty_like(b), torch.empty_like(b)


def _mix_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _mix_backward(ctx, g1, g2):
    a, b = ctx.saved_tensors
    s = torch.sigmoid(a)
    da = (g1 - g2) * b * s * (1 - s)
    return da, g1 * s + g2 * (1 - s)


gate_mix.register_autograd(_mix_backward, setup_context=_mix_setup)


@torch.library.custom_op("ortmod_test::no_autograd", mutates_args=())
def no_autograd(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@no_autograd.register_fake
def _(x):
    return torch.empty_like(x)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.head = nn.Linear(6, 8), nn.Linear(6, 8), nn.Linear(8, 3)

    def forward(self, x):
        h = scaled_tanh(self.a(x), 1.5)
        p, q = gate_mix(h, self.b(x))
        return self.head(p - 0.5 * q)


@pytest.fixture(autouse=True)
def export_path(ortmod_env):
    ortmod_env.setenv("ORTMOD_CAPTURE", "export")


def _sgd_parity(model, inputs, steps=3):
    ort = ORTModule(copy.deepcopy(model))
    opt_e = torch.optim.SGD(model.parameters(), lr=0.1)
    opt_o = torch.optim.SGD(ort.parameters(), lr=0.1)
    for x in inputs:
        for m, opt in ((model, opt_e), (ort, opt_o)):
            opt.zero_grad()
            m(x).square().mean().backward()
        for (n, pe), po in zip(model.named_parameters(), ort.parameters()):
            rel_close(n, po.grad, pe.grad, 1e-5)
        opt_e.step()
        opt_o.step()
    for pe, po in zip(model.parameters(), ort.parameters()):
        rel_close("parameter", po, pe, 1e-5)
    return ort


def test_custom_ops_with_registered_autograd_train_like_eager():
    torch.manual_seed(0)
    ort = _sgd_parity(Net(), [torch.randn(5, 6), torch.randn(5, 6), torch.randn(7, 6)])
    kinds = {r.exported.capture for r in ort._ortmod_exports.values()}
    assert kinds == {"export"}
    calls = [s.name for r in ort._ortmod_exports.values() for s in r.exported.functions]
    assert "ortmod_test.scaled_tanh.default" in calls and "ortmod_test.gate_mix.default" in calls


def test_custom_op_runs_its_own_kernel_and_backward():
    seen = []
    original = _tanh_backward.__code__

    def spy(ctx, g):
        seen.append(g.shape)
        (y,) = ctx.saved_tensors
        return g * (ctx.s - y * y / ctx.s), None
    scaled_tanh.register_autograd(spy, setup_context=_tanh_setup)
    try:
        torch.manual_seed(0)
        ORTModule(Net())(torch.randn(4, 6)).sum().backward()
    finally:
        scaled_tanh.register_autograd(_tanh_backward, setup_context=_tanh_setup)
    assert seen == [torch.Size([4, 8])] and original is _tanh_backward.__code__


def test_custom_op_without_autograd_is_forward_only():
    class Fwd(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(4, 4)

        def forward(self, x):
            return self.l(no_autograd(x))       # no gradient flows through the op: x needs none

    torch.manual_seed(0)
    _sgd_parity(Fwd(), [torch.randn(3, 4)])

    class Through(Fwd):
        def forward(self, x):
            return no_autograd(self.l(x))

    with pytest.raises(RuntimeError, match="no_autograd"):       # eager: no autograd formula registered
        Through()(torch.randn(3, 4)).sum().backward()
    with pytest.raises(RuntimeError, match="no_autograd"):
        ORTModule(Through())(torch.randn(3, 4)).sum().backward()


def test_the_torchscript_path_refuses_a_custom_op_by_name(ortmod_env):
    ortmod_env.setenv("ORTMOD_CAPTURE", "torchscript")
    with pytest.raises(ortmod.ExportError, match="ortmod_test::scaled_tanh"):
        ORTModule(Net())(torch.randn(3, 6))
