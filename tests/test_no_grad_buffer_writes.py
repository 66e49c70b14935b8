"""Buffers written in place inside a ``torch.no_grad()`` region of forward (an EMA of activations,
spectral_norm's power iteration) are updated as eager updates them, on the torch.export path; the
TorchScript path refuses such a write by name. The torch.export path passed each floating input of
a no_grad region through a stop-gradient copy, so the region wrote the copy and the buffer never
changed, without a word (ortmod/capture/export.py, _insert_stop_gradients)."""
import pytest
import torch
import torch.nn as nn

import ortmod
from ortmod import ORTModule
from modelparity import train_parity


@pytest.fixture(autouse=True, params=["torchscript", "export"])
def capture(request, ortmod_env):
    ortmod_env.setenv("ORTMOD_CAPTURE", request.param)
    return request.param


class EMABuffer(nn.Module):
    """A buffer updated in place under no_grad (an EMA of activations, as VQ-VAE codebooks and
    momentum encoders keep): the torch.export path passed the region a stop-gradient copy of the
    buffer, which took the write, and the buffer never changed, without a word."""

    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 4)
        self.register_buffer("avg", torch.zeros(4))

    def forward(self, x):
        h = self.l(x)
        with torch.no_grad():
            self.avg.mul_(0.9).add_(h.mean(0), alpha=0.1)
        return (h - self.avg).pow(2).sum()


def test_buffer_updated_in_a_no_grad_region(capture):
    batches = [(torch.randn(3, 4),), (torch.randn(3, 4),)]
    if capture == "torchscript":
        with pytest.raises(ortmod.UnsupportedModelError, match="mutates buffer 'avg'"):
            ORTModule(EMABuffer())(*batches[0])
        return
    _, ort, _ = train_parity(EMABuffer, batches, lambda model, b: model(*b), steps=4)
    assert ort.avg.abs().sum() > 0


class WritesValueWithoutGradUnderNoGrad(nn.Module):
    """A value computed from a buffer (no gradient), written in place under no_grad and read
    after: the region takes it without a stop-gradient copy (it needs none), and the graph reads
    the written value, as eager."""

    def __init__(self):
        super().__init__()
        self.l = nn.Linear(4, 4)
        self.register_buffer("scale", torch.full((4,), 0.5))

    def forward(self, x):
        s = self.scale * 2
        with torch.no_grad():
            s.add_(x.mean(0))
        return (self.l(x) * s).sum()


def test_no_grad_write_into_a_value_without_gradient():
    batches = [(torch.randn(3, 4),), (torch.randn(3, 4),)]
    train_parity(WritesValueWithoutGradUnderNoGrad, batches, lambda model, b: model(*b), steps=3)
