"""Pools and BatchNormalization on shapes large enough that their planes / channels are
shared out over the pool (ops/pool.c, ops/norm.c), at 1 and 2 threads: float64 outputs
and gradients against torch's autograd with the same output gradient. The windows mix
positions clear of the padding (taps walked without bounds checks) with clipped ones."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from oputil import make_model, run
from ortmod import _C

RNG = np.random.default_rng(99)


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    before = _C.get_num_threads()
    _C.set_num_threads(request.param)
    yield request.param
    _C.set_num_threads(before)


def engine(op, inputs, attrs, n_outputs=1, opset=20, grad=None):
    feeds = list(inputs.values())
    return run(make_model(op, inputs, attrs, n_outputs=n_outputs, opset=opset), feeds,
               grad=grad if grad is not None else [True] * len(feeds), seed=3)


def check_grads(names, grads, tensors):
    for name, g in zip(names, grads):
        np.testing.assert_allclose(g, tensors[name].grad.numpy(), rtol=1e-9, atol=1e-10,
                                   err_msg=f"gradient of {name}")


POOLS = [
    ({"kernel_shape": [2, 2], "strides": [2, 2]}, dict(kernel_size=2, stride=2)),
    ({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, dict(kernel_size=3, stride=2, padding=1)),
    ({"kernel_shape": [3, 2], "strides": [1, 2], "pads": [1, 0, 1, 0], "dilations": [2, 1]},
     dict(kernel_size=(3, 2), stride=(1, 2), padding=(1, 0), dilation=(2, 1))),
    ({"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}, dict(kernel_size=3, stride=2, ceil_mode=True)),
]


@pytest.mark.parametrize("attrs,kw", POOLS)
def test_maxpool_planes(attrs, kw, threads):
    x = RNG.standard_normal((8, 24, 17, 18))
    outs, grads, dys = engine("MaxPool", {"X": x}, attrs, n_outputs=2)
    xt = torch.from_numpy(x.copy()).requires_grad_()
    y, idx = F.max_pool2d(xt, return_indices=True, **kw)
    plane = x.shape[2] * x.shape[3]
    off = (np.arange(x.shape[0] * x.shape[1]) * plane).reshape(x.shape[0], x.shape[1], 1, 1)
    np.testing.assert_array_equal(outs[0], y.detach().numpy())
    np.testing.assert_array_equal(outs[1], idx.numpy() + off)
    y.backward(torch.from_numpy(dys[0]))
    check_grads(["X"], grads, {"X": xt})


# Windows two wide at stride 2 along W take MAX_ROW_PAIRS (ops/pool.c): the benchmark ResNet's
# MaxPool2d(2) at its exact shape, taller windows, a stride of 1 along H, rows longer than its
# 256-position chunks, a padded border (the pairs run inside it), 3-D, and batch 1. Values are
# rounded to a few levels so that windows hold ties (the first tap wins) and NaNs (the last
# NaN wins): Indices must be eager's, exactly, in both dtypes.
PAIRS = [
    ("bench_resnet", (64, 32, 32, 32), dict(kernel_size=2, stride=2)),
    ("tall", (3, 5, 13, 20), dict(kernel_size=(3, 2), stride=(2, 2))),
    ("stride_1_along_h", (2, 4, 9, 11), dict(kernel_size=(2, 2), stride=(1, 2))),
    ("long_rows", (1, 2, 4, 1100), dict(kernel_size=2, stride=2)),
    ("padded", (2, 3, 10, 15), dict(kernel_size=2, stride=2, padding=1)),
    ("dilated_h", (2, 3, 12, 14), dict(kernel_size=(2, 2), stride=2, dilation=(2, 1))),
    ("batch_1_ceil", (1, 7, 9, 9), dict(kernel_size=2, stride=2, ceil_mode=True)),
]


def _pool_attrs(rank, kw):
    def per(v):
        return list(v) if isinstance(v, tuple) else [v] * rank
    attrs = {"kernel_shape": per(kw["kernel_size"]), "strides": per(kw["stride"])}
    if "padding" in kw:
        attrs["pads"] = per(kw["padding"]) * 2
    if "dilation" in kw:
        attrs["dilations"] = per(kw["dilation"])
    if kw.get("ceil_mode"):
        attrs["ceil_mode"] = 1
    return attrs


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("name,shape,kw", PAIRS + [("3d", (2, 3, 4, 6, 8), dict(kernel_size=2, stride=2))],
                         ids=[p[0] for p in PAIRS] + ["3d"])
def test_maxpool_pairs(name, shape, kw, dtype, threads):
    x = np.round(RNG.standard_normal(shape) * 2).astype(dtype)   # few levels: ties in most windows
    flat = x.reshape(-1)
    flat[RNG.choice(flat.size, max(1, flat.size // 50), replace=False)] = np.nan
    rank = len(shape) - 2
    outs, grads, dys = engine("MaxPool", {"X": x}, _pool_attrs(rank, kw), n_outputs=2)
    pool = {2: F.max_pool2d, 3: F.max_pool3d}[rank]
    xt = torch.from_numpy(x.copy()).requires_grad_()
    y, idx = pool(xt, return_indices=True, **kw)
    plane = int(np.prod(shape[2:]))
    off = (np.arange(shape[0] * shape[1]) * plane).reshape(shape[0], shape[1], *([1] * rank))
    np.testing.assert_array_equal(outs[0], y.detach().numpy())
    np.testing.assert_array_equal(outs[1], idx.numpy() + off)
    y.backward(torch.from_numpy(dys[0]))
    np.testing.assert_array_equal(grads[0], xt.grad.numpy())   # at most two dY per input: exact in any order


@pytest.mark.parametrize("incl", [0, 1])
@pytest.mark.parametrize("attrs,kw", [p for p in POOLS if "dilations" not in p[0]])
def test_avgpool_planes(attrs, kw, incl, threads):
    x = RNG.standard_normal((8, 24, 17, 18))
    outs, grads, dys = engine("AveragePool", {"X": x}, dict(attrs, count_include_pad=incl))
    xt = torch.from_numpy(x.copy()).requires_grad_()
    y = F.avg_pool2d(xt, count_include_pad=bool(incl), **kw)
    np.testing.assert_allclose(outs[0], y.detach().numpy(), rtol=1e-12, atol=1e-12)
    y.backward(torch.from_numpy(dys[0]))
    check_grads(["X"], grads, {"X": xt})


@pytest.mark.parametrize("op", ["GlobalAveragePool", "GlobalMaxPool"])
def test_global_pool_planes(op, threads):
    x = RNG.standard_normal((16, 40, 9, 11))
    outs, grads, dys = engine(op, {"X": x}, {})
    xt = torch.from_numpy(x.copy()).requires_grad_()
    y = xt.mean((2, 3), keepdim=True) if op == "GlobalAveragePool" else xt.amax((2, 3), keepdim=True)
    np.testing.assert_allclose(outs[0], y.detach().numpy(), rtol=1e-12, atol=1e-12)
    y.backward(torch.from_numpy(dys[0]))
    check_grads(["X"], grads, {"X": xt})


@pytest.mark.parametrize("shape", [(32, 48, 13, 7), (64, 20, 37), (40, 70)])
def test_batchnorm_training_channels(shape, threads):
    C = shape[1]
    inputs = {"X": RNG.standard_normal(shape) * 3 + 2, "scale": RNG.standard_normal(C), "B": RNG.standard_normal(C),
              "mean": RNG.standard_normal(C), "var": np.abs(RNG.standard_normal(C)) + 0.5}
    attrs = {"training_mode": 1, "momentum": 0.9, "epsilon": 1e-5}
    outs, grads, dys = engine("BatchNormalization", inputs, attrs, n_outputs=3, opset=15,
                              grad=[True, True, True, False, False])
    t = {k: torch.from_numpy(v.copy()).requires_grad_(k in ("X", "scale", "B")) for k, v in inputs.items()}
    rm, rv = t["mean"].clone(), t["var"].clone()
    # the momentum attribute is a float32, read as the 0.9 that was written (not 0.899999976)
    y = F.batch_norm(t["X"], rm, rv, t["scale"], t["B"], training=True, momentum=0.1, eps=1e-5)
    np.testing.assert_allclose(outs[0], y.detach().numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(outs[1], rm.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(outs[2], rv.numpy(), rtol=1e-10, atol=1e-12)
    y.backward(torch.from_numpy(dys[0]))
    check_grads(["X", "scale", "B"], grads[:3], t)


def test_batchnorm_inference_channels(threads):
    C = 48
    inputs = {"X": RNG.standard_normal((16, C, 11, 9)), "scale": RNG.standard_normal(C),
              "B": RNG.standard_normal(C), "mean": RNG.standard_normal(C),
              "var": np.abs(RNG.standard_normal(C)) + 0.5}
    outs, grads, dys = engine("BatchNormalization", inputs, {"epsilon": 1e-5}, opset=15,
                              grad=[True, True, True, False, False])
    t = {k: torch.from_numpy(v.copy()).requires_grad_(k in ("X", "scale", "B")) for k, v in inputs.items()}
    y = F.batch_norm(t["X"], t["mean"], t["var"], t["scale"], t["B"], training=False, eps=1e-5)
    np.testing.assert_allclose(outs[0], y.detach().numpy(), rtol=1e-10, atol=1e-10)
    y.backward(torch.from_numpy(dys[0]))
    check_grads(["X", "scale", "B"], grads[:3], t)


# A sweep over kernel / stride / padding / dilation / ceil_mode on small inputs, 1-D to 3-D,
# against eager: output sizes (eager's pooling_output_shape: floor division, a ceil_mode window
# must start inside the input or its leading padding), values, Indices and gradients. Small
# inputs make the edge cases common: ceil_mode windows that run past the padded input, and a
# dilated kernel longer than the padded input (seed 80058's MaxPool2d(3, 2, 1, dilation=2,
# ceil_mode=True) over a height of 2 was refused as "kernel extent 5 exceeds the padded
# input 4"). Where eager finds no window (output size 0) the engine must refuse too.
def _sweep(seed, n, dilated):
    rng = np.random.default_rng(seed)
    cases = []
    while len(cases) < n:
        rank = int(rng.integers(1, 4))
        k = [int(rng.integers(1, 5)) for _ in range(rank)]
        kw = dict(kernel_size=tuple(k), stride=tuple(int(rng.integers(1, 4)) for _ in range(rank)),
                  padding=tuple(int(rng.integers(0, ki // 2 + 1)) for ki in k), ceil_mode=bool(rng.random() < 0.7))
        if dilated:
            kw["dilation"] = tuple(int(rng.integers(1, 4)) for _ in range(rank))
        shape = (2, 3) + tuple(int(rng.integers(1, 8 if rank < 3 else 6)) for _ in range(rank))
        cases.append((shape, kw))
    return cases


def _empty_window(shape, kw):
    """Has some window no tap inside the input (only a dilated one can)?"""
    for i, n in enumerate(shape[2:]):
        k, s, p = kw["kernel_size"][i], kw["stride"][i], kw["padding"][i]
        d = kw.get("dilation", (1,) * len(shape))[i]
        span = n + 2 * p - d * (k - 1) - 1 + (s - 1 if kw["ceil_mode"] else 0)
        out = span // s + 1
        if kw["ceil_mode"] and (out - 1) * s >= n + p:
            out -= 1
        if any(not any(0 <= o * s - p + t * d < n for t in range(k)) for o in range(out)):
            return True
    return False


def _attrs_of(rank, kw):
    a = {"kernel_shape": list(kw["kernel_size"]), "strides": list(kw["stride"]), "pads": list(kw["padding"]) * 2,
         "ceil_mode": int(kw["ceil_mode"])}
    if "dilation" in kw:
        a["dilations"] = list(kw["dilation"])
    return a


MAX_SWEEP = _sweep(80058, 120, dilated=True)


@pytest.mark.parametrize("shape,kw", MAX_SWEEP, ids=[f"{s[2:]}-{kw}" for s, kw in MAX_SWEEP])
def test_maxpool_sweep_against_eager(shape, kw):
    rank = len(shape) - 2
    x = RNG.standard_normal(shape)
    xt = torch.from_numpy(x.copy()).requires_grad_()
    pool = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[rank]
    try:
        y, idx = pool(xt, return_indices=True, **kw)
    except RuntimeError as e:
        assert "too small" in str(e)
        with pytest.raises(Exception, match="exceeds the padded input"):
            engine("MaxPool", {"X": x}, _attrs_of(rank, kw))
        return
    if _empty_window(shape, kw):
        with pytest.raises(Exception, match="no tap inside the input"):
            engine("MaxPool", {"X": x}, _attrs_of(rank, kw), n_outputs=2)
        return
    outs, grads, dys = engine("MaxPool", {"X": x}, _attrs_of(rank, kw), n_outputs=2)
    assert outs[0].shape == tuple(y.shape)
    np.testing.assert_array_equal(outs[0], y.detach().numpy())
    plane = int(np.prod(shape[2:]))
    off = (np.arange(shape[0] * shape[1]) * plane).reshape(shape[0], shape[1], *([1] * rank))
    np.testing.assert_array_equal(outs[1], idx.numpy() + off)
    y.backward(torch.from_numpy(dys[0]))
    check_grads(["X"], grads, {"X": xt})


def test_maxpool_empty_window():
    """A window with no tap inside the input: eager's max there is -inf, which the engine's
    forward gives (no Indices asked for, no gradient); eager's index there points outside the
    window, in the next row, and its backward adds the window's gradient to that element, so
    the Indices (and with them the gradient) are refused by name."""
    kw = dict(kernel_size=(2, 2), stride=(2, 1), padding=(0, 1), dilation=(3, 2), ceil_mode=True)
    x = RNG.standard_normal((2, 3, 5, 1))
    assert _empty_window(x.shape, kw)
    outs, _, _ = engine("MaxPool", {"X": x}, _attrs_of(2, kw), grad=[False])
    np.testing.assert_array_equal(outs[0], F.max_pool2d(torch.from_numpy(x), **kw).numpy())
    assert np.isneginf(outs[0]).any()
    with pytest.raises(Exception, match="no tap inside the input"):
        engine("MaxPool", {"X": x}, _attrs_of(2, kw), n_outputs=2)


AVG_SWEEP = _sweep(80059, 80, dilated=False)


@pytest.mark.parametrize("incl", [0, 1])
@pytest.mark.parametrize("shape,kw", AVG_SWEEP, ids=[f"{s[2:]}-{kw}" for s, kw in AVG_SWEEP])
def test_avgpool_sweep_against_eager(shape, kw, incl):
    rank = len(shape) - 2
    x = RNG.standard_normal(shape)
    xt = torch.from_numpy(x.copy()).requires_grad_()
    pool = {1: F.avg_pool1d, 2: F.avg_pool2d, 3: F.avg_pool3d}[rank]
    attrs = dict(_attrs_of(rank, kw), count_include_pad=incl)
    try:
        y = pool(xt, count_include_pad=bool(incl), **kw)
    except RuntimeError as e:
        if "smaller than kernel size" in str(e):   # avg_pool3d's own check on the unpadded input:
            return                                  # no eager result (nor a capture) to compare
        assert "too small" in str(e)
        with pytest.raises(Exception, match="exceeds the padded input"):
            engine("AveragePool", {"X": x}, attrs)
        return
    outs, grads, dys = engine("AveragePool", {"X": x}, attrs)
    assert outs[0].shape == tuple(y.shape)
    np.testing.assert_allclose(outs[0], y.detach().numpy(), rtol=1e-12, atol=1e-12)
    y.backward(torch.from_numpy(dys[0]))
    check_grads(["X"], grads, {"X": xt})
