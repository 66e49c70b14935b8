"""aten::unfold (Tensor.unfold: patching in time-series models), aten::mv and aten::dot
(spectral_norm's power iteration and sigma) train against eager on both capture paths (issue 37).

On the torch.export path they are torchlib's rules, reviewed (REVIEWED in
ortmod/capture/audit.py); on the TorchScript path unfold is ortmod's rule (capture/rules/nn.py):
torch's own unsqueezed the windows at the dim as given, so a negative dim came back as
(..., size, windows), transposed values without an error where the two are equal."""
import copy

import pytest
import torch
import torch.nn as nn

import ortmod
from ortmod import ORTModule
from modelparity import train_parity
from test_semantics import rel_close


@pytest.fixture(autouse=True, params=["torchscript", "export"])
def capture(request, ortmod_env):
    ortmod_env.setenv("ORTMOD_CAPTURE", request.param)
    return request.param


class Patches(nn.Module):
    """x (B, C, L) -> windows of ``size`` every ``step`` along ``dim``, mixed by a Linear."""

    def __init__(self, dim, size, step):
        super().__init__()
        self.dim, self.size, self.step = dim, size, step
        self.proj = nn.Linear(size, 3)

    def forward(self, x):
        p = x.unfold(self.dim, self.size, self.step)
        return torch.tanh(self.proj(p * 1.5))


# (dim, size, step, lengths): overlapping windows (step < size), gaps (step > size), a window
# count equal to the size (L=7, size 3, step 2: the shape torch's rule transposed silently),
# the length dim as -1 and as 2, another dim, a last window that does not reach the end
CASES = [(-1, 3, 2, (7, 11)), (2, 3, 2, (7, 9)), (-1, 5, 1, (5, 8)), (-1, 2, 3, (9, 10)),
         (1, 2, 1, (7,)), (-2, 3, 4, (7,)), (-1, 4, 4, (13, 16))]


@pytest.mark.parametrize("dim,size,step,lengths", CASES)
def test_unfold_forward_and_gradients(dim, size, step, lengths):
    m = Patches(dim, size, step)
    o = ORTModule(copy.deepcopy(m))
    for n in lengths:
        x = torch.randn(2, 5, n)
        xe, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
        ye, yo = m(xe), o(xo)
        rel_close(f"L={n} output", yo, ye)
        w = torch.randn_like(ye)
        (ye * w).sum().backward()
        (yo * w).sum().backward()
        rel_close(f"L={n} input grad", xo.grad, xe.grad)
        for (name, pe), po in zip(m.named_parameters(), o.parameters()):
            rel_close(f"L={n} grad of {name}", po.grad, pe.grad)
        m.zero_grad()
        o.zero_grad()


def test_unfold_trains_with_sgd_parity():
    batches = [(torch.randn(3, 5, 11),), (torch.randn(3, 5, 11),)]
    train_parity(lambda: Patches(-1, 3, 2), batches, lambda model, b: model(*b).pow(2).mean(), steps=5)


class MatVec(nn.Module):
    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(torch.randn(4, 6))
        self.u = nn.Parameter(torch.randn(4))

    def forward(self, v):
        y = torch.mv(self.w, v)               # (4,)
        return torch.dot(self.u, torch.tanh(y)) + torch.mv(self.w.t(), y).sum()


def test_mv_and_dot_gradients_to_both_operands():
    m = MatVec()
    o = ORTModule(copy.deepcopy(m))
    for _ in range(2):
        v = torch.randn(6)
        ve, vo = v.clone().requires_grad_(), v.clone().requires_grad_()
        ye, yo = m(ve), o(vo)
        rel_close("output", yo, ye)
        ye.backward()
        yo.backward()
        rel_close("grad of v", vo.grad, ve.grad)
        rel_close("grad of w", o._original_module.w.grad, m.w.grad)
        rel_close("grad of u", o._original_module.u.grad, m.u.grad)
        m.zero_grad()
        o.zero_grad()


class SpectralMLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.utils.parametrizations.spectral_norm(nn.Linear(6, 8))
        self.b = nn.utils.parametrizations.spectral_norm(nn.Linear(8, 3), n_power_iterations=2)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def test_spectral_norm_trains_with_parity_of_weights_and_power_iteration_buffers(capture):
    """Training updates each layer's u and v under no_grad (the power iteration, mv) every call;
    sigma is dot(u, mv(W, v)), differentiated. train_parity compares the parameters and the
    buffers (u, v) after the SGD steps. The TorchScript exporter cannot trace the iteration's
    F.normalize(out=buffer): that path refuses the buffer's update by name."""
    batches = [(torch.randn(5, 6),), (torch.randn(5, 6),)]

    def loss_of(model, b):
        return model(*b).pow(2).mean()
    if capture == "torchscript":
        with pytest.raises(ortmod.UnsupportedModelError, match=r"mutates buffer 'a\.parametrizations\.weight\.0\._u'"):
            ORTModule(SpectralMLP())(*batches[0])
        return
    eager, ort, _ = train_parity(SpectralMLP, batches, loss_of, steps=5)
    names = [n for n, _ in eager.named_buffers()]
    assert names == ["a.parametrizations.weight.0._u", "a.parametrizations.weight.0._v",
                     "b.parametrizations.weight.0._u", "b.parametrizations.weight.0._v"]
    torch.manual_seed(0)
    start = dict(SpectralMLP().named_buffers())        # train_parity's starting model
    for name, b in ort.named_buffers():
        assert not torch.equal(b, start[name]), f"{name} was not updated"


def test_spectral_norm_in_training_on_auto_takes_the_export_path(ortmod_env):
    ortmod_env.setenv("ORTMOD_CAPTURE", "auto")
    torch.manual_seed(0)
    m = SpectralMLP()
    o = ORTModule(copy.deepcopy(m))
    x = torch.randn(4, 6)
    rel_close("output", o(x), m(x))
    assert {r.exported.capture for r in o._ortmod_exports.values()} == {"export"}
    for (name, be), bo in zip(m.named_buffers(), o.buffers()):
        rel_close(name, bo, be)


def test_spectral_norm_in_eval_mode():
    """Eval mode reads u and v without updating them: both paths, gradients through sigma."""
    torch.manual_seed(0)
    m = SpectralMLP()
    m(torch.randn(4, 6))          # one training call moves u and v off their initial values
    m.eval()
    o = ORTModule(copy.deepcopy(m)).eval()
    x = torch.randn(4, 6)
    ye, yo = m(x), o(x)
    rel_close("output", yo, ye)
    ye.pow(2).sum().backward()
    yo.pow(2).sum().backward()
    for (name, pe), po in zip(m.named_parameters(), o.parameters()):
        rel_close(f"grad of {name}", po.grad, pe.grad)
    for (name, be), bo in zip(m.named_buffers(), o.buffers()):
        assert torch.equal(bo, be), name

