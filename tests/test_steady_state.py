"""No allocation in steady state: after the second training step, a step allocates exactly
what it hands out (forward outputs, gradients, the stash that its backward consumes) and
nothing else — no arena growth, no re-planning. Counted with the engine's om_alloc counter
(om_alloc_stats, read through ctypes)."""
import ctypes

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from ortmod import ORTModule, _C
from ortmod._explain import engine_reports

LIB = ctypes.CDLL(_C.__file__)


def alloc_stats():
    calls, nbytes = ctypes.c_size_t(), ctypes.c_size_t()
    LIB.om_alloc_stats(ctypes.byref(calls), ctypes.byref(nbytes))
    return calls.value, nbytes.value


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.l1, self.ln, self.l2 = nn.Linear(64, 128), nn.LayerNorm(128), nn.Linear(128, 10)

    def forward(self, x, y):
        return F.cross_entropy(self.l2(F.gelu(self.ln(self.l1(x)))), y)


@pytest.mark.parametrize("batch", [32])
def test_no_growth_after_second_step(batch):
    torch.manual_seed(0)
    model = ORTModule(Net())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    x, y = torch.randn(batch, 64), torch.randint(0, 10, (batch,))
    per_step = []
    for step in range(6):
        before = alloc_stats()
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        after = alloc_stats()
        per_step.append((after[0] - before[0], after[1] - before[1]))
    steady = per_step[2:]
    assert all(s == steady[0] for s in steady), f"allocation per step changes: {per_step}"
    reports = engine_reports(model)
    assert len(reports) == 1
    plans = reports[0]["plans"] if "plans" in reports[0] else None
    if plans is not None:
        assert len(plans) == 1, "a steady shape must not re-plan"
        p = plans[0]
        handed_out = p["stash_bytes"] + p["forward_output_bytes"] + p["gradient_bytes"]
        # om_alloc rounds nothing into the count: what a step allocates is what it hands out
        assert steady[0][1] <= handed_out + 64 * steady[0][0], (steady[0], p)
    # and the first step (plan + arena) is where the large allocations happen
    assert per_step[0][1] >= steady[0][1]
