"""F.interpolate / nn.Upsample through ORTModule against eager autograd (ortmod/capture/rules/nn.py's
upsampling rules: nearest and nearest-exact as per-axis Gathers of eager's source indices,
linear / bilinear / trilinear separable with eager's indices and weights; bicubic and
antialias refused).

Each case: forward and input gradients for one random output gradient, ORTModule against
eager, relative to each tensor's size, in float64 and float32."""
import copy
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ortmod
from ortmod import ORTModule
from oputil import Fn

TOL = {torch.float64: (1e-10, 1e-12), torch.float32: (1e-5, 1e-6)}


def _scale(t):
    return max(t.abs().max().item(), 1.0) if t.numel() else 1.0


def check(module, x):
    if not isinstance(module, nn.Module):
        module = Fn(module)
    rtol, atol = TOL[x.dtype]
    ort = ORTModule(copy.deepcopy(module))
    xe, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    ye, yo = module(xe), ort(xo)
    assert ye.shape == yo.shape and ye.dtype == yo.dtype
    torch.testing.assert_close(yo, ye, rtol=rtol, atol=atol * _scale(ye))
    dy = torch.randn(ye.shape, dtype=ye.dtype)
    (ye * dy).sum().backward()
    (yo * dy).sum().backward()
    torch.testing.assert_close(xo.grad, xe.grad, rtol=rtol, atol=atol * _scale(xe.grad))


CASES = [
    # (rank, kwargs, spatial input shape)
    (2, dict(scale_factor=2, mode="nearest"), (5, 6)),
    (2, dict(scale_factor=1.5, mode="nearest"), (5, 7)),
    (2, dict(scale_factor=0.5, mode="nearest"), (7, 6)),
    (2, dict(scale_factor=(1.5, 0.7), mode="nearest", recompute_scale_factor=True), (5, 7)),
    (2, dict(size=(7, 3), mode="nearest"), (4, 6)),
    (1, dict(scale_factor=2.5, mode="nearest"), (7,)),
    (3, dict(size=(3, 5, 4), mode="nearest"), (2, 3, 5)),
    (1, dict(scale_factor=1.5, mode="nearest-exact"), (5,)),
    (2, dict(size=(7, 3), mode="nearest-exact"), (4, 6)),
    (3, dict(scale_factor=(2, 0.5, 1.5), mode="nearest-exact"), (2, 4, 3)),
    (1, dict(scale_factor=2, mode="linear", align_corners=False), (5,)),
    (1, dict(size=9, mode="linear", align_corners=True), (4,)),
    (2, dict(scale_factor=2, mode="bilinear", align_corners=False), (4, 5)),
    (2, dict(scale_factor=1.5, mode="bilinear", align_corners=False), (5, 7)),
    (2, dict(scale_factor=0.5, mode="bilinear", align_corners=False), (7, 6)),
    (2, dict(scale_factor=1.5, mode="bilinear", align_corners=True), (5, 7)),
    (2, dict(size=(7, 5), mode="bilinear", align_corners=False), (4, 6)),
    (2, dict(size=(9, 4), mode="bilinear", align_corners=True), (4, 6)),
    (2, dict(size=(1, 5), mode="bilinear", align_corners=True), (4, 6)),
    (2, dict(size=(4, 9), mode="bilinear", align_corners=False), (4, 6)),   # H copied
    (2, dict(scale_factor=(1.3, 2.0), mode="bilinear", recompute_scale_factor=True), (5, 7)),
    (3, dict(scale_factor=2, mode="trilinear", align_corners=False), (2, 3, 4)),
    (3, dict(size=(3, 5, 2), mode="trilinear", align_corners=True), (2, 3, 4)),
]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("rank,kwargs,spatial", CASES, ids=[f"{k['mode']}{r}d-{i}" for i, (r, k, _) in enumerate(CASES)])
def test_interpolate(rank, kwargs, spatial, dtype):
    check(lambda v: F.interpolate(v, **kwargs), torch.randn(2, 3, *spatial, dtype=dtype))


@pytest.mark.parametrize("module", [
    nn.Upsample(scale_factor=2), nn.Upsample(size=(5, 9), mode="bilinear"),
    nn.Upsample(scale_factor=1.5, mode="bilinear", align_corners=True),
    nn.UpsamplingNearest2d(scale_factor=3), nn.UpsamplingBilinear2d(size=(7, 3)),
])
def test_upsample_modules(module):
    check(module, torch.randn(2, 2, 4, 6, dtype=torch.float64))


