"""FusedAdam on an ORTModule: a small MLP trained with ORTModule + FusedAdam (mode 2)
matches eager PyTorch + torch.optim.AdamW from the same initial weights.

Tolerances as the MLP parity suite's (rtol 1e-4, atol 1e-5): the engine's gradients
differ from eager's at fp32 rounding level; the optimizers themselves agree to ~1e-7."""
import copy

import pytest
import torch
import torch.nn as nn

from ortmod import ORTModule
from ortmod.optim import AdamWMode, FusedAdam


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 5))
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x, y):
        return self.loss(self.net(x), y)


def test_ortmodule_fused_adam_matches_eager_adamw():
    eager = MLP()
    ort = ORTModule(copy.deepcopy(eager))
    kw = dict(lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.01)
    eager_opt = torch.optim.AdamW(eager.parameters(), foreach=False, **kw)
    ort_opt = FusedAdam(ort.parameters(), adam_w_mode=AdamWMode.ADAMW_TORCH, **kw)
    g = torch.Generator().manual_seed(0)
    for step in range(10):
        x = torch.randn(8, 16, generator=g)
        y = torch.randint(0, 5, (8,), generator=g)
        le = eager(x, y)
        le.backward()
        eager_opt.step()
        eager_opt.zero_grad()
        lo = ort(x, y)
        lo.backward()
        ort_opt.step()
        ort_opt.zero_grad()
        torch.testing.assert_close(lo.detach(), le.detach(), rtol=1e-4, atol=1e-5)
    for (name, a), b in zip(eager.named_parameters(), ort.parameters()):
        d = (a - b).abs().max().item()
        print(f"{name}: max abs diff {d:.2e}")
        torch.testing.assert_close(b.detach(), a.detach(), rtol=1e-4, atol=1e-5)
    assert all(p.grad is None for p in ort.parameters())   # set_grad_none
