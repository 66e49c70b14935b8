"""Conv's im2col through a zero-bordered copy of each channel (im2col_padded, ops/conv.c): the
path of whole images per panel whose rows are short (under 16) or strided — the benchmark
ResNet's 8- and 4-wide convolutions, its stride-2 ones and its strided 1x1 skips, at their
exact shapes — and of odd geometries: asymmetric pads, dilations, groups, a stride that leaves
the input's last rows and columns unread (their gradient must be 0), pads wider than the
kernel's reach, a centre tap that covers every input (col2im starts from it), 1-D and 3-D,
batch 1. Forward, dX and dW against torch in float64 (1e-12 of each tensor's size) and float32
(1e-5 of each tensor's size), at 1 and 2 threads."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from oputil import make_model, run
from ortmod import _C

CASES = [
    # (id, x shape, w shape, ONNX attrs, torch kwargs)
    ("resnet_b2c1", (64, 32, 16, 16), (64, 32, 3, 3), {"strides": [2, 2], "pads": [1] * 4}, dict(stride=2, padding=1)),
    ("resnet_b2c2", (64, 64, 8, 8), (64, 64, 3, 3), {"pads": [1] * 4}, dict(padding=1)),
    ("resnet_b3c1", (64, 64, 8, 8), (128, 64, 3, 3), {"strides": [2, 2], "pads": [1] * 4}, dict(stride=2, padding=1)),
    ("resnet_b3c2", (64, 128, 4, 4), (128, 128, 3, 3), {"pads": [1] * 4}, dict(padding=1)),
    ("resnet_b2skip", (64, 32, 16, 16), (64, 32, 1, 1), {"strides": [2, 2]}, dict(stride=2)),
    ("resnet_b3skip", (64, 64, 8, 8), (128, 64, 1, 1), {"strides": [2, 2]}, dict(stride=2)),
    ("stride_tail_unread", (5, 3, 11, 11), (4, 3, 4, 4), {"strides": [3, 3]}, dict(stride=3)),
    ("asym_pads_dilated", (3, 5, 7, 9), (4, 5, 3, 2), {"strides": [2, 3], "pads": [1, 0, 2, 1], "dilations": [1, 2]},
     dict(stride=(2, 3), padding=0, dilation=(1, 2))),   # torch pads symmetrically: F.pad first (below)
    ("groups_batch_1", (1, 6, 5, 5), (6, 2, 3, 3), {"group": 3, "pads": [1] * 4}, dict(groups=3, padding=1)),
    ("pads_past_reach", (2, 2, 5, 5), (3, 2, 3, 3), {"pads": [2] * 4}, dict(padding=2)),
    ("cover_tap_wide_kernel", (2, 3, 6, 7), (3, 3, 3, 5), {"pads": [1, 2, 1, 2]}, dict(padding=(1, 2))),
    ("strided_rows_20", (2, 3, 9, 40), (4, 3, 3, 3), {"strides": [2, 2], "pads": [1] * 4}, dict(stride=2, padding=1)),
    ("strided_rows_16", (2, 4, 32, 32), (5, 4, 3, 3), {"strides": [2, 2], "pads": [1] * 4}, dict(stride=2, padding=1)),
    ("odd_5x7", (3, 4, 5, 7), (6, 4, 3, 3), {"pads": [1] * 4}, dict(padding=1)),
    ("1d", (4, 3, 12), (5, 3, 3), {"strides": [2], "pads": [1, 1]}, dict(stride=2, padding=1)),
    ("3d", (2, 3, 5, 6, 7), (4, 3, 3, 3, 3), {"strides": [1, 2, 1], "pads": [1, 1, 0, 1, 1, 0]},
     dict(stride=(1, 2, 1), padding=(1, 1, 0))),
]
TORCH_CONV = {3: F.conv1d, 4: F.conv2d, 5: F.conv3d}


@pytest.fixture(params=[1, 2], ids=["1thread", "2threads"])
def threads(request):
    before = _C.get_num_threads()
    _C.set_num_threads(request.param)
    yield request.param
    _C.set_num_threads(before)


def _torch_conv(case, x, w):
    name, xs, _, attrs, kw = case
    if name == "asym_pads_dilated":   # ONNX pads [top, left, bottom, right]; F.pad takes (left, right, top, bottom)
        p = attrs["pads"]
        x = F.pad(x, (p[1], p[3], p[0], p[2]))
    return TORCH_CONV[len(xs)](x, w, **kw)


def _close(name, got, want, rel):
    scale = max(float(np.abs(want).max()), 1e-30)
    err = float(np.abs(got - want).max())
    assert got.shape == want.shape, name
    assert err <= rel * scale, f"{name}: max difference {err:.3g}, {err / scale:.3g} of the tensor's size"


@pytest.mark.parametrize("dtype,rel", [(np.float64, 1e-12), (np.float32, 1e-5)], ids=["f64", "f32"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_conv_padded_im2col_matches_torch(case, dtype, rel, threads):
    name, xs, ws, attrs, _ = case
    rng = np.random.default_rng(sum(map(ord, name)))
    x, w = rng.standard_normal(xs).astype(dtype), rng.standard_normal(ws).astype(dtype)
    outs, grads, dys = run(make_model("Conv", {"X": x, "W": w}, attrs), [x, w], grad=[True, True], seed=7)
    xt, wt = torch.from_numpy(x.copy()).requires_grad_(), torch.from_numpy(w.copy()).requires_grad_()
    y = _torch_conv(case, xt, wt)
    _close("Y", outs[0], y.detach().numpy(), rel)
    y.backward(torch.from_numpy(dys[0]))
    _close("dX", grads[0], xt.grad.numpy(), rel)
    _close("dW", grads[1], wt.grad.numpy(), rel)
    if name == "stride_tail_unread":   # the last row and column feed no window
        assert not grads[0][:, :, 10, :].any() and not grads[0][:, :, :, 10].any()