def test_nonfinite_inputs():
    # eager multiplies every neighbour by its weight, 0 too: an inf or NaN reaches the outputs
    # that read it with weight 0 as NaN
    x = torch.randn(1, 2, 4, 5, dtype=torch.float64)
    x[0, 0, 1, 2] = float("inf")
    x[0, 1, 3, 0] = float("nan")
    for kw in (dict(size=(7, 9), mode="bilinear"), dict(size=(7, 9), mode="bilinear", align_corners=True),
               dict(scale_factor=2, mode="nearest")):
        want = F.interpolate(x, **kw)
        have = ORTModule(Fn(lambda v: F.interpolate(v, **kw)))(x)
        torch.testing.assert_close(have, want, rtol=1e-12, atol=1e-12, equal_nan=True)


def test_other_input_size_reexports():
    # the indices hold only for the traced sizes: another size must give eager's result too
    m = ORTModule(Fn(lambda v: F.interpolate(v, scale_factor=1.5, mode="bilinear")))
    for shape in [(1, 2, 4, 6), (1, 2, 5, 3), (2, 2, 4, 6)]:
        x = torch.randn(*shape, dtype=torch.float64)
        torch.testing.assert_close(m(x), F.interpolate(x, scale_factor=1.5, mode="bilinear"), rtol=1e-12, atol=1e-12)


class _Decoder(nn.Module):
    """A UNet-like decoder stage: conv, upsample, concat with a skip, conv."""

    def __init__(self, mode):
        super().__init__()
        self.down = nn.Conv2d(3, 4, 3, stride=2, padding=1)
        self.up = nn.Upsample(scale_factor=2, mode=mode, **({} if mode == "nearest" else {"align_corners": False}))
        self.out = nn.Conv2d(4 + 3, 2, 3, padding=1)

    def forward(self, x):
        return self.out(torch.cat([self.up(torch.relu(self.down(x))), x], 1))


@pytest.mark.parametrize("mode", ["nearest", "bilinear"])
def test_decoder_trains(mode):
    torch.manual_seed(0)
    eager = _Decoder(mode).double()
    ort = ORTModule(copy.deepcopy(eager))
    oe = torch.optim.SGD(eager.parameters(), lr=0.1)
    oo = torch.optim.SGD(ort.parameters(), lr=0.1)
    for _ in range(3):
        x, t = torch.randn(2, 3, 8, 10, dtype=torch.float64), torch.randn(2, 2, 8, 10, dtype=torch.float64)
        for m, o in ((eager, oe), (ort, oo)):
            o.zero_grad()
            F.mse_loss(m(x), t).backward()
            o.step()
    for (n, a), b in zip(eager.named_parameters(), ort.parameters()):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12, msg=lambda m: f"{n}: {m}")


@pytest.mark.parametrize("kwargs,name", [
    (dict(size=(7, 5), mode="bicubic"), "upsample_bicubic2d"),
    (dict(size=(3, 3), mode="bilinear", antialias=True), "_upsample_bilinear2d_aa"),
    (dict(size=(3, 3), mode="bicubic", antialias=True), "_upsample_bicubic2d_aa"),
])
def test_refused(kwargs, name):
    m = ORTModule(Fn(lambda v: F.interpolate(v, **kwargs)))
    # named first by the TorchScript path's rule; the torch.export path's audit names the aten op
    export = ortmod.DebugOptions().capture == "export"
    with pytest.raises(ortmod.UnsupportedModelError, match=f"aten::{name}" if export else f"^{name}"):
        m(torch.randn(1, 2, 4, 6, dtype=torch.float64))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kwargs", [dict(size=(7, 9), mode="bilinear"), dict(scale_factor=1.5, mode="nearest")])
def test_half(kwargs, dtype):
    # computed in float32 and rounded once, as eager's op math: within a rounding of eager's
    x = torch.randn(1, 2, 4, 5, dtype=dtype)
    xe, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    if kwargs["mode"] == "bilinear" and ortmod.DebugOptions().capture == "export":
        # the torch.export path's rule reproduces float32 and float64 weights only: refused by name
        with pytest.raises(ortmod.UnsupportedModelError, match="linear interpolation of torch"):
            ORTModule(Fn(lambda v: F.interpolate(v, **kwargs)))(xo)
        return
    ye, yo = F.interpolate(xe, **kwargs), ORTModule(Fn(lambda v: F.interpolate(v, **kwargs)))(xo)
    dy = torch.randn_like(ye)
    (ye * dy).sum().backward()
    (yo * dy).sum().backward()
    eps = torch.finfo(dtype).eps
    torch.testing.assert_close(yo.float(), ye.float(), rtol=2 * eps, atol=2 * eps * _scale(ye.float()))
    torch.testing.assert_close(xo.grad.float(), xe.grad.float(), rtol=2 * eps, atol=2 * eps * _scale(xe.grad.float()))


