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


class LanguageHead(nn.Module):
    """A vocabulary projection and its loss: the (tokens, vocab) logits are the step's largest
    buffer, read once by the loss (optionally over (N, C, S) scores, with ignored labels)."""

    def __init__(self, d=16, vocab=50, spatial=False):
        super().__init__()
        self.body, self.head, self.spatial = nn.Linear(d, d), nn.Linear(d, vocab), spatial

    def forward(self, x, y):
        logits = self.head(torch.tanh(self.body(x)))
        if self.spatial:                      # (N, S, C) -> (N, C, S): the loss's strided form
            logits = logits.transpose(1, 2)
        return F.cross_entropy(logits if self.spatial else logits.reshape(-1, logits.shape[-1]),
                               y if self.spatial else y.reshape(-1), ignore_index=3)


@pytest.mark.parametrize("spatial", [False, True])
@pytest.mark.parametrize("level", [0, 1])
def test_the_loss_reuses_the_logits_bytes_in_place(ortmod_env, level, spatial):
    """The log-probabilities take the logits' buffer in the forward, and their gradient the
    log-probabilities' in the backward: one (tokens, vocab) buffer where there were three,
    with the loss and every gradient as eager's (fp64 eager the referee)."""
    ortmod_env.setenv("ORTMODULE_MEMORY_OPT_LEVEL", str(level))
    torch.manual_seed(0)
    base = LanguageHead(spatial=spatial)
    x, y = torch.randn(3, 7, 16), torch.randint(0, 50, (3, 7))
    y[0, :3] = 3                                              # ignored positions
    model = ORTModule(copy.deepcopy(base))
    loss = model(x, y)
    loss.backward()
    ref = copy.deepcopy(base).double()
    ref_loss = ref(x.double(), y)
    ref_loss.backward()
    torch.testing.assert_close(loss.double(), ref_loss, rtol=1e-6, atol=1e-7)
    for p, r in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad.double(), r.grad, rtol=1e-5, atol=1e-6 * r.grad.abs().max().item())
    (entry,) = [e for e in model._ortmod_cache.values() if getattr(e, "engine", None) is not None]
    plan = json.loads(entry.engine.report())["plans"][0]
    vocab_bytes = 3 * 7 * 50 * 4
    merged = [b for b in plan["largest_buffers"] if b["bytes"] == vocab_bytes and "in_place_of" in b]
    assert {b["where"] for b in merged} == {"stash", "backward_arena"}, plan["largest_buffers"]
    assert len({b["in_place_of"] for b in merged}) == 1, merged
