"""Recompute (ORTMODULE_MEMORY_OPT_LEVEL): same results, smaller stash."""
import copy
import json

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from ortmod import ORTModule


class Block(nn.Module):
    """A pre-LN transformer-style MLP block, twice: LayerNorm, Linear, GELU, Linear, residual."""

    def __init__(self, d=32, layers=2):
        super().__init__()
        self.lns = nn.ModuleList(nn.LayerNorm(d) for _ in range(layers))
        self.ups = nn.ModuleList(nn.Linear(d, 4 * d) for _ in range(layers))
        self.downs = nn.ModuleList(nn.Linear(4 * d, d) for _ in range(layers))
        self.head = nn.Linear(d, 5)

    def forward(self, x, y):
        for ln, up, down in zip(self.lns, self.ups, self.downs):
            x = x + down(F.gelu(up(ln(x))))
        return F.cross_entropy(self.head(x).reshape(-1, 5), y.reshape(-1))


def run(level, ortmod_env, base):
    ortmod_env.setenv("ORTMODULE_MEMORY_OPT_LEVEL", str(level))
    model = ORTModule(copy.deepcopy(base))
    torch.manual_seed(1)
    x, y = torch.randn(4, 8, 32), torch.randint(0, 5, (4, 8))
    loss = model(x, y)
    loss.backward()
    (entry,) = [e for e in model._ortmod_cache.values() if getattr(e, "engine", None) is not None]
    report = json.loads(entry.engine.report())
    grads = [p.grad.clone() for p in model.parameters()]
    return loss.detach(), grads, report


def test_recompute_levels_same_results_less_stash(ortmod_env):
    torch.manual_seed(0)
    base = Block()
    loss0, g0, r0 = run(0, ortmod_env, base)
    assert r0["recomputed_nodes"] == 0
    stash = {0: r0["plans"][0]["stash_bytes"]}
    for level in (1, 2):
        loss, g, r = run(level, ortmod_env, base)
        assert r["memory_opt_level"] == level
        assert r["recomputed_nodes"] > 0, f"level {level} recomputed nothing"
        torch.testing.assert_close(loss, loss0, rtol=1e-6, atol=1e-7)
        for a, b in zip(g, g0):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
        stash[level] = r["plans"][0]["stash_bytes"]
    assert stash[1] < stash[0], stash
    assert stash[2] < stash[1], stash


def test_bad_level_is_a_clear_error(ortmod_env):
    ortmod_env.setenv("ORTMODULE_MEMORY_OPT_LEVEL", "7")
    model = ORTModule(Block())
    with pytest.raises(Exception, match="memory optimization level 7"):
        model(torch.randn(2, 3, 32), torch.randint(0, 5, (2, 3)))
