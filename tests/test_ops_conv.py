"""Conv, ConvTranspose, BatchNormalization, MaxPool, AveragePool, GlobalAveragePool/GlobalMaxPool:
float32 parity against PyTorch (used only as the reference) and float64 finite-difference checks
of the engine's gradients (ConvGradX/ConvGradW, ConvTranspose's Conv/ConvGradW/ReduceSum,
BatchNormalizationGrad, pool grads); ConvTranspose through ORTModule against torch autograd."""
import copy
import re

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from oputil import check_op, make_model, run
from ortmod import _C

RNG = np.random.default_rng(4321)


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def T(a):
    return torch.from_numpy(np.ascontiguousarray(a))


# ---- Conv ------------------------------------------------------------------------------

CONV2D = [
    # (x shape, w shape, attrs, torch kwargs)
    ((2, 3, 7, 6), (4, 3, 3, 3), {"pads": [1, 1, 1, 1]}, dict(padding=1)),
    ((2, 3, 7, 6), (4, 3, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, dict(stride=2, padding=1)),
    ((1, 4, 6, 7), (6, 2, 3, 2), {"group": 2, "strides": [1, 2]}, dict(groups=2, stride=(1, 2))),
    ((2, 2, 8, 8), (3, 2, 3, 3), {"dilations": [2, 1], "pads": [2, 1, 2, 1]}, dict(dilation=(2, 1), padding=(2, 1))),
    ((2, 4, 5, 5), (4, 1, 3, 3), {"group": 4, "pads": [1, 1, 1, 1]}, dict(groups=4, padding=1)),  # depthwise
    ((2, 3, 5, 4), (5, 3, 1, 1), {}, {}),                                                         # 1x1: no im2col
    ((2, 3, 6, 6), (5, 3, 1, 1), {"strides": [2, 2]}, dict(stride=2)),
]


@pytest.mark.parametrize("xs,ws,attrs,kw", CONV2D)
@pytest.mark.parametrize("bias", [True, False])
def test_conv2d(xs, ws, attrs, kw, bias):
    x, w = randn(*xs), randn(*ws)
    inputs = {"X": x, "W": w}
    if bias:
        inputs["B"] = randn(ws[0])

    def ref(X, W, B=None):
        return F.conv2d(T(X), T(W), None if B is None else T(B), **kw).numpy()

    check_op("Conv", inputs, ref, attrs=attrs, grad=list(inputs), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attrs,kw", [
    ({"pads": [1, 1]}, dict(padding=1)),
    ({"strides": [2], "dilations": [2], "pads": [2, 2]}, dict(stride=2, dilation=2, padding=2)),
    ({"group": 2}, dict(groups=2)),
])
def test_conv1d(attrs, kw):
    g = attrs.get("group", 1)
    x, w, b = randn(2, 4, 9), randn(6, 4 // g, 3), randn(6)
    check_op("Conv", {"X": x, "W": w, "B": b}, lambda X, W, B: F.conv1d(T(X), T(W), T(B), **kw).numpy(),
             attrs=attrs, grad=["X", "W", "B"], atol=1e-4)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_conv_auto_pad(auto_pad):
    x, w = randn(1, 2, 6, 5), randn(3, 2, 2, 3)

    def ref(X, W):
        xt = T(X)
        if auto_pad == "VALID":
            return F.conv2d(xt, T(W), stride=2).numpy()
        # ceil(in / stride) outputs; odd total padding goes to the end (UPPER) or start (LOWER)
        pads = []
        for i, (n, k) in enumerate(zip(X.shape[2:], W.shape[2:])):
            o = -(-n // 2)
            tot = max(0, (o - 1) * 2 + k - n)
            lo = tot // 2 if auto_pad == "SAME_UPPER" else tot - tot // 2
            pads.append((lo, tot - lo))
        xt = F.pad(xt, (pads[1][0], pads[1][1], pads[0][0], pads[0][1]))
        return F.conv2d(xt, T(W), stride=2).numpy()

    check_op("Conv", {"X": x, "W": w}, ref, attrs={"auto_pad": auto_pad, "strides": [2, 2]}, grad=["X", "W"])


def test_conv3d():
    x, w, b = randn(1, 2, 4, 5, 4), randn(3, 2, 2, 3, 2), randn(3)
    check_op("Conv", {"X": x, "W": w, "B": b},
             lambda X, W, B: F.conv3d(T(X), T(W), T(B), padding=(1, 0, 1), stride=(1, 2, 1)).numpy(),
             attrs={"pads": [1, 0, 1, 1, 0, 1], "strides": [1, 2, 1]}, grad=["X", "W", "B"], atol=1e-4)


def test_conv_weight_grad_only():
    """Only W's gradient requested: ConvGradX is not emitted; X feeds ConvGradW."""
    x, w = randn(2, 3, 5, 5), randn(4, 3, 3, 3)
    check_op("Conv", {"X": x, "W": w}, lambda X, W: F.conv2d(T(X), T(W)).numpy(), grad=["W"])


# ---- ConvTranspose -------------------------------------------------------------------------

CONVT2D = [
    # (x shape, w shape (C_in, C_out/group, kH, kW), attrs, torch kwargs)
    ((2, 3, 4, 5), (3, 4, 3, 3), {}, {}),
    ((2, 3, 4, 5), (3, 2, 3, 3), {"strides": [2, 2], "pads": [1, 1, 1, 1]}, dict(stride=2, padding=1)),
    ((2, 3, 4, 5), (3, 2, 3, 2), {"strides": [2, 3], "pads": [1, 0, 1, 0], "output_padding": [1, 2]},
     dict(stride=(2, 3), padding=(1, 0), output_padding=(1, 2))),
    ((1, 4, 5, 4), (4, 3, 3, 3), {"group": 2, "strides": [2, 1], "output_padding": [1, 0]},
     dict(groups=2, stride=(2, 1), output_padding=(1, 0))),
    ((2, 2, 5, 5), (2, 3, 3, 2), {"dilations": [2, 1], "pads": [2, 1, 2, 1]}, dict(dilation=(2, 1), padding=(2, 1))),
    ((2, 4, 4, 4), (4, 1, 3, 3), {"group": 4, "strides": [2, 2], "pads": [1, 1, 1, 1], "output_padding": [1, 1]},
     dict(groups=4, stride=2, padding=1, output_padding=1)),                                      # depthwise
    ((2, 3, 4, 5), (3, 5, 1, 1), {}, {}),                                                          # 1x1: no col2im
    ((2, 3, 3, 3), (3, 2, 2, 2), {"strides": [2, 2]}, dict(stride=2)),                             # no overlap
    # output_padding >= stride (torch allows it below the dilation) and above the end pad: the
    # gradient's Conv has end pad 0
    ((2, 2, 4, 5), (2, 3, 2, 2), {"strides": [2, 1], "dilations": [3, 2], "pads": [1, 1, 1, 1],
                                  "output_padding": [2, 1]},
     dict(stride=(2, 1), dilation=(3, 2), padding=1, output_padding=(2, 1))),
]


def _convt_ref(fn, kw):
    return lambda X, W, B=None: fn(T(X), T(W), None if B is None else T(B), **kw).numpy()


@pytest.mark.parametrize("xs,ws,attrs,kw", CONVT2D)
@pytest.mark.parametrize("bias", [True, False])
def test_conv_transpose2d(xs, ws, attrs, kw, bias):
    x, w = randn(*xs), randn(*ws)
    inputs = {"X": x, "W": w}
    if bias:
        inputs["B"] = randn(ws[1] * attrs.get("group", 1))
    attrs = dict(attrs, kernel_shape=list(ws[2:]))   # as torch's exporter writes it
    check_op("ConvTranspose", inputs, _convt_ref(F.conv_transpose2d, kw), attrs=attrs, grad=list(inputs),
             rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("attrs,kw", [
    ({"pads": [1, 1]}, dict(padding=1)),
    ({"strides": [3], "dilations": [2], "pads": [2, 1], "output_padding": [1]}, None),   # asymmetric pads
    ({"group": 2, "strides": [2], "output_padding": [1]}, dict(groups=2, stride=2, output_padding=1)),
    ({"auto_pad": "VALID", "strides": [2]}, dict(stride=2)),
])
def test_conv_transpose1d(attrs, kw):
    g = attrs.get("group", 1)
    x, w, b = randn(2, 4, 7), randn(4, 6 // g, 3), randn(6)
    if kw is None:   # pads (2, 1): torch pads both ends alike; crop one more at the start instead
        def ref(X, W, B):
            y = F.conv_transpose1d(T(X), T(W), T(B), stride=3, dilation=2, padding=1, output_padding=1)
            return y[..., 1:].numpy()
    else:
        ref = _convt_ref(F.conv_transpose1d, kw)
    check_op("ConvTranspose", {"X": x, "W": w, "B": b}, ref, attrs=attrs, grad=["X", "W", "B"], atol=1e-4)


def test_conv_transpose3d():
    x, w, b = randn(1, 4, 3, 4, 3), randn(4, 3, 2, 3, 2), randn(6)
    kw = dict(stride=(1, 2, 2), padding=(0, 1, 1), output_padding=(0, 1, 0), groups=2)
    check_op("ConvTranspose", {"X": x, "W": w, "B": b}, _convt_ref(F.conv_transpose3d, kw),
             attrs={"strides": [1, 2, 2], "pads": [0, 1, 1, 0, 1, 1], "output_padding": [0, 1, 0], "group": 2},
             grad=["X", "W", "B"], atol=1e-4)


@pytest.mark.parametrize("ws", [(3, 4, 1, 1), (3, 2, 3, 2)])
def test_conv_transpose_without_attributes(ws):
    """No attribute and no declared shape says the rank before planning: dB sums over the batch,
    then over the flattened rest."""
    x, w, b = randn(2, 3, 4, 5), randn(*ws), randn(ws[1])
    check_op("ConvTranspose", {"X": x, "W": w, "B": b}, _convt_ref(F.conv_transpose2d, {}), grad=["X", "W", "B"],
             atol=1e-4)


def test_conv_transpose_weight_and_bias_grads_only():
    """No dX wanted: no Conv is emitted; X feeds ConvGradW in dY's place."""
    x, w, b = randn(2, 3, 4, 4), randn(3, 2, 3, 3), randn(2)
    check_op("ConvTranspose", {"X": x, "W": w, "B": b}, _convt_ref(F.conv_transpose2d, dict(stride=2)),
             attrs={"strides": [2, 2]}, grad=["W", "B"], atol=1e-4)


def test_conv_transpose_output_padding_its_gradient_cannot_take_is_refused_by_name():
    # dilation 2 lets torch take output_padding 1 at stride 1; with no end pad the gradient's
    # Conv would need a negative pad: the forward runs, the gradient is refused naming why
    x, w = randn(1, 2, 5), randn(2, 3, 3)
    attrs = {"dilations": [2], "output_padding": [1]}
    ref = _convt_ref(F.conv_transpose1d, dict(dilation=2, output_padding=1))
    check_op("ConvTranspose", {"X": x, "W": w}, ref, attrs=attrs)
    model = make_model("ConvTranspose", {"X": x.astype(np.float64), "W": w.astype(np.float64)}, attrs)
    with pytest.raises(_C.UnsupportedOpError, match=r"ConvTranspose node .*output_padding 1 exceeds pad_end 0 by "
                                                    r"stride 1 or more on spatial dim 0: its gradient is not"):
        _C.Engine(model, [True, True])


@pytest.mark.parametrize("attrs,message", [
    ({"group": 2}, "need C == W.dims[0], divisible by group"),
    ({"pads": [3, 3]}, "output size -2 on spatial dim 0"),
    ({"kernel_shape": [2]}, "kernel_shape[0] is 2 but W's is 3"),
])
def test_conv_transpose_bad_geometry_is_an_error(attrs, message):
    x, w = randn(1, 3, 2), randn(3, 2, 3)
    model = make_model("ConvTranspose", {"X": x, "W": w}, attrs)
    with pytest.raises(_C.InvalidInputError, match=re.escape(message)):
        run(model, [x, w])


CONVT_MODULES = [
    # (module, input shape, forward kwargs)
    (lambda: torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2), (2, 4, 5, 6), {}),
    (lambda: torch.nn.ConvTranspose1d(3, 2, 4, stride=3, dilation=2, padding=2, bias=False), (2, 3, 7), {}),
    (lambda: torch.nn.ConvTranspose3d(2, 3, (2, 3, 2), stride=(2, 1, 2), padding=(0, 1, 1)), (1, 2, 3, 4, 3), {}),
    # output_size: torch turns it into output_padding, which the trace records
    (lambda: torch.nn.ConvTranspose2d(3, 2, 3, stride=2, padding=1), (2, 3, 4, 4), {"output_size": [8, 8]}),
    (lambda: torch.nn.ConvTranspose2d(3, 2, 3), (3, 4, 5), {}),                                   # no batch dim
]


@pytest.mark.parametrize("make,shape,fkw", CONVT_MODULES)
def test_conv_transpose_module_matches_eager(make, shape, fkw):
    from ortmod import ORTModule
    torch.manual_seed(0)
    eager = make().double()
    ort = ORTModule(copy.deepcopy(eager))
    x = torch.randn(*shape, dtype=torch.float64)
    xe, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    ye, yo = eager(xe, **fkw), ort(xo, **fkw)
    assert yo.shape == ye.shape
    torch.testing.assert_close(yo, ye, rtol=1e-10, atol=1e-10)
    dy = torch.randn_like(ye)
    ye.backward(dy)
    yo.backward(dy)
    torch.testing.assert_close(xo.grad, xe.grad, rtol=1e-10, atol=1e-10)
    for (name, pe), po in zip(eager.named_parameters(), ort.parameters()):
        torch.testing.assert_close(po.grad, pe.grad, rtol=1e-10, atol=1e-10, msg=name)


def test_conv_transpose_module_whose_gradient_is_refused_says_why():
    from ortmod import ORTModule, UnsupportedOpError
    m = ORTModule(torch.nn.ConvTranspose1d(2, 3, 3, dilation=2, output_padding=1))
    with pytest.raises(UnsupportedOpError, match="output_padding 1 exceeds pad_end 0"):
        m(torch.randn(1, 2, 5, requires_grad=True))


# ---- BatchNormalization ------------------------------------------------------------------

def _bn_train_ref(X, scale, B, mean, var, momentum=0.9, eps=1e-5):
    axes = (0,) + tuple(range(2, X.ndim))
    shp = (1, -1) + (1,) * (X.ndim - 2)
    m = X.astype(np.float64).mean(axis=axes)
    v = X.astype(np.float64).var(axis=axes)
    cnt = X.size // X.shape[1]
    y = (X - m.reshape(shp)) / np.sqrt(v.reshape(shp) + eps) * scale.reshape(shp) + B.reshape(shp)
    rm = mean * momentum + m * (1 - momentum)
    rv = var * momentum + v * cnt / (cnt - 1) * (1 - momentum)
    return y, rm, rv


@pytest.mark.parametrize("shape", [(4, 3, 5, 6), (6, 4), (3, 2, 7)])
def test_batchnorm_training(shape):
    C = shape[1]
    inputs = {"X": randn(*shape) * 2 + 0.5, "scale": randn(C), "B": randn(C),
              "mean": randn(C), "var": np.abs(randn(C)) + 0.5}
    check_op("BatchNormalization", inputs, _bn_train_ref, attrs={"training_mode": 1, "momentum": 0.9,
                                                                 "epsilon": 1e-5},
             n_outputs=3, opset=15, atol=1e-4)
    # the running statistics carry no gradient by definition: gradcheck Y alone
    check_op("BatchNormalization", inputs, lambda **kw: _bn_train_ref(**kw)[0],
             attrs={"training_mode": 1, "momentum": 0.9, "epsilon": 1e-5},
             n_outputs=1, grad=["X", "scale", "B"], opset=15, atol=1e-4)


def test_batchnorm_matches_torch_running_stats():
    x = randn(8, 3, 4, 4)
    bn = torch.nn.BatchNorm2d(3, momentum=0.1)
    with torch.no_grad():
        bn.weight.copy_(T(randn(3)))
        bn.bias.copy_(T(randn(3)))
        bn.running_mean.copy_(T(randn(3)))
        bn.running_var.copy_(T(np.abs(randn(3)) + 1))
    inputs = {"X": x, "scale": bn.weight.detach().numpy().copy(), "B": bn.bias.detach().numpy().copy(),
              "mean": bn.running_mean.numpy().copy(), "var": bn.running_var.numpy().copy()}

    def ref(X, scale, B, mean, var):
        bn.train()
        y = bn(T(X)).detach().numpy()
        return y, bn.running_mean.numpy().copy(), bn.running_var.numpy().copy()

    check_op("BatchNormalization", inputs, ref, attrs={"training_mode": 1, "momentum": 0.9, "epsilon": 1e-5},
             n_outputs=3, opset=15, atol=1e-5)


@pytest.mark.parametrize("shape", [(4, 3, 5, 6), (5, 2)])
def test_batchnorm_inference(shape):
    C = shape[1]
    inputs = {"X": randn(*shape), "scale": randn(C), "B": randn(C), "mean": randn(C),
              "var": np.abs(randn(C)) + 0.5}

    def ref(X, scale, B, mean, var):
        return F.batch_norm(T(X), T(mean), T(var), T(scale), T(B), training=False, eps=1e-5).numpy()

    check_op("BatchNormalization", inputs, ref, grad=["X", "scale", "B"], opset=15)


# ---- pools -------------------------------------------------------------------------------

POOL2D = [
    ({"kernel_shape": [2, 2], "strides": [2, 2]}, dict(kernel_size=2, stride=2)),
    ({"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, dict(kernel_size=3, stride=2, padding=1)),
    ({"kernel_shape": [3, 2], "strides": [2, 1], "ceil_mode": 1}, dict(kernel_size=(3, 2), stride=(2, 1), ceil_mode=True)),
]


@pytest.mark.parametrize("attrs,kw", POOL2D)
def test_maxpool2d(attrs, kw):
    x = randn(2, 3, 7, 6)
    check_op("MaxPool", {"X": x}, lambda X: F.max_pool2d(T(X), **kw).numpy(), attrs=attrs, grad=["X"])


def test_maxpool_dilation_and_indices():
    x = randn(2, 2, 9, 8)
    attrs = {"kernel_shape": [3, 3], "strides": [1, 2], "dilations": [2, 1], "pads": [1, 0, 1, 0]}

    def ref(X):
        y, i = F.max_pool2d(T(X), 3, stride=(1, 2), dilation=(2, 1), padding=(1, 0), return_indices=True)
        # ONNX Indices are flat over the whole tensor; torch's are per (n, c) plane
        plane = X.shape[2] * X.shape[3]
        off = (np.arange(X.shape[0] * X.shape[1]) * plane).reshape(X.shape[0], X.shape[1], 1, 1)
        return y.numpy(), i.numpy() + off

    check_op("MaxPool", {"X": x}, ref, attrs=attrs, n_outputs=2, grad=["X"])


def test_maxpool1d():
    x = randn(2, 3, 11)
    check_op("MaxPool", {"X": x}, lambda X: F.max_pool1d(T(X), 3, 2, 1).numpy(),
             attrs={"kernel_shape": [3], "strides": [2], "pads": [1, 1]}, grad=["X"])


@pytest.mark.parametrize("incl", [0, 1])
@pytest.mark.parametrize("ceil", [0, 1])
def test_avgpool2d(incl, ceil):
    x = randn(2, 3, 7, 6)
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": incl,
             "ceil_mode": ceil}
    check_op("AveragePool", {"X": x},
             lambda X: F.avg_pool2d(T(X), 3, 2, 1, ceil_mode=bool(ceil), count_include_pad=bool(incl)).numpy(),
             attrs=attrs, grad=["X"])


def test_avgpool1d():
    x = randn(2, 2, 10)
    check_op("AveragePool", {"X": x}, lambda X: F.avg_pool1d(T(X), 4, 3).numpy(),
             attrs={"kernel_shape": [4], "strides": [3]}, grad=["X"])


@pytest.mark.parametrize("shape", [(2, 3, 5, 4), (2, 3, 6)])
def test_global_average_pool(shape):
    x = randn(*shape)
    check_op("GlobalAveragePool", {"X": x}, lambda X: X.mean(axis=tuple(range(2, X.ndim)), keepdims=True),
             grad=["X"])


def test_global_max_pool():
    x = randn(2, 3, 5, 4)
    check_op("GlobalMaxPool", {"X": x}, lambda X: X.max(axis=(2, 3), keepdims=True), grad=["X"])
