"""The CPU engine hands a frame's dead pages back to the system as a call runs (plan.c's release
schedule, engine.c's release_after): at memory level 0 lazily (MADV_FREE, a later touch costs
nothing), at levels >= 1 at once (MADV_DONTNEED); a frame of 16 MiB or more lies on 2 MiB huge
pages and releases whole ones (core.c's om_alloc_frame, om_frame_page). Either way, a page the schedule releases must
hold nothing that a later node, the backward or the caller still reads.

The engine's test hook om_release_poison (set through ctypes) fills every released range with
0xff bytes, a NaN in every float type, and keeps it mapped: a schedule that releases a live byte
then shows as NaN or as a different loss/gradient, where the real release would often leave the
stale value in place and hide the bug. Each model trains a few SGD steps with the hook on and
off; losses, gradients and parameters must be bit-identical, and the plan must have had ranges
to release (else the test proves nothing)."""
import ctypes
import os
import sys

import pytest
import torch

from ortmod import ORTModule, _C, options
from ortmod._explain import engine_reports

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "bench"))
import models as bench_models  # noqa: E402

POISON = ctypes.c_int.in_dll(ctypes.CDLL(_C.__file__), "om_release_poison")

# small sizes nobody tuned for; each still has buffers above the release threshold (64 KiB)
MODELS = {
    "gpt2": (lambda: bench_models.GPT(vocab=512, d=96, heads=3, layers=2, max_len=40),
             lambda: bench_models.gpt_batch(batch=5, seq=37, vocab=512)),
    "llama": (lambda: bench_models.Llama(vocab=512, d=96, heads=4, kv_heads=2, ffn=200, layers=2, max_len=40),
              lambda: bench_models.gpt_batch(batch=5, seq=37, vocab=512)),
    "bert": (lambda: bench_models.BERT(vocab=600, d=64, heads=2, layers=2, max_len=40),
             lambda: bench_models.bert_batch(batch=6, seq=33, vocab=600)),
    "resnet": (lambda: bench_models.ResNet(width=16), lambda: bench_models.cnn_batch(batch=9)),
    "mlp": (lambda: bench_models.MLP(d_in=200, width=300, layers=3),
            lambda: bench_models.mlp_batch(batch=70, d_in=200)),
    # a frame above 16 MiB: it sits on 2 MiB huge pages, and its ranges are cut to whole ones
    "gpt2-huge-frame": (lambda: bench_models.GPT(vocab=4096, d=64, heads=2, layers=1, max_len=64),
                        lambda: bench_models.gpt_batch(batch=16, seq=64, vocab=4096)),
}
HUGE_FRAME_BYTES = 16 << 20


def train(name, level, poison, steps=3):
    make, batch = MODELS[name]
    torch.manual_seed(0)
    model = ORTModule(make())
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    losses, grads = [], []
    POISON.value = int(poison)
    try:
        with options.overridden(memory_opt_level=level):
            for step in range(steps):
                args = batch() if step % 2 == 0 else tuple(a[:-1] for a in batch())   # two shapes
                opt.zero_grad()
                loss = model(*args)
                loss.backward()
                losses.append(loss.detach().clone())
                grads.append([p.grad.clone() for p in model.parameters()])
                opt.step()
    finally:
        POISON.value = 0
    plans = [plan for r in engine_reports(model) for plan in r["plans"]]
    return losses, grads, [p.detach().clone() for p in model.parameters()], plans


@pytest.mark.parametrize("level", [0, 1, 2])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_released_pages_hold_nothing_live(name, level):
    ref_losses, ref_grads, ref_params, plans = train(name, level, poison=False)
    assert sum(p["release_ranges"] for p in plans) > 0, f"{name} at level {level}: nothing released, nothing proved"
    if name.endswith("huge-frame"):
        assert max(p["frame_bytes"] for p in plans) >= HUGE_FRAME_BYTES
    losses, grads, params, _ = train(name, level, poison=True)
    for step, (a, b) in enumerate(zip(ref_losses, losses)):
        assert torch.isfinite(b).all(), f"{name} level {level} step {step}: loss read a released page"
        assert torch.equal(a, b), f"{name} level {level} step {step}: loss {a.item()} vs {b.item()}"
    for step, (ga, gb) in enumerate(zip(ref_grads, grads)):
        for i, (a, b) in enumerate(zip(ga, gb)):
            assert torch.equal(a, b), f"{name} level {level} step {step}: gradient {i} differs"
    for a, b in zip(ref_params, params):
        assert torch.equal(a, b)

