"""The torch.export capture path (ortmod/_capture_export.py): models train through it with parity
against eager, training semantics hold (dropout, BatchNorm buffers, stop-gradients), sizes change
without a stale graph, and ORTModule falls back to it when the TorchScript exporter is gone.

Every test here selects the path with ORTMOD_CAPTURE=export (read by DebugOptions), except where
it tests the selection itself.
"""
import copy
import sys
import time

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ortmod
from ortmod import DebugOptions, ORTModule
from modelparity import train_parity, train_with_dropout
from test_semantics import rel_close, run_both


@pytest.fixture(autouse=True)
def export_path(monkeypatch):
    monkeypatch.setenv("ORTMOD_CAPTURE", "export")
    monkeypatch.delenv("ORTMODULE_FALLBACK_POLICY", raising=False)


def captured_with(model):
    records = list(model._ortmod_exports.values())
    assert records, "nothing was exported"
    return {r.exported.capture for r in records}


# ---- selection ----------------------------------------------------------------------------------

def test_option_and_environment_pick_the_path(monkeypatch):
    assert DebugOptions().capture == "export"
    assert DebugOptions(capture="torchscript").capture == "torchscript"
    monkeypatch.delenv("ORTMOD_CAPTURE")
    assert DebugOptions().capture == "auto"
    monkeypatch.setenv("ORTMOD_CAPTURE", "jit")
    with pytest.raises(ValueError, match="ORTMOD_CAPTURE: unknown capture path 'jit'"):
        DebugOptions()
    with pytest.raises(ValueError, match=r"DebugOptions\(capture=...\): unknown capture path 'x'"):
        DebugOptions(capture="x")


def test_each_path_is_used_when_picked(monkeypatch):
    m = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    a = ORTModule(copy.deepcopy(m))
    a(torch.randn(3, 4)).sum().backward()
    assert captured_with(a) == {"export"}
    b = ORTModule(copy.deepcopy(m), DebugOptions(capture="torchscript"))
    b(torch.randn(3, 4)).sum().backward()
    assert captured_with(b) == {"torchscript"}


# ---- models -------------------------------------------------------------------------------------

class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 32), nn.Tanh(),
                                 nn.Linear(32, 4))

    def forward(self, x, y):
        return F.cross_entropy(self.net(x), y)


def mlp_batches(sizes=(8, 8, 5, 13)):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(b, 16, generator=g), torch.randint(0, 4, (b,), generator=g)) for b in sizes]


def test_mlp_trains_with_parity_and_new_batch_sizes_reuse_the_export():
    eager, ort, _ = train_parity(MLP, mlp_batches(), lambda m, b: m(*b), steps=8)
    assert captured_with(ort) == {"export"}


def test_cnn_with_batchnorm_parity_and_buffers():
    import test_models_cnn as cnn
    eager, ort, _ = train_parity(cnn.TinyResNet, cnn.make_batches(), cnn.ce)
    assert captured_with(ort) == {"export"}
    for (n, be), bo in zip(eager.named_buffers(), ort.buffers()):
        assert torch.equal(bo, be) or torch.allclose(bo.float(), be.float(), rtol=1e-4, atol=1e-5), n
    assert any(n.endswith("num_batches_tracked") and int(b) == 10 for n, b in ort.named_buffers())


def test_batchnorm_updates_the_module_buffers_in_place():
    m = nn.Sequential(nn.Linear(4, 6), nn.BatchNorm1d(6)).train()
    ort = ORTModule(copy.deepcopy(m))
    mean = ort.module[1].running_mean
    x = torch.randn(5, 4)
    ort(x).sum().backward()
    m(x)
    assert ort.module[1].running_mean is mean
    rel_close("running_mean", ort.module[1].running_mean, m[1].running_mean)
    rel_close("running_var", ort.module[1].running_var, m[1].running_var)
    assert int(ort.module[1].num_batches_tracked) == 1
