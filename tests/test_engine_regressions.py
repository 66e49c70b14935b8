"""Regressions: models whose ORTModule step was silently wrong or crashed, each against eager
PyTorch on identical weights (outputs, input gradients, parameter gradients, each relative to
its own size). A case that once crashed the process runs in a subprocess, so that a crash
fails its test instead of ending the run."""
import copy
import os
import subprocess
import sys

import pytest
import torch
import torch.nn as nn

from ortmod import ORTModule

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def rel(got, want):
    """max |got - want| relative to want's size (an absolute floor for all-zero tensors)."""
    return ((got.double() - want.double()).abs().max() / (want.double().abs().max() + 1e-12)).item()


def step_both(module, inputs, grad_seed=0):
    """One forward + backward in eager and through ORTModule from the same weights and inputs.
    Returns (eager module, wrapped module's original, eager out, ort out, eager input grads,
    ort input grads)."""
    eager = copy.deepcopy(module)
    ort = ORTModule(module)
    xe = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    xo = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    out_e, out_o = eager(*xe), ort(*xo)
    g = torch.Generator().manual_seed(grad_seed)
    dy = torch.randn(out_e.shape, generator=g, dtype=out_e.dtype)
    out_e.backward(dy)
    out_o.backward(dy)
    return eager, module, out_e, out_o, [t.grad for t in xe], [t.grad for t in xo]


def assert_step_matches(module, inputs, tol=1e-5):
    eager, wrapped, out_e, out_o, ge, go = step_both(module, inputs)
    assert out_o.dtype == out_e.dtype and out_o.shape == out_e.shape
    assert rel(out_o, out_e) < tol, f"output differs by {rel(out_o, out_e):.2e}"
    for i, (a, b) in enumerate(zip(go, ge)):
        if b is None:
            continue
        assert a is not None, f"input {i} got no gradient"
        assert rel(a, b) < tol, f"gradient of input {i} differs by {rel(a, b):.2e}"
    for (name, p), q in zip(wrapped.named_parameters(), eager.parameters()):
        assert rel(p.grad, q.grad) < tol, f"gradient of {name} differs by {rel(p.grad, q.grad):.2e}"


# ---- padding: unbatched inputs -------------------------------------------------------------
# torch's circular-pad symbolic slices axes 2, 3, ... as if every input were (N, C, ...): on an
# unbatched (C, H, W) input CircularPad2d asked for axis 3 of a rank-3 tensor and the process
# aborted (free(): invalid pointer) inside torch's ONNX shape inference; CircularPad1d/3d were
# refused by the engine's Slice. ortmod's own symbolic counts the padded axes from the end.
# The cases run in a subprocess: a crash fails the test instead of ending the run.

PADS = [
    ("nn.CircularPad1d(1)", [(3, 5), (2, 3, 5)]),
    ("nn.CircularPad1d((2, 0))", [(3, 5)]),
    ("nn.CircularPad2d(1)", [(3, 4, 5), (2, 3, 4, 5)]),
    ("nn.CircularPad2d((2, 1, 0, 3))", [(3, 4, 5), (2, 3, 4, 5)]),
    ("nn.CircularPad2d((-1, 2, 1, -1))", [(3, 4, 5), (2, 3, 4, 5)]),   # negative pads crop first
    ("nn.CircularPad3d(1)", [(2, 3, 4, 5), (1, 2, 3, 4, 5)]),
    ("nn.ReflectionPad1d(2)", [(3, 5), (2, 3, 5)]),
    ("nn.ReflectionPad2d((0, 3, 1, 2))", [(3, 4, 5), (2, 3, 4, 5)]),
    ("nn.ReflectionPad3d(1)", [(2, 3, 4, 5), (1, 2, 3, 4, 5)]),
    ("nn.ReplicationPad1d(2)", [(3, 5), (2, 3, 5)]),
    ("nn.ReplicationPad2d(2)", [(3, 4, 5), (2, 3, 4, 5)]),
    ("nn.ReplicationPad3d(1)", [(2, 3, 4, 5), (1, 2, 3, 4, 5)]),
    ("nn.ZeroPad1d(2)", [(3, 5)]),
    ("nn.ZeroPad2d((1, 2, 0, 3))", [(3, 4, 5), (2, 3, 4, 5)]),
    ("nn.ZeroPad3d(1)", [(2, 3, 4, 5)]),
    ("nn.ConstantPad1d(2, 1.5)", [(3, 5)]),
    ("nn.ConstantPad2d((1, 2, 0, 3), 0.5)", [(3, 4, 5)]),
    ("nn.ConstantPad3d(1, 2.0)", [(2, 3, 4, 5)]),
]


