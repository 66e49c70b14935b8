"""The engine does the math: no aten op that computes may run in torch during an ORTModule step.

A TorchDispatchMode records every aten op that reaches torch's dispatcher while the
step runs (forward + backward). Only allocation / view / alias ops are allowed, plus
what autograd itself needs to seed ``loss.backward()`` (a ones tensor).
"""
import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

from ortmod import ORTModule

# aten overload-packet names that do not compute anything from tensor values.
ALLOWED = frozenset({
    # allocation (and filling a fresh allocation with a constant: the backward seed)
    "empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided",
    "zeros", "zeros_like", "new_zeros", "ones", "ones_like", "new_ones", "fill_", "scalar_tensor",
    # views and aliases: same storage, no data touched
    "detach", "alias", "view", "_unsafe_view", "as_strided", "t", "expand", "lift_fresh",
    "_reshape_alias", "squeeze", "unsqueeze", "permute", "transpose",
    # metadata queries
    "is_same_size", "sym_size", "sym_stride", "sym_numel", "sym_storage_offset",
})


class OpRecorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func)
        return func(*args, **(kwargs or {}))

    def computing_ops(self):
        return sorted({str(f) for f in self.ops if f.overloadpacket.__name__ not in ALLOWED})


def assert_no_compute(rec, what):
    bad = rec.computing_ops()
    recorded = [str(f) for f in rec.ops]
    assert not bad, (f"{what}: torch computed {bad}; the engine must do the math.\n"
                     f"all aten ops recorded ({len(recorded)}): {recorded}")


class MLPWithLoss(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32),
                                 nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 5))
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x, y):
        return self.loss(self.net(x), y)


class MLPLogits(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32),
                                 nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 5))

    def forward(self, x):
        return self.net(x)


def test_guard_catches_eager_compute():
    """The recorder itself works: an eager step is full of computing ops."""
    model = MLPWithLoss()
    x, y = torch.randn(8, 16), torch.randint(0, 5, (8,))
    with OpRecorder() as rec:
        model(x, y).backward()
    names = {f.overloadpacket.__name__ for f in rec.ops}
    assert {"addmm", "mm", "gelu", "native_layer_norm"} & names
    assert rec.computing_ops()


def test_training_step_loss_inside_runs_no_torch_compute():
    model = ORTModule(MLPWithLoss())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(8, 16), torch.randint(0, 5, (8,))
    model(x, y).backward()                 # warm-up: export + compile happen here
    opt.step()
    opt.zero_grad(set_to_none=True)
    assert model._ortmod_export_count == 1

    with OpRecorder() as rec:
        loss = model(x, y)
        loss.backward()
    assert_no_compute(rec, "forward+backward with the loss inside the module")
    assert model._ortmod_export_count == 1
    assert torch.isfinite(loss).all()
    for name, p in model.named_parameters():
        assert p.grad is not None and torch.isfinite(p.grad).all(), name
        assert p.grad.abs().sum() > 0, f"grad of {name} is all zeros"


def test_training_step_logits_runs_no_torch_compute():
    model = ORTModule(MLPLogits())
    x = torch.randn(8, 16)
    grad_out = torch.randn(8, 5)
    model(x).backward(grad_out)
    model.zero_grad(set_to_none=True)

    with OpRecorder() as rec:
        out = model(x)
        out.backward(grad_out)
    assert_no_compute(rec, "forward+backward of a logits model")
    for name, p in model.named_parameters():
        assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_second_backward_accumulates_only_in_torch_accumulate_grad():
    """With .grad already set, torch's AccumulateGrad adds (that is torch's job, allowed);
    nothing else may compute."""
    model = ORTModule(MLPWithLoss())
    x, y = torch.randn(8, 16), torch.randint(0, 5, (8,))
    model(x, y).backward()
    with OpRecorder() as rec:
        model(x, y).backward()
    bad = [op for op in rec.computing_ops() if not op.startswith("aten.add")]
    assert not bad, f"torch computed {bad}; recorded: {[str(f) for f in rec.ops]}"
    n_params = len(list(model.parameters()))
    n_adds = sum(1 for f in rec.ops if f.overloadpacket.__name__ in ("add", "add_"))
    assert n_adds <= n_params, f"{n_adds} adds for {n_params} parameters: {[str(f) for f in rec.ops]}"


@pytest.mark.parametrize("mode", ["eval", "no_grad"])
def test_inference_runs_no_torch_compute(mode):
    model = ORTModule(MLPLogits())
    x = torch.randn(8, 16)
    if mode == "eval":
        model.eval()
        model(x)
        with OpRecorder() as rec:
            out = model(x)
    else:
        with torch.no_grad():
            model(x)
            with OpRecorder() as rec:
                out = model(x)
    assert_no_compute(rec, f"forward in {mode}")
    assert not out.requires_grad