# ---- nearest on the TorchScript path: the gradient goes where eager's backward sends it -------
# Eager's backward (UpSample.h's nearest_idx / nearest_exact_idx) computes its own source index,
# in float, copying for O == L and halving for O == 2 L (nearest); for some sizes it is not the
# forward's: scale_factor 1.1 at size 4 reads [0, 0, 1, 2] and sends the gradient as for
# [0, 1, 2, 3]; float64 from 24 to 74 differs too. The gradient is compared exactly: the output
# gradient holds small integers, so every sum is exact in any order.

def _scan_ts(sizes, dtype, **kw):
    m = ORTModule(Fn(lambda v: F.interpolate(v, **kw)), ortmod.DebugOptions(capture="torchscript"))
    g = torch.Generator().manual_seed(0)
    bad = []
    for size in sizes:
        x = torch.randn((2, 2) + tuple(size), generator=g, dtype=dtype)
        xe, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
        ye, yo = F.interpolate(xe, **kw), m(xo)
        what = f"{kw} {dtype} input {tuple(x.shape)}"
        assert yo.shape == ye.shape and torch.equal(yo, ye), what
        dy = torch.randint(-8, 9, ye.shape, generator=g).to(dtype)
        (ye * dy).sum().backward()
        (yo * dy).sum().backward()
        if not torch.equal(xo.grad, xe.grad):
            bad.append(what)
    assert not bad, "input gradient differs from eager's:\n" + "\n".join(bad)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("mode", ["nearest", "nearest-exact"])
@pytest.mark.parametrize("how", [dict(scale_factor=s) for s in (0.5, 0.7, 1 / 3, 1.1, 1.5, 2.0, 2.05, 2.5, 3.0)]
                         + [dict(size=s) for s in (1, 5, 22, 74)], ids=str)
def test_torchscript_nearest_1d_as_eager(how, mode, dtype):
    low = 3 if how.get("scale_factor", 1) < 1 else 1
    sizes = list(range(low, 30)) + ([24, 26, 39] if "size" in how else [])
    _scan_ts([(s,) for s in sizes], dtype, mode=mode, **how)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["f32", "f64"])
@pytest.mark.parametrize("kw,sizes", [
    # 2-d: eager's forward for O_h + O_w <= 128 reads at its backward's index, else the formula's
    (dict(mode="nearest", scale_factor=(2, 1.1)), [(4, 6), (5, 3), (4, 120), (3, 70)]),
    (dict(mode="nearest", size=(22, 74)), [(4, 6), (24, 61), (26, 40)]),
    (dict(mode="nearest", scale_factor=1.1), [(4, 4), (7, 9), (4, 130)]),
    (dict(mode="nearest-exact", scale_factor=(0.7, 1.1)), [(4, 6), (5, 130)]),
    (dict(mode="nearest-exact", size=(7, 74)), [(4, 24), (5, 26)]),
    (dict(mode="nearest", scale_factor=1.1), [(4, 4, 4), (3, 7, 5)]),
    (dict(mode="nearest", size=(3, 22, 74)), [(2, 24, 24), (3, 26, 61)]),
    (dict(mode="nearest-exact", size=(3, 5, 2)), [(2, 3, 4), (3, 3, 1)]),
    (dict(mode="nearest-exact", scale_factor=(1.1, 2.05, 0.7)), [(4, 5, 6), (9, 3, 4)]),
], ids=str)
def test_torchscript_nearest_2d_3d_as_eager(kw, sizes, dtype):
    _scan_ts(sizes, dtype, **kw)