class PadThenScale(nn.Module):   # a parameter after the pad: its gradient sums the padded copies
    def __init__(self, pad):
        super().__init__()
        self.pad = pad
        self.w = nn.Parameter(torch.tensor(1.5))

    def forward(self, x):
        return self.pad(x) * self.w


def _pad_sweep():
    """Runs in the subprocess: one line per case, 'ok' or what differs."""
    torch.manual_seed(0)
    for expr, shapes in PADS:
        for shape in shapes:
            try:
                assert_step_matches(PadThenScale(eval(expr)), [torch.randn(*shape)])
                print(f"ok {expr} {shape}", flush=True)
            except Exception as e:   # noqa: BLE001 - reported, and the test fails on it
                print(f"FAIL {expr} {shape}: {type(e).__name__}: {str(e)[:300]}", flush=True)


def test_padding_modules_unbatched_and_batched():
    proc = subprocess.run([sys.executable, "-c", "import test_engine_regressions as t; t._pad_sweep()"],
                          cwd=os.path.dirname(os.path.abspath(__file__)), capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, PYTHONPATH=ROOT))
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, (f"the sweep died (exit status {proc.returncode}) after:\n"
                                  + "\n".join(lines[-3:]) + "\n" + proc.stderr[-2000:])
    failed = [line for line in lines if not line.startswith("ok ")]
    assert not failed and len(lines) == sum(len(s) for _, s in PADS), "\n".join(failed or lines)


# ---- float64 models stay float64 -----------------------------------------------------------
# torch's ONNX type promotion takes a 0-d float64 tensor for a wrapped Python number of the
# default dtype: `loss + 1.0` and `loss_a + loss_b` were cast to float32 (a float64 model's
# scalar loss came back float32, computed in float32). BatchNorm's momentum and epsilon are
# float32 attributes; widened as they are (0.899999976) the running statistics of a float64
# model carried float32's rounding (2.4e-7 relative).

class ScalarLosses(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 3)

    def forward(self, x):
        h = self.lin(x)
        a = (h * h).mean()
        b = h.abs().sum()
        return a + 1.0, a + b, 0.5 * a - b / 3.0, h.sum(0)


def test_float64_scalar_outputs_stay_float64():
    torch.manual_seed(0)
    model = ScalarLosses().double()
    eager = copy.deepcopy(model)
    ort = ORTModule(model)
    x = torch.randn(4, 5, dtype=torch.float64)
    got, want = ort(x), eager(x)
    for i, (o, e) in enumerate(zip(got, want)):
        assert o.dtype == torch.float64, f"output {i} is {o.dtype}"
        assert rel(o, e) < 1e-13, f"output {i} differs by {rel(o, e):.2e}"
    sum(o.sum() for o in got).backward()
    sum(e.sum() for e in want).backward()
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):
        assert p.grad.dtype == torch.float64
        assert rel(p.grad, q.grad) < 1e-12, f"gradient of {name} differs by {rel(p.grad, q.grad):.2e}"


@pytest.mark.parametrize("momentum", [0.1, 0.01, 0.3])
def test_float64_batchnorm_running_statistics(momentum):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4, momentum=momentum, eps=1e-3), nn.Flatten(),
                          nn.Linear(4 * 4 * 4, 5), nn.BatchNorm1d(5, momentum=momentum))
    model = model.double().train()
    eager = copy.deepcopy(model)
    ort = ORTModule(model)
    for _ in range(3):
        x = torch.randn(6, 3, 6, 6, dtype=torch.float64) * 3 + 2
        got, want = ort(x), eager(x)
        assert got.dtype == torch.float64 and rel(got, want) < 1e-12
    for (name, b), c in zip(model.named_buffers(), eager.buffers()):
        if b.is_floating_point():
            assert b.dtype == torch.float64
            assert rel(b, c) < 1e-13, f"{name} differs by {rel(b, c):.2e}"


# ---- results that are views: unbatched attention --------------------------------------------
# A graph output or an input's gradient that is a view (Reshape, Unsqueeze's gradient, ...) was
# planned as an alias of the viewed buffer, whose bytes the planner frees after their last
# reader; the result is read later, when the program has ended, so a later node's value could
# be there. nn.TransformerDecoderLayer on unbatched inputs returned, as memory's gradient, the
# query's gradient in its first T rows (memory enters MultiheadAttention as memory.unsqueeze(1)).

