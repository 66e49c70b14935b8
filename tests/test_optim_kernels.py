"""The optimizer kernels' building blocks, through the binding: fp16/bf16 conversion
(round to nearest even, subnormals, inf/NaN — must equal torch's), the fused
overflow-check + norm pass, and in-place / converting gradient scaling."""
import math

import pytest
import torch

import ortmod._C as _C


@pytest.fixture(autouse=True)
def torch_single_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def interesting_floats():
    """Every fp16 value's neighbourhood: all 65536 half bit patterns as floats, plus
    midpoints between neighbours (rounding ties), plus overflow and fp32 specials."""
    h = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    h = h[torch.isfinite(h)].sort().values
    mids = (h[1:].double() + h[:-1].double()).div(2).float()
    extra = torch.tensor([65504.0, 65519.99, 65520.0, 1e6, -1e6, 1e-10, -1e-10, 5.96e-8, 2.98e-8, 2.99e-8,
                          math.inf, -math.inf, math.nan, 3.4e38, 1.2e-38, 1e-45, 0.0, -0.0])
    return torch.cat([h, mids, extra, torch.randn(10000) * 100])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_conversions_match_torch(dtype):
    x = interesting_floats()
    out = torch.empty(x.shape, dtype=dtype)
    _C.grads_copy_scaled([x], [out], 1.0)                       # f32 -> half
    expect = x.to(dtype)
    same = (out.view(torch.int16) == expect.view(torch.int16)) | (torch.isnan(out) & torch.isnan(expect))
    assert bool(same.all()), f"{int((~same).sum())} mismatches, e.g. {x[~same][:5].tolist()}"
    back = torch.empty(x.shape)
    _C.grads_copy_scaled([expect], [back], 1.0)                 # half -> f32
    assert torch.equal(back.nan_to_num(7.0), expect.float().nan_to_num(7.0))


def test_check_and_norm():
    g = [torch.randn(300, 301), torch.randn(7).half(), torch.randn(5, 5).bfloat16(), torch.zeros(0)]
    found, sq = _C.grads_check_and_norm(g, 8.0)
    expect = sum(float((t.double() / 8.0).pow(2).sum()) for t in g)
    assert not found and sq == pytest.approx(expect, rel=1e-12)
    for bad in (math.inf, -math.inf, math.nan):
        for i in range(3):
            h = [t.clone() for t in g]
            h[i].view(-1)[-1] = bad
            found, sq = _C.grads_check_and_norm(h, 1.0)
            assert found and math.isinf(sq)
    big = torch.full((10,), 6e4).half()                     # squares overflow fp16/fp32, not fp64
    assert _C.grads_check_and_norm([big], 1.0) == (False, 10 * 6e4 ** 2)
    assert _C.grads_check_and_norm([], 1.0) == (False, 0.0)


def test_scale_in_place_and_into():
    a, b = torch.randn(1000, 70), torch.randn(9).half()
    a0, b0 = a.clone(), b.clone()
    _C.grads_scale([a, b], 0.25)
    assert torch.equal(a, a0 * 0.25) and torch.equal(b, (b0.float() * 0.25).half())
    dst = torch.empty(9)
    _C.grads_copy_scaled([b0], [dst], 3.0)
    assert torch.equal(dst, b0.float() * 3.0)
    with pytest.raises(ValueError, match="elements"):
        _C.grads_copy_scaled([b0], [torch.empty(8)], 1.0)
    with pytest.raises(TypeError, match="dtype"):
        _C.grads_scale([torch.zeros(3, dtype=torch.int64)], 2.0)
    with pytest.raises(ValueError):
        _C.grads_check_and_norm([a], 0.0)
