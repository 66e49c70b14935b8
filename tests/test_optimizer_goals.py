"""Issue 4's acceptance on GPT-2 tiny: the passes cut the exported forward by >= 30% of its
nodes and a training step by >= 30% of its kernels, with the same loss and gradients."""
import json

import pytest
import torch

from ortmod import ORTModule

transformers = pytest.importorskip("transformers")


def gpt2_step(ortmod_env, disable):
    if disable:
        ortmod_env.setenv("ORTMOD_DISABLE_PASSES", disable)
    else:
        ortmod_env.delenv("ORTMOD_DISABLE_PASSES", raising=False)
    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    model = ORTModule(transformers.GPT2LMHeadModel(cfg))
    ids = torch.randint(0, 256, (2, 16))
    mask = torch.ones(2, 16, dtype=torch.long)
    mask[1, 12:] = 0
    out = model(input_ids=ids, attention_mask=mask, labels=ids, use_cache=False)
    out.loss.backward()
    (entry,) = [e for e in model._ortmod_cache.values() if getattr(e, "engine", None) is not None]
    report = json.loads(entry.engine.report())
    grads = [p.grad.clone() for p in model.parameters() if p.grad is not None]
    return report, out.loss.detach(), grads


def test_gpt2_tiny_fewer_nodes_and_kernels_same_results(ortmod_env):
    on, loss_on, g_on = gpt2_step(ortmod_env, "")
    off, loss_off, g_off = gpt2_step(ortmod_env, "all")
    assert off["optimized_nodes"] == off["exported_nodes"]
    assert on["optimized_nodes"] <= 0.7 * on["exported_nodes"], (on["exported_nodes"], on["optimized_nodes"])
    kernels_on = on["plans"][0]["forward_kernels"] + on["plans"][0]["backward_kernels"]
    kernels_off = off["plans"][0]["forward_kernels"] + off["plans"][0]["backward_kernels"]
    assert kernels_on <= 0.7 * kernels_off, (kernels_off, kernels_on)
    torch.testing.assert_close(loss_on, loss_off, rtol=1e-5, atol=1e-6)
    assert len(g_on) == len(g_off)
    for a, b in zip(g_on, g_off):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)
