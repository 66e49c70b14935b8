"""The short per-step path (ortmod/_function.py, ORTModule._ortmod_call) keeps what the longer one
did: torch.autograd.Function's own behaviour where its Python wrapper is skipped, and every guard
that the per-call key and the per-engine facts learned on the first call stand for."""
import warnings

import pytest
import torch
import torch.nn as nn

from ortmod import ORTModule


def _exports(ort):
    return ort._ortmod_export_count


def test_double_backward_through_the_engine_is_an_error():
    # create_graph=True runs backward with grad mode on: the gradients must refuse a second
    # differentiation (once_differentiable) rather than act as constants (a silent zero)
    torch.manual_seed(0)
    ort = ORTModule(nn.Linear(4, 4))
    x = torch.randn(2, 4, requires_grad=True)
    y = (ort(x) * ort(x)).sum()
    g, = torch.autograd.grad(y, x, create_graph=True)
    assert g.requires_grad
    with pytest.raises(RuntimeError, match="differentiate twice"):
        g.sum().backward()


def test_first_order_gradients_match_eager_with_create_graph_and_without():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))
    ort = ORTModule(net)
    x = torch.randn(5, 4, requires_grad=True)
    want, = torch.autograd.grad(net(x).square().sum(), x)
    for create_graph in (False, True):
        got, = torch.autograd.grad(ort(x).square().sum(), x, create_graph=create_graph)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_functorch_transform_is_refused_as_torch_refuses_it():
    ort = ORTModule(nn.Linear(4, 4))
    ort(torch.randn(2, 4))
    with pytest.raises(RuntimeError, match="functorch transforms"):
        torch.func.grad(lambda t: ort(t).sum())(torch.randn(2, 4))


def test_a_dead_functorch_wrapper_is_taken_as_its_tensor():
    torch.manual_seed(0)
    lin = nn.Linear(4, 4)
    ref = nn.Linear(4, 4)
    ref.load_state_dict(lin.state_dict())
    ort = ORTModule(lin)
    ort(torch.randn(2, 4))                      # exported and built: the wrapper meets the engine
    kept = []

    def f(t):
        kept.append(t)
        return t.sum()

    torch.func.grad(f)(torch.randn(2, 4))      # kept[0]: a wrapper whose transform has ended
    out = ort(kept[0])
    out.sum().backward()
    plain = torch._C._functorch.unwrap_if_dead(kept[0])
    ref(plain).sum().backward()
    torch.testing.assert_close(out, ref(plain))
    torch.testing.assert_close(lin.weight.grad, ref.weight.grad)


class TwoHeads(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 3)
        self.b = nn.Linear(4, 3)

    def forward(self, x):
        return self.a(x), self.b(x), self.a(x).argmax(-1)


def test_per_pattern_gradients_and_non_differentiable_outputs_on_every_call():
    # which inputs get a gradient depends on which outputs the loss uses: cached per pattern,
    # so each pattern must still give its own None / tensor split, call after call
    torch.manual_seed(0)
    net = TwoHeads()
    ort = ORTModule(net)
    x = torch.randn(5, 4)
    for _ in range(2):
        for use in ("a", "b", "ab"):
            for p in net.parameters():
                p.grad = None
            ya, yb, idx = ort(x)
            assert not idx.requires_grad and idx.dtype == torch.int64
            loss = (ya.sum() if "a" in use else 0) + (yb.sum() if "b" in use else 0)
            loss.backward()
            assert (net.a.weight.grad is not None) == ("a" in use)
            assert (net.b.weight.grad is not None) == ("b" in use)


def test_guards_still_fire_on_the_short_path():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    ort = ORTModule(net)
    x = torch.randn(3, 4)
    ort(x).sum().backward()
    n = _exports(ort)
    ort(x).sum().backward()
    assert _exports(ort) == n                           # steady state: no export
    ort(x.double().float()[:, :2].repeat(1, 2))         # same schema, another tensor: no export
    assert _exports(ort) == n
    ort.eval()
    out = ort(x)
    assert _exports(ort) == n + 1                       # train/eval is in the key
    torch.testing.assert_close(out, net(x))             # eval: dropout off
    ort.train()
    with torch.no_grad():
        assert not ort(x).requires_grad                 # grad mode is in the key
    assert ort(x).requires_grad
    ort(x.double().float().unsqueeze(0))                # a new rank: export again
    assert _exports(ort) > n + 1
    m = _exports(ort)
    net[0].weight.requires_grad_(False)                 # requires_grad of a parameter: new engine
    net.zero_grad(set_to_none=True)
    ort(x).sum().backward()
    assert net[0].weight.grad is None and net[0].bias.grad is not None
    net.double()                                        # dtypes changed in place: export again
    out = ort(x.double())
    assert out.dtype == torch.float64 and _exports(ort) > m
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        net.register_buffer("extra", torch.zeros(1))    # a registration: re-checked
    ort(x.double())
