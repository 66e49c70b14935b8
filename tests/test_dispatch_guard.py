"""The engine does the math: no aten op that computes may run in torch during an ORTModule step.

A TorchDispatchMode records every aten op that reaches torch's dispatcher while the
step runs (forward + backward). Only allocation / view / alias ops are allowed, plus
what autograd itself needs to seed ``loss.backward()`` (a ones tensor).
"""
import pytest
import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

import ortmod
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
    # eval with grad enabled is differentiated, as eager; only no_grad is forward-only
    assert out.requires_grad == (mode == "eval")


# --------------------------------------------------------------------------- model suites
#
# BatchNorm bookkeeping is the one exception, and a narrow one: the engine computes the
# new running statistics; the wrapper copies them into the module's own buffers
# (aten.copy_) and counts the step in num_batches_tracked (aten.add_ of 1), as eager
# BatchNorm does in place. Those two ops are allowed only when they write a buffer of the
# wrapped module; anything else that computes still fails the guard.
STATE_BOOKKEEPING = frozenset({"copy_", "add_"})


class BookkeepingRecorder(OpRecorder):
    def __init__(self, buffers):
        super().__init__()
        self.buffer_ptrs = {b.data_ptr() for b in buffers}
        self.bookkeeping = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if (name in STATE_BOOKKEEPING and args and isinstance(args[0], torch.Tensor)
                and args[0].data_ptr() in self.buffer_ptrs):
            self.bookkeeping.append(str(func))
            return func(*args, **(kwargs or {}))
        return super().__torch_dispatch__(func, types, args, kwargs)


class SmallCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 8, 3, stride=2, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 8, 3, padding=1, groups=4), nn.BatchNorm2d(8), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 4))

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.body(x), y)


def test_cnn_step_runs_no_torch_compute_beyond_batchnorm_bookkeeping():
    inner = SmallCNN()
    model = ORTModule(inner)
    x, y = torch.randn(4, 3, 16, 16), torch.randint(0, 4, (4,))
    model(x, y).backward()
    model.zero_grad(set_to_none=True)
    with BookkeepingRecorder(inner.buffers()) as rec:
        loss = model(x, y)
        loss.backward()
    assert_no_compute(rec, "CNN forward+backward")
    # per BatchNorm: running_mean and running_var copied in, num_batches_tracked + 1 (the
    # torch.export path's graph counts too: its new value is copied in like the statistics)
    if ortmod.DebugOptions().capture == "export":
        want = ["aten.copy_.default"] * 6
    else:
        want = ["aten.copy_.default"] * 4 + ["aten.add_.Tensor"] * 2
    assert sorted(rec.bookkeeping) == sorted(want), rec.bookkeeping
    assert inner.body[1].num_batches_tracked.item() == 2


def test_gpt2_step_runs_no_torch_compute():
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64,
                                  resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1,
                                  bos_token_id=0, eos_token_id=0, use_cache=False)
    model = ORTModule(transformers.GPT2LMHeadModel(cfg))
    ids = torch.randint(0, 256, (2, 12))
    mask = torch.ones(2, 12, dtype=torch.long)
    mask[1, 9:] = 0
    model(input_ids=ids, attention_mask=mask, labels=ids).loss.backward()
    model.zero_grad(set_to_none=True)
    with OpRecorder() as rec:
        out = model(input_ids=ids, attention_mask=mask, labels=ids)
        out.loss.backward()
    assert_no_compute(rec, "GPT-2 forward+backward")
