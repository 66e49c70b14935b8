"""Fractional max pooling through ORTModule against eager (ortmod/capture/rules/nn.py's rule).

torch's TorchScript exporter has no rule for fractional_max_pool{2,3}d. ortmod's rule computes
eager's window starts in the graph from the module's ``_random_samples`` (a graph input: new
samples need no new export), gathers each window into a block and max-pools the blocks. Checked
against eager: outputs, indices, input gradients, with ties (integer values), overlapping
windows, output size 1, unbatched inputs, both dtypes; and a clean refusal when the windows come
from torch's random generator.
"""
import pytest
import torch
import torch.nn as nn

from ortmod import ORTModule, UnsupportedModelError


def _samples(n, c, rank, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return torch.rand(n, c, rank, dtype=dtype, generator=g)


def _check(make, x, ties=False, steps=2):
    """Eager and ORTModule modules from make(); outputs (and indices) equal, input gradients
    equal for a random output gradient."""
    eager, ort = make(), ORTModule(make())
    for step in range(steps):
        xe, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
        ye, yo = eager(xe), ort(xo)
        if isinstance(ye, tuple):
            assert torch.equal(yo[1], ye[1]), "indices differ"
            ye, yo = ye[0], yo[0]
        assert torch.equal(yo, ye)
        dy = torch.randn(ye.shape, dtype=ye.dtype)
        ye.backward(dy)
        yo.backward(dy)
        torch.testing.assert_close(xo.grad, xe.grad, rtol=1e-6, atol=1e-6)
        x = x + 0.25 if not ties else x.flip(-1)


CASES_2D = [
    # (input shape, kernel, output_size or ratio)
    ((2, 3, 9, 7), 2, dict(output_size=(4, 3))),
    ((2, 3, 9, 7), (3, 2), dict(output_ratio=0.5)),
    ((1, 2, 11, 6), 4, dict(output_size=(5, 1))),     # windows overlap; one window along W
    ((3, 10, 8), 2, dict(output_size=(4, 4))),        # unbatched
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape,kernel,size", CASES_2D)
@pytest.mark.parametrize("ties", [False, True])
def test_fractional_max_pool2d_matches_eager(dtype, shape, kernel, size, ties):
    torch.manual_seed(0)
    x = torch.randint(-3, 3, shape).to(dtype) if ties else torch.randn(shape, dtype=dtype)
    n, c = (shape[0], shape[1]) if len(shape) == 4 else (1, shape[0])
    samples = _samples(n, c, 2, dtype, seed=len(shape))
    _check(lambda: nn.FractionalMaxPool2d(kernel, _random_samples=samples, **size), x, ties=ties)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("shape,kernel,size", [((2, 2, 7, 6, 9), (2, 3, 2), dict(output_size=(3, 2, 4))),
                                               ((2, 7, 7, 5), 2, dict(output_ratio=0.5))])
def test_fractional_max_pool3d_matches_eager(dtype, shape, kernel, size):
    torch.manual_seed(1)
    x = torch.randint(-2, 2, shape).to(dtype)
    n, c = (shape[0], shape[1]) if len(shape) == 5 else (1, shape[0])
    samples = _samples(n, c, 3, dtype, seed=3)
    _check(lambda: nn.FractionalMaxPool3d(kernel, _random_samples=samples, **size), x, ties=True)


def test_indices_and_samples_that_change_between_calls():
    """return_indices gives eager's flat indices; new samples move the windows without a new
    export (the samples are an input of the graph)."""
    torch.manual_seed(2)
    x = torch.randn(2, 3, 12, 10)
    eager = nn.FractionalMaxPool2d(3, output_size=(5, 4), return_indices=True, _random_samples=_samples(2, 3, 2, torch.float32, 0))
    ort = ORTModule(nn.FractionalMaxPool2d(3, output_size=(5, 4), return_indices=True,
                                           _random_samples=eager._random_samples.clone()))
    for seed in range(3):
        samples = _samples(2, 3, 2, torch.float32, seed)
        eager._random_samples = samples
        ort.module._random_samples = samples.clone()
        ye, ie = eager(x)
        yo, io = ort(x)
        assert torch.equal(yo, ye) and torch.equal(io, ie), seed


def test_windows_from_the_random_generator_are_refused():
    ort = ORTModule(nn.FractionalMaxPool2d(2, output_ratio=0.5))
    # named by the TorchScript path's rule; the torch.export path's audit names the draw (aten::rand)
    with pytest.raises(UnsupportedModelError, match="fractional_max_pool2d.*random generator|aten::rand .*pooling.py"):
        ort(torch.randn(1, 2, 8, 8, requires_grad=True))
