"""Conv's batched products (ops/conv.c): several images per GEMM panel, one large image cut
into several panels, ranges of images on the pool with per-range dW partials, a batch of
one on the calling thread — each at 1 and 2 threads. Shapes are sized so that each of
those paths runs (the panel keeps its im2col matrix near 512 KiB: Cg*KS*P elements).

Forward in float32 against torch; gradients in float64 against torch's autograd with the
same output gradient (the finite-difference checks in test_ops_conv.py cover the
attributes on small shapes; these shapes are too large for them). ConvTranspose runs the same
passes (its forward is ConvGradX's, its gradients Conv and ConvGradW): the same regimes, against
torch in both dtypes."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from oputil import make_model, run
from ortmod import _C

RNG = np.random.default_rng(77)

CASES = [
    # (id, x shape, w shape, ONNX attrs, torch kwargs, bias)
    ("images_per_panel", (16, 8, 6, 6), (12, 8, 3, 3), {"pads": [1, 1, 1, 1]}, dict(padding=1), True),
    ("parts_of_an_image", (2, 64, 20, 20), (4, 64, 3, 3), {"pads": [1, 1, 1, 1]}, dict(padding=1), False),
    ("parts_strided_dilated", (3, 64, 23, 21), (5, 64, 3, 3),
     {"pads": [2, 1, 2, 1], "strides": [2, 1], "dilations": [2, 1]},
     dict(padding=(2, 1), stride=(2, 1), dilation=(2, 1)), True),
    ("groups", (6, 8, 7, 5), (8, 2, 3, 3), {"group": 4, "strides": [2, 1], "pads": [1, 0, 1, 0]},
     dict(groups=4, stride=(2, 1), padding=(1, 0)), True),
    ("pointwise_images_per_panel", (12, 6, 3, 3), (5, 6, 1, 1), {}, {}, True),
    ("pointwise_parts_of_an_image", (2, 200, 30, 30), (3, 200, 1, 1), {}, {}, False),
    ("pointwise_strided", (9, 6, 7, 7), (4, 6, 1, 1), {"strides": [2, 2]}, dict(stride=2), False),
    ("batch_of_one", (1, 16, 24, 24), (8, 16, 3, 3), {"pads": [1, 1, 1, 1]}, dict(padding=1), True),
    ("odd_batch", (5, 3, 9, 9), (4, 3, 3, 3), {"strides": [2, 2]}, dict(stride=2), True),
    ("3d_parts_of_an_image", (2, 16, 6, 7, 8), (4, 16, 3, 3, 3), {"pads": [1, 0, 1, 1, 0, 1]},
     dict(padding=(1, 0, 1)), True),
    ("1d_images_per_panel", (7, 5, 30), (6, 5, 4), {"strides": [3], "pads": [2, 2]}, dict(stride=3, padding=2), True),
]

TORCH_CONV = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    before = _C.get_num_threads()
    _C.set_num_threads(request.param)
    yield request.param
    _C.set_num_threads(before)


def _inputs(xs, ws, bias, dt):
    inputs = {"X": RNG.standard_normal(xs).astype(dt), "W": RNG.standard_normal(ws).astype(dt)}
    if bias:
        inputs["B"] = RNG.standard_normal(ws[0]).astype(dt)
    return inputs


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_conv_forward_matches_torch(case, threads):
    _, xs, ws, attrs, kw, bias = case
    inputs = _inputs(xs, ws, bias, np.float32)
    outs, _, _ = run(make_model("Conv", inputs, attrs), list(inputs.values()))
    t = {k: torch.from_numpy(v) for k, v in inputs.items()}
    want = TORCH_CONV[len(xs)](t["X"], t["W"], t.get("B"), **kw).numpy()
    assert outs[0].shape == want.shape
    np.testing.assert_allclose(outs[0], want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_conv_gradients_match_torch(case, threads):
    _, xs, ws, attrs, kw, bias = case
    inputs = _inputs(xs, ws, bias, np.float64)
    feeds = list(inputs.values())
    outs, grads, dys = run(make_model("Conv", inputs, attrs), feeds, grad=[True] * len(feeds), seed=5)
    t = {k: torch.from_numpy(v.copy()).requires_grad_() for k, v in inputs.items()}
    y = TORCH_CONV[len(xs)](t["X"], t["W"], t.get("B"), **kw)
    np.testing.assert_allclose(outs[0], y.detach().numpy(), rtol=1e-10, atol=1e-10)
    y.backward(torch.from_numpy(dys[0]))
    for name, g in zip(inputs, grads):
        np.testing.assert_allclose(g, t[name].grad.numpy(), rtol=1e-9, atol=1e-9,
                                   err_msg=f"gradient of {name}")


def test_conv_weight_gradient_only_batched(threads):
    """ConvGradW without ConvGradX, the dW partials of several ranges added in order."""
    inputs = _inputs((10, 4, 8, 8), (6, 4, 3, 3), True, np.float64)
    feeds = list(inputs.values())
    _, grads, dys = run(make_model("Conv", inputs, {"pads": [1, 1, 1, 1]}), feeds, grad=[False, True, True], seed=9)
    t = {k: torch.from_numpy(v.copy()).requires_grad_(k != "X") for k, v in inputs.items()}
    F.conv2d(t["X"], t["W"], t["B"], padding=1).backward(torch.from_numpy(dys[0]))
    assert grads[0] is None
    np.testing.assert_allclose(grads[1], t["W"].grad.numpy(), rtol=1e-9, atol=1e-9)
    np.testing.assert_allclose(grads[2], t["B"].grad.numpy(), rtol=1e-9, atol=1e-9)


# ---- ConvTranspose: ConvGradX's pass forward; Conv and ConvGradW (x and dy swapped) backward ----

CONVT_CASES = [
    # (id, x shape, w shape (C_in, C_out/group, *K), ONNX attrs, torch kwargs, bias)
    ("images_per_panel", (16, 8, 6, 6), (8, 6, 3, 3), {"pads": [1, 1, 1, 1], "strides": [2, 2],
                                                       "output_padding": [1, 1]},
     dict(padding=1, stride=2, output_padding=1), True),
    ("parts_of_an_image", (2, 8, 20, 20), (8, 64, 3, 3), {"pads": [1, 1, 1, 1]}, dict(padding=1), True),
    ("batch_of_one_strided", (1, 16, 12, 12), (16, 8, 3, 3), {"strides": [2, 2]}, dict(stride=2), False),
    ("3d_groups", (3, 4, 4, 5, 4), (4, 3, 3, 3, 3), {"group": 2, "strides": [2, 1, 2], "pads": [1, 1, 0, 1, 1, 0],
                                                     "output_padding": [1, 0, 1]},
     dict(groups=2, stride=(2, 1, 2), padding=(1, 1, 0), output_padding=(1, 0, 1)), True),
    ("1d_pointwise", (7, 5, 30), (5, 6, 1), {}, {}, True),
]

TORCH_CONVT = {3: F.conv_transpose1d, 4: F.conv_transpose2d, 5: F.conv_transpose3d}


@pytest.mark.parametrize("case", CONVT_CASES, ids=[c[0] for c in CONVT_CASES])
def test_conv_transpose_matches_torch(case, threads):
    _, xs, ws, attrs, kw, bias = case
    g = attrs.get("group", 1)
    for dt in (np.float32, np.float64):
        inputs = {"X": RNG.standard_normal(xs).astype(dt), "W": RNG.standard_normal(ws).astype(dt)}
        if bias:
            inputs["B"] = RNG.standard_normal(ws[1] * g).astype(dt)
        feeds = list(inputs.values())
        outs, grads, dys = run(make_model("ConvTranspose", inputs, attrs), feeds, grad=[True] * len(feeds), seed=5)
        t = {k: torch.from_numpy(v.copy()).requires_grad_() for k, v in inputs.items()}
        y = TORCH_CONVT[len(xs)](t["X"], t["W"], t.get("B"), **kw)
        tol = 1e-4 if dt == np.float32 else 1e-10
        np.testing.assert_allclose(outs[0], y.detach().numpy(), rtol=tol, atol=tol)
        y.backward(torch.from_numpy(dys[0]))
        for name, gr in zip(inputs, grads):
            np.testing.assert_allclose(gr, t[name].grad.numpy(), rtol=tol * 10, atol=tol * 10,
                                       err_msg=f"{dt.__name__} gradient of {name}")