@pytest.mark.parametrize("batch_first", [False, True])
def test_transformer_decoder_layer_unbatched(batch_first):
    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(8, 2, 16, dropout=0.0, batch_first=batch_first)
    assert_step_matches(layer, [torch.randn(5, 8), torch.randn(7, 8)])


@pytest.mark.parametrize("batch_first", [False, True])
def test_transformer_encoder_layer_unbatched(batch_first):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(8, 2, 16, dropout=0.0, batch_first=batch_first)
    assert_step_matches(layer, [torch.randn(5, 8)])


class GradientIsAView(nn.Module):
    """m's gradient is the Unsqueeze's gradient (a Reshape) of b's input gradient; the next
    gradient the backward computes, the one flowing into x * 2, is as big and took its bytes."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(64, 4)
        self.b = nn.Linear(64, 4)

    def forward(self, x, m):
        q = self.a(x * 2)
        k = self.b(m.unsqueeze(0))
        return q * k.squeeze(0)


def test_input_gradient_that_is_a_view():
    torch.manual_seed(0)
    assert_step_matches(GradientIsAView(), [torch.randn(6, 64), torch.randn(6, 64)])


class OutputIsAView(nn.Module):
    """The first output is a Reshape of x * 3, whose bytes the later forward nodes reused."""

    def __init__(self):
        super().__init__()
        self.a = nn.Linear(64, 64)

    def forward(self, x):
        first = (x * 3).reshape(-1)
        return first, torch.tanh(self.a(torch.exp(x) + 1))


def test_output_that_is_a_view():
    torch.manual_seed(0)
    model = OutputIsAView()
    eager = copy.deepcopy(model)
    x = torch.randn(6, 64)
    got, want = ORTModule(model)(x), eager(x)
    for i, (o, e) in enumerate(zip(got, want)):
        assert rel(o, e) < 1e-5, f"output {i} differs by {rel(o, e):.2e}"


# ---- BatchNorm far from a zero mean ----------------------------------------------------------
# y was computed as x * a + (bias - mean * a): where |mean| >> std the two terms cancel and y
# kept float32's rounding of x * a (3.0e-5 relative against float64 here, eager 1.4e-5).
# Centred first, (x - mean) * a + bias, it is 1.6e-5.

def test_batchnorm_output_far_from_zero_mean():
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(8)
    ref = copy.deepcopy(bn).double()
    x = torch.randn(4, 8, 5, 5) + 1000.0
    got, want = ORTModule(bn)(x), ref(x.double())
    assert rel(got, want) < 2.2e-5, f"output differs from float64 by {rel(got, want):.2e}"


def test_every_input_of_a_wide_concat_gets_its_gradient():
    """diff_inputs' bits name inputs 0..31; Concat (and PythonOp) differentiate every input:
    inputs 32..39 of a 40-way cat used to get no gradient, silently."""
    class Cat(nn.Module):
        def forward(self, *xs):
            return torch.cat(xs, 0) * torch.arange(1.0, 41.0).unsqueeze(1)

    xs = [torch.randn(1, 2, requires_grad=True) for _ in range(40)]
    ORTModule(Cat())(*xs).sum().backward()
    for i, x in enumerate(xs):
        assert x.grad is not None and torch.equal(x.grad, torch.full((1, 2), float(i + 1))), i


@pytest.mark.parametrize("bn", [nn.BatchNorm1d, nn.BatchNorm2d])
def test_batchnorm_on_an_empty_batch_keeps_its_running_statistics(bn):
    """eager's batch_norm returns before updating the running statistics of an empty batch (its
    counter still counts it); the engine updated them from a mean and variance of nothing."""
    shape = (0, 3) if bn is nn.BatchNorm1d else (0, 3, 4, 4)
    torch.manual_seed(0)
    e = bn(3)
    e.running_mean.uniform_(-1, 1)
    e.running_var.uniform_(0.5, 2)
    o = ORTModule(copy.deepcopy(e))
    x = torch.randn(shape, requires_grad=True)
    e(x).sum().backward()
    o(x.detach().clone().requires_grad_()).sum().backward()
    for name in ("running_mean", "running_var", "num_batches_tracked"):
        assert torch.equal(getattr(o.module, name), getattr(e, name)), name
