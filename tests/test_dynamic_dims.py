"""Which input dims an export declares dynamic, and what happens when a static one changes.

The first export declares every input dim dynamic. Where torch's exporter needs a size it
cannot read from a dynamic dim (an adaptive pool's input, InstanceNorm's channels), ortmod
exports again with static input dims; the graph then holds only for those sizes, and a call
with another size there exports again, declaring the dims that changed dynamic.

The torch.export path (ORTMOD_CAPTURE=export) starts from the other end, as torch.compile's
automatic dynamic shapes: its first export holds every dim static, a call with another size
exports again with the dims that varied symbolic, and later sizes reuse that export. Counts of
exports are each path's own."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from ortmod import DebugOptions, ORTModule
from tests.test_semantics import rel_close


def export_path():
    return DebugOptions().capture == "export"


def check_calls(module, shapes):
    eager, ort = copy.deepcopy(module), ORTModule(copy.deepcopy(module))
    counts = []
    for shape in shapes:
        x = torch.randn(shape)
        xe, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
        ye, yo = eager(xe), ort(xo)
        rel_close(f"{shape} output", yo, ye)
        w = torch.randn_like(ye)
        (ye * w).sum().backward()
        (yo * w).sum().backward()
        rel_close(f"{shape} input grad", xo.grad, xe.grad)
        for (n, pe), (_, po) in zip(eager.named_parameters(), ort.named_parameters()):
            rel_close(f"{shape} grad of {n}", po.grad, pe.grad)
            pe.grad = po.grad = None
        counts.append(ort._ortmod_export_count)
    return counts


class PoolHead(nn.Module):
    """An adaptive pool: torch's exporter needs its input's static size."""
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)

    def forward(self, x):
        return F.adaptive_avg_pool2d(torch.relu(self.conv(x)), 2) + F.adaptive_max_pool2d(x, 2).mean(1, keepdim=True)


def test_static_export_follows_every_size_change():
    counts = check_calls(PoolHead(), [(2, 3, 6, 6), (2, 3, 6, 6), (3, 3, 6, 6), (3, 3, 8, 8), (2, 3, 6, 6)])
    # torch.export traces the pools with symbolic sizes: the last call reuses the export that
    # made the batch and the spatial dims symbolic
    assert counts == ([1, 1, 2, 3, 3] if export_path() else [1, 1, 2, 3, 4])


class LengthMean(nn.Module):
    """Dynamic everywhere: one export for every size."""
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(5, 3)

    def forward(self, x):
        return self.lin(x).mean(1)


def test_dynamic_export_is_reused_across_sizes():
    counts = check_calls(LengthMean(), [(2, 4, 5), (3, 7, 5), (1, 1, 5), (6, 2, 5)])
    # torch.export path: static first, then symbolic for every later size (size 1 too)
    assert counts == ([1, 2, 2, 2] if export_path() else [1, 1, 1, 1])


def test_static_dims_are_checked_before_the_engine_runs(monkeypatch):
    """An export whose dims are all static (forced here) holds for its sizes only: another
    size exports again, declaring the dim that changed dynamic. (The torch.export path's exports
    are like that without forcing: the same sequence.)"""
    from ortmod.capture import torchscript, export as torch_export
    path = torch_export if export_path() else torchscript
    real = path.export
    seen = []

    def only_learned(module, flat, dynamic=None, **kw):
        seen.append(dynamic)
        return real(module, flat, dynamic=dynamic or frozenset(), **kw)
    monkeypatch.setattr(path, "export", only_learned)
    counts = check_calls(LengthMean(), [(2, 4, 5), (2, 4, 5), (3, 4, 5), (6, 4, 5), (6, 9, 5), (2, 2, 5)])
    assert counts == [1, 1, 2, 2, 3, 3]
    assert seen == [None, frozenset({(0, 0)}), frozenset({(0, 0), (0, 1)})]


def test_eval_mode_survives_a_retried_export():
    """torch.onnx.export restores the wrapper's mode recursively: a failed first attempt had
    turned an eval-mode module to training, and the retry traced BatchNorm with batch stats."""
    bn = nn.BatchNorm2d(3, affine=False)
    with torch.no_grad():
        bn.running_mean.uniform_(-1, 1)
        bn.running_var.uniform_(0.5, 2.0)
    bn.eval()
    ort = ORTModule(copy.deepcopy(bn))
    x = torch.randn(2, 3, 4, 4)
    rel_close("eval BatchNorm", ort(x), bn(x))
    assert not ort.training and not bn.training


def test_output_shape_the_exporter_got_wrong_is_refused(monkeypatch):
    """torch's adaptive pool rule reads an unbatched (C, H, W) input as batched: the first
    engine run of an export must return eager's shapes. (ortmod's own rule, in capture/rules/nn.py,
    exports it right; torch's is put back here to have an export that gets a shape wrong.)
    The wrong rule is a TorchScript symbolic, so the TorchScript path is picked whatever
    ORTMOD_CAPTURE says: the torch.export path never reads it."""
    import ortmod
    from ortmod.capture.rules import nn as nn_rules
    from ortmod.capture import onnx_util

    def torchs_rule(registration, opset):
        name = "aten::adaptive_avg_pool2d"
        return {name: onnx_util._torch_symbolic(registration, name, opset)}
    monkeypatch.setattr(nn_rules, "symbolics", torchs_rule)
    with pytest.raises(ortmod.UnsupportedModelError, match=r"shape \(3, 5, 3\) where eager gives \(3, 3, 3\)"):
        ORTModule(nn.AdaptiveAvgPool2d(3), DebugOptions(capture="torchscript"))(torch.randn(3, 5, 6))
