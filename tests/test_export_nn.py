"""nn layers through ORTModule against eager autograd (ortmod/capture/rules/nn.py's export rules).

torch's TorchScript exporter has no rule for rms_norm and bilinear, exports threshold only at
0, emits pools with a kernel of the input's rank on unbatched inputs, exports adaptive pools
only where the output size divides the input's, and LocalResponseNorm with an If. ortmod's
rules decompose eager's computation into engine ops.

Each case: forward, and the gradients of the inputs and parameters for one random output
gradient, ORTModule against eager, relative to each tensor's size; in float64 unless the
case is about float32. Max pools get ties (the gradient must go to eager's element) and
return_indices (indices must equal eager's).
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from ortmod import ORTModule
from oputil import Fn

D = torch.float64


def _scale(t):
    finite = t[torch.isfinite(t)] if t.numel() else t
    return max(finite.abs().max().item(), 1.0) if finite.numel() else 1.0


def _tensors(out):
    return list(out) if isinstance(out, (tuple, list)) else [out]


def check(module, *inputs, rtol=1e-10, atol=1e-12):
    """``module`` (an nn.Module, or a function) through ORTModule and eagerly: every output
    (integer ones exactly), then input and parameter gradients for a random output gradient
    on the floating outputs."""
    if not isinstance(module, nn.Module):
        module = Fn(module)
    eager, ort = module, ORTModule(copy.deepcopy(module))
    xe = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
    xo = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
    ye, yo = _tensors(eager(*xe)), _tensors(ort(*xo))
    assert len(ye) == len(yo)
    for k, (a, b) in enumerate(zip(yo, ye)):
        assert a.shape == b.shape and a.dtype == b.dtype, f"output {k}: {a.shape} {a.dtype} vs {b.shape} {b.dtype}"
        if b.is_floating_point():
            scale = _scale(b)
            torch.testing.assert_close(a, b, rtol=rtol, atol=atol * scale, equal_nan=True,
                                       msg=lambda m: f"output {k}: {m}")
        else:
            assert torch.equal(a, b), f"output {k} differs: {a} vs {b}"
    dys = [torch.randn(y.shape, dtype=y.dtype) if y.is_floating_point() else None for y in ye]
    le = sum((y * d).sum() for y, d in zip(ye, dys) if d is not None)
    lo = sum((y * d).sum() for y, d in zip(yo, dys) if d is not None)
    le.backward()
    lo.backward()
    pe = [p.grad for p in eager.parameters()]
    po = [p.grad for p in ort.parameters()]
    for k, (a, b) in enumerate(zip([x.grad for x in xo] + po, [x.grad for x in xe] + pe)):
        if b is None:
            assert a is None or not a.any(), f"gradient {k}: ortmod gives one, eager none"
            continue
        assert a is not None, f"gradient {k}: eager gives one, ortmod none"
        scale = _scale(b)
        torch.testing.assert_close(a, b, rtol=rtol, atol=atol * scale, equal_nan=True, msg=lambda m: f"gradient {k}: {m}")


def _x(*shape, dtype=D):
    return torch.randn(*shape, dtype=dtype)


# ---- rms_norm -------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,normalized,affine,eps", [
    ((4, 5), [5], True, 1e-3),
    ((4, 3, 5), [5], False, 1e-3),
    ((4, 2, 3, 5), [2, 3, 5], True, None),
    ((4, 2, 3, 5), [3, 5], False, None),
    ((7,), [7], True, 1e-6),
    ((3, 5), [5], True, 0.0),
])
@pytest.mark.parametrize("dtype", [torch.float32, D])
def test_rms_norm(shape, normalized, affine, eps, dtype):
    m = nn.RMSNorm(normalized, eps=eps, elementwise_affine=affine).to(dtype)
    if affine:
        with torch.no_grad():
            m.weight.copy_(torch.randn_like(m.weight))
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else {}
    check(m, _x(*shape, dtype=dtype), **tol)


def test_rms_norm_eps_none_is_the_dtypes_epsilon():
    # rows of tiny values: mean(x^2) comparable with eps, where eps None must be finfo.eps
    for dtype in (torch.float32, D):
        x = torch.full((2, 4), 1e-4 if dtype == torch.float32 else 1e-8, dtype=dtype)
        x[1] *= -3
        check(lambda v: F.rms_norm(v, [4]), x, rtol=1e-5 if dtype == torch.float32 else 1e-10)


def test_rms_norm_zero_row():
    x = _x(3, 4)
    x[1] = 0
    check(nn.RMSNorm([4], eps=1e-5).to(D), x)


# ---- threshold ------------------------------------------------------------------------------

@pytest.mark.parametrize("th,value", [(2.0, 1.0), (2.0, 10.0), (0.0, 0.0), (-0.5, 3.0), (0.1, 0.1)])
def test_threshold(th, value):
    x = _x(2, 3, 4, 5) * 2
    x.view(-1)[:4] = th          # at the threshold: value, gradient 0 (eager's x <= th)
    check(nn.Threshold(th, value), x)


def test_threshold_scalar_unbatched_and_nan():
    check(nn.Threshold(0.5, -1.0), torch.tensor(0.7, dtype=D))
    check(nn.Threshold(0.5, -1.0), torch.tensor(0.3, dtype=D))
    x = torch.tensor([0.2, float("nan"), 0.9, 0.5], dtype=D)   # NaN passes, with its gradient
    check(nn.Threshold(0.5, -1.0), x)


# ---- bilinear -------------------------------------------------------------------------------

@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("lead", [(8,), (), (2, 3)])
def test_bilinear(bias, lead):
    m = nn.Bilinear(2, 3, 4, bias=bias).to(D)
    check(m, _x(*lead, 2), _x(*lead, 3))


def test_bilinear_float32():
    m = nn.Bilinear(5, 3, 7)
    check(m, _x(6, 5, dtype=torch.float32), _x(6, 3, dtype=torch.float32), rtol=1e-5, atol=1e-6)


# ---- pools on unbatched inputs --------------------------------------------------------------

@pytest.mark.parametrize("module,shape", [
    (nn.AvgPool1d(2), (3, 6)),
    (nn.AvgPool1d(3, 2, 1, ceil_mode=True, count_include_pad=False), (3, 7)),
    (nn.AvgPool2d(2), (3, 6, 6)),
    (nn.AvgPool2d(3, 2, 1, divisor_override=2), (2, 7, 5)),
    (nn.AvgPool3d(2), (3, 4, 4, 4)),
    (nn.AvgPool3d((2, 3, 1), 1, (1, 1, 0)), (2, 3, 5, 4)),
    (nn.LPPool1d(2, 2, 3), (3, 7)),
    (nn.LPPool2d(1.5, 2), (3, 7, 7)),
    (nn.LPPool3d(2, 2, 2), (3, 5, 5, 5)),
    (nn.MaxPool1d(3, 2, 1), (3, 7)),
    (nn.MaxPool2d(3, 2, 1), (3, 7, 7)),
    (nn.MaxPool2d(3, 2, 1, return_indices=True), (3, 7, 7)),
    (nn.MaxPool3d(2, return_indices=True), (2, 4, 5, 4)),
    (nn.MaxPool2d(3, 2, 1, return_indices=True), (1, 3, 7, 7)),
])
def test_pool_unbatched(module, shape):
    x = _x(*shape)
    if isinstance(module, nn.LPPool1d) or isinstance(module, (nn.LPPool2d, nn.LPPool3d)):
        x = x.abs() + 0.1                        # a power of a negative number is NaN for p 1.5
    check(module, x)


# ceil_mode windows that run past the padded input, down to a dilated kernel longer than it
# (model fuzzer seed 80058: MaxPool2d(3, 2, 1, dilation=2, ceil_mode=True) over a height of 2,
# refused as "kernel extent 5 exceeds the padded input 4"; eager pools one window there)
@pytest.mark.parametrize("module,shape", [
    (nn.MaxPool2d(3, 2, 1, dilation=2, ceil_mode=True), (2, 6, 2, 9)),
    (nn.MaxPool2d(3, 2, 1, dilation=2, ceil_mode=True, return_indices=True), (2, 3, 2, 9)),
    (nn.MaxPool1d(4, 3, 2, dilation=2, ceil_mode=True, return_indices=True), (2, 3, 6)),
    (nn.MaxPool3d((2, 3, 2), (2, 2, 3), (1, 1, 0), dilation=(1, 2, 1), ceil_mode=True), (1, 2, 3, 3, 5)),
    (nn.AvgPool1d(4, 2, 1, ceil_mode=True), (2, 3, 1)),
    (nn.AvgPool1d(4, 2, 1, ceil_mode=True, count_include_pad=False), (2, 3, 1)),
    (nn.AvgPool2d(3, 3, 1, ceil_mode=True), (2, 3, 4, 5)),
    (nn.AvgPool2d(3, 3, 1, ceil_mode=True, count_include_pad=False), (2, 3, 4, 5)),
])
def test_pool_ceil_windows_past_the_padding(module, shape):
    check(module, _x(*shape))


def test_max_pool_unbatched_ties():
    x = torch.round(_x(3, 7, 7))                 # integers: many ties within a window
    check(nn.MaxPool2d(3, 2, 1, return_indices=True), x)


# ---- adaptive pools -------------------------------------------------------------------------

ADAPTIVE = [
    (1, 3, (1, 3, 5)), (1, 3, (3, 5)), (1, 1, (1, 3, 5)), (1, 4, (2, 3, 4)), (1, 5, (2, 2, 3)),
    (2, 3, (1, 3, 5, 6)), (2, 3, (3, 5, 6)), (2, 1, (1, 3, 5, 6)), (2, (3, 4), (1, 3, 5, 6)),
    (2, (3, None), (1, 3, 5, 6)), (2, (2, 3), (2, 2, 4, 6)), (2, (4, 5), (2, 2, 5, 7)),
    (3, 3, (2, 3, 5, 2, 7)), (3, 3, (3, 5, 2, 7)), (3, (3, 4, 5), (2, 3, 5, 3, 7)),
    (3, (None, 4, 5), (2, 3, 5, 3, 7)), (3, (3, 2, 2), (1, 1, 3, 2, 6)), (3, 1, (2, 2, 3, 4, 5)),
]


@pytest.mark.parametrize("rank,size,shape", ADAPTIVE)
def test_adaptive_avg_pool(rank, size, shape):
    check([nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d, nn.AdaptiveAvgPool3d][rank - 1](size), _x(*shape))


@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("rank,size,shape", ADAPTIVE)
def test_adaptive_max_pool(rank, size, shape, ties):
    x = _x(*shape)
    if ties:
        x = torch.round(x)                       # ties in every window: eager's first maximum
    cls = [nn.AdaptiveMaxPool1d, nn.AdaptiveMaxPool2d, nn.AdaptiveMaxPool3d][rank - 1]
    check(cls(size, return_indices=True), x)
    check(cls(size), x)


def test_adaptive_max_pool_constant_input():
    # every element ties: eager picks the first of each window, in row-major order
    check(nn.AdaptiveMaxPool2d((3, 4), return_indices=True), torch.ones(1, 2, 5, 7, dtype=D))
    check(nn.AdaptiveMaxPool3d(2, return_indices=True), torch.ones(1, 3, 3, 5, dtype=D))


def test_adaptive_pool_float32():
    x = _x(2, 3, 7, 9, dtype=torch.float32)
    check(nn.AdaptiveAvgPool2d((4, 5)), x, rtol=1e-5, atol=1e-6)
    check(nn.AdaptiveMaxPool2d((4, 5)), x, rtol=1e-6, atol=1e-7)


def test_adaptive_pool_second_call_other_size():
    # the decomposition holds only for the traced sizes: another size must re-export
    m = ORTModule(nn.AdaptiveAvgPool2d((3, 4)).to(D))
    for shape in [(1, 2, 5, 7), (1, 2, 8, 6), (2, 2, 5, 7)]:
        x = _x(*shape)
        torch.testing.assert_close(m(x), F.adaptive_avg_pool2d(x, (3, 4)), rtol=1e-12, atol=1e-12)


# ---- local_response_norm --------------------------------------------------------------------

@pytest.mark.parametrize("args,shape", [
    ((3,), (1, 5, 7)), ((2,), (1, 5, 7, 7)), ((1, 1.0, 0.5, 2.0), (1, 5, 7, 7, 7)),
    ((4, 1e-2, 0.75, 1.0), (2, 6, 5)), ((5,), (2, 7, 3, 4)),
])
def test_local_response_norm(args, shape):
    check(nn.LocalResponseNorm(*args), _x(*shape))


@pytest.mark.parametrize("cls,size,shape", [
    (nn.AdaptiveMaxPool1d, 4, (1, 2, 6)), (nn.AdaptiveMaxPool1d, 1, (1, 2, 6)),
    (nn.AdaptiveMaxPool2d, (2, 3), (1, 2, 3, 5)), (nn.AdaptiveMaxPool3d, (2, 1, 3), (2, 3, 3, 5)),
    (nn.AdaptiveMaxPool2d, 1, (1, 2, 3, 5)),
])
def test_adaptive_max_pool_nan(cls, size, shape):
    # eager's kernel keeps the last NaN of a window (val > max || isnan(val)): its index and
    # the gradient go there
    x = _x(*shape)
    x.view(-1)[::3] = float("nan")
    x.view(-1)[1::7] = float("nan")
    check(cls(size, return_indices=True), x)


# ---- F.pad (constant) and view: the rules LocalResponseNorm needs ---------------------------

@pytest.mark.parametrize("pad,value", [((1, 2), 0.0), ((0, 0, 2, 1), 1.5), ((1, -1, -2, 3), -2.0),
                                       ((1, 1, 1, 1, 1, 1), 0.25)])
def test_constant_pad(pad, value):
    check(lambda v: F.pad(v, pad, value=value), _x(2, 3, 4, 5))


def test_constant_pad_and_view_other_sizes():
    # the pads are constants, the shapes computed: one export serves other sizes
    m = ORTModule(Fn(lambda v: F.pad(v.view(v.size(0), 1, v.size(1), -1), (1, 2, 0, 1)).squeeze(1)))
    for shape in [(2, 3, 4), (3, 5, 2), (1, 2, 6, 2)]:
        x = _x(*shape)
        want = F.pad(x.view(x.size(0), 1, x.size(1), -1), (1, 2, 0, 1)).squeeze(1)
        torch.testing.assert_close(m(x), want, rtol=0, atol=0)