def test_torchscript_nearest_nonfinite_where_the_indices_differ():
    # scale_factor 1.1 at size 4, float32: forward [0, 0, 1, 2], backward [0, 1, 2, 3]. The
    # value is eager's even where the backward's element is inf or NaN; the documented gap
    # (_export_rules.gather_with_gradient_at): that output's gradient reaches no element, where
    # eager's reaches the inf / NaN one. Every other element's gradient is eager's.
    kw = dict(scale_factor=1.1, mode="nearest")
    m = ORTModule(Fn(lambda v: F.interpolate(v, **kw)), ortmod.DebugOptions(capture="torchscript"))
    x = torch.randn(1, 2, 4)
    x[0, 0, 3], x[0, 1, 2] = float("inf"), float("nan")
    xe, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    ye, yo = F.interpolate(xe, **kw), m(xo)
    assert torch.equal(yo.isnan(), ye.isnan()) and torch.equal(yo.nan_to_num(), ye.nan_to_num())
    dy = torch.tensor([[[1.0, 2, 3, 4]], [[5, 6, 7, 8]]]).reshape(1, 2, 4)
    (ye * dy).sum().backward()
    (yo * dy).sum().backward()
    want = xe.grad.clone()
    want[0, 0, 3] -= dy[0, 0, 3]     # output 3 reads x[2] and eager sends its gradient to x[3]
    want[0, 1, 2] -= dy[0, 1, 2]     # output 2 reads x[1] and eager sends its gradient to x[2]
    assert torch.equal(xo.grad, want), (xo.grad, xe.grad)


# ---- memory layout: eager's 2-d and 3-d nearest kernels read at another index for a channels-last
# input of more than 3 channels (UpSampleKernel.cpp, _use_vectorized_kernel_cond_2d / _3d): the
# backward's nearest_idx, which differs from the formula where the output size is the input's or
# twice it and the scale is not 1 or 2 (scale 1.005 at 100, 1.05 at 10) ---------------------------

class _LaidOut(nn.Module):
    """A conv, its output given a layout (``permute``: channels-last inside the model), then
    nearest upsampling: the layout eager's kernel sees comes from the input or from the model."""

    def __init__(self, rank, channels, kwargs, permute):
        super().__init__()
        self.conv = (nn.Conv2d if rank == 2 else nn.Conv3d)(channels, channels, 1)
        self.kwargs, self.permute = kwargs, permute

    def forward(self, x):
        h = self.conv(x)
        if self.permute:
            order = (0, 2, 3, 1) if h.dim() == 4 else (0, 2, 3, 4, 1)
            back = (0, 3, 1, 2) if h.dim() == 4 else (0, 4, 1, 2, 3)
            h = h.permute(*order).contiguous().permute(*back)
        return F.interpolate(h, **self.kwargs)


LAYOUTS = [
    (2, dict(scale_factor=1.005, mode="nearest"), (100, 100)),
    (2, dict(scale_factor=1.005, mode="nearest-exact"), (100, 100)),
    (2, dict(size=(4, 9), mode="nearest"), (4, 6)),
    (3, dict(scale_factor=1.05, mode="nearest"), (10, 10, 10)),
    (3, dict(scale_factor=(1.05, 2.0, 0.5), mode="nearest-exact"), (10, 3, 4)),
]


@pytest.mark.parametrize("channels", [3, 8])
@pytest.mark.parametrize("how", ["input", "inside"])
@pytest.mark.parametrize("rank,kwargs,spatial", LAYOUTS, ids=[f"{k['mode']}{r}d-{i}" for i, (r, k, _) in enumerate(LAYOUTS)])
def test_nearest_follows_eager_memory_layout(rank, kwargs, spatial, how, channels):
    torch.manual_seed(0)
    module = _LaidOut(rank, channels, kwargs, permute=how == "inside")
    x = torch.randn(2, channels, *spatial)
    if how == "input":      # eager's conv keeps a channels-last input's layout
        x = x.contiguous(memory_format=torch.channels_last if rank == 2 else torch.channels_last_3d)
        if rank == 3 and channels > 3 and os.environ.get("ORTMOD_CAPTURE") == "export":
            # torch.export traces Conv3d's output of such an input as contiguous, eager's is not
            with pytest.raises(ortmod.UnsupportedModelError, match="channels-last-3d input"):
                ORTModule(module)(x)
            return
    check(module, x)


def test_nearest_exports_again_when_an_input_layout_changes():
    # the graph read one layout's index arithmetic: a call in the other must not reuse it
    torch.manual_seed(0)
    module = _LaidOut(2, 8, dict(scale_factor=1.005, mode="nearest"), permute=False)
    ort = ORTModule(copy.deepcopy(module))
    x = torch.randn(2, 8, 100, 100)
    for fmt in (torch.channels_last, torch.contiguous_format, torch.contiguous_format, torch.channels_last):
        v = x.contiguous(memory_format=fmt)
        torch.testing.assert_close(ort(v), module(v), rtol=1e-5, atol=1e-5)
