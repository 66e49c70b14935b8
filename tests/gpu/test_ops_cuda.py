"""Each op on the CUDA provider against the CPU provider: one-node models run by the engine
on CPU (numpy) and on CUDA (torch CUDA tensors, torch's current stream), outputs and input
gradients compared (the same output gradients fed to both). fp32 here; bf16/fp16 against the CPU's
fp32 in test_half_cuda.py."""
import numpy as np
import pytest
import torch

from oputil import _Cap, make_model
from ortmod import _C

R = np.random.default_rng(0)


SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1.5, -1.5, 3.0, -3.0, 7.0, -7.0, 0.25], np.float32)


def f32(*shape):
    return R.standard_normal(shape).astype(np.float32)


def pos(*shape):
    return (np.abs(R.standard_normal(shape)) + 0.5).astype(np.float32)


R14 = np.random.default_rng(14)   # the reductions' and selections' own draws: the others' stay as they were


def f32b(*shape):
    return R14.standard_normal(shape).astype(np.float32)


R23 = np.random.default_rng(23)   # the RNN cases' own draws (last in NEW_CASES): the others' stay as they were


def f32r(*shape):
    return R23.standard_normal(shape).astype(np.float32)


def run_both(op, inputs, attrs=None, domain="", grad=(), n_outputs=1, const_inputs=(), dtype=torch.float32,
             training=True):
    model = make_model(op, inputs, attrs, domain, 20, n_outputs, const_inputs)
    names = [n for n, a in inputs.items() if a is not None and n not in const_inputs]
    flags = [n in grad for n in names]
    feeds = [np.ascontiguousarray(inputs[n]) for n in names]
    # CPU
    ecpu = _C.Engine(model, flags if any(flags) else None, seed=3)
    caps, stash = ecpu.forward(feeds, training)
    outs_cpu = [np.from_dlpack(_Cap(c)).copy() for c in caps]
    dys = [R.standard_normal(o.shape).astype(o.dtype) if np.issubdtype(o.dtype, np.floating) else None
           for o in outs_cpu]
    dys = [d if diff else None for d, diff in zip(dys, ecpu.output_differentiable)]
    grads_cpu = None
    if stash is not None:
        g = ecpu.backward(stash, dys)
        grads_cpu = [None if c is None else np.from_dlpack(_Cap(c)).copy() for c in g]
    # CUDA
    egpu = _C.Engine(model, flags if any(flags) else None, seed=3)
    tfeeds = [torch.from_numpy(f).cuda() for f in feeds]
    stream = torch.cuda.current_stream().cuda_stream
    caps, stash = egpu.forward(tfeeds, training, stream)
    outs_gpu = [torch.from_dlpack(c).cpu().numpy() for c in caps]
    grads_gpu = None
    if stash is not None:
        g = egpu.backward(stash, [None if d is None else torch.from_numpy(d).cuda() for d in dys], stream)
        grads_gpu = [None if c is None else torch.from_dlpack(c).cpu().numpy() for c in g]
    return outs_cpu, outs_gpu, grads_cpu, grads_gpu


def check(op, inputs, attrs=None, domain="", grad=(), n_outputs=1, const_inputs=(), rtol=1e-4, atol=1e-5):
    oc, og, gc, gg = run_both(op, inputs, attrs, domain, grad, n_outputs, const_inputs)
    for i, (a, b) in enumerate(zip(oc, og)):
        assert a.shape == b.shape, f"{op} output {i}: {a.shape} vs {b.shape}"
        if a.dtype == np.bool_ or np.issubdtype(a.dtype, np.integer):
            np.testing.assert_array_equal(a, b, err_msg=f"{op} output {i}")
        else:
            np.testing.assert_allclose(b, a, rtol=rtol, atol=atol, err_msg=f"{op} output {i}")
    if gc is not None:
        for i, (a, b) in enumerate(zip(gc, gg)):
            assert (a is None) == (b is None), f"{op} grad {i} presence"
            if a is not None:
                np.testing.assert_allclose(b, a, rtol=rtol, atol=atol, err_msg=f"{op} grad {i}")


CASES = [
    ("MatMul", {"a": f32(3, 4, 5), "b": f32(5, 6)}, None, "", ("a", "b")),
    ("MatMul", {"a": f32(2, 3, 4, 5), "b": f32(3, 5, 6)}, None, "", ("a", "b")),
    ("MatMul", {"a": f32(5), "b": f32(5, 6)}, None, "", ("a", "b")),
    ("Gemm", {"a": f32(4, 5), "b": f32(6, 5), "c": f32(6)}, {"transB": 1}, "", ("a", "b", "c")),
    ("Gemm", {"a": f32(5, 4), "b": f32(5, 6), "c": f32(4, 1)}, {"transA": 1, "alpha": 0.5, "beta": 2.0}, "", ("a", "b", "c")),
    ("FusedMatMul", {"a": f32(2, 5, 4), "b": f32(2, 6, 5)}, {"transA": 1, "transB": 1, "alpha": 0.3}, "ortmod", ("a", "b")),
    ("MatMulBias", {"x": f32(2, 3, 5), "w": f32(5, 7), "b": f32(7)}, None, "ortmod", ("x", "w", "b")),
    ("MatMulBias", {"x": f32(6, 5), "w": f32(7, 5), "b": f32(7)}, {"transB": 1}, "ortmod", ("x", "w", "b")),
    # tanh: cuBLASLt's GELU_AUX_BIAS epilogue (N a multiple of 8), GELU_BIAS without a gradient;
    # N = 7 or a one-value bias: Lt's bias epilogue or bias-then-GEMM, then the GELU kernel; erf likewise
    ("MatMulBiasGelu", {"x": f32(2, 3, 5), "w": f32(5, 16), "b": f32(16)}, {"approximate": "tanh"}, "ortmod",
     ("x", "w", "b")),
    ("MatMulBiasGelu", {"x": f32(6, 5), "w": f32(8, 5), "b": f32(8)}, {"approximate": "tanh", "transB": 1}, "ortmod",
     ()),
    ("MatMulBiasGelu", {"x": f32(6, 5), "w": f32(7, 5), "b": f32(7)}, {"approximate": "tanh", "transB": 1}, "ortmod",
     ("x", "w", "b")),
    ("MatMulBiasGelu", {"x": f32(2, 3, 5), "w": f32(5, 8), "b": f32(8)}, None, "ortmod", ("x", "w", "b")),
    ("MatMulBiasGelu", {"x": f32(4, 5), "w": f32(5, 8), "b": f32(1)}, None, "ortmod", ()),
    ("Add", {"a": f32(3, 4, 5), "b": f32(4, 1)}, None, "", ("a", "b")),
    ("Sub", {"a": f32(3, 1, 5), "b": f32(4, 5)}, None, "", ("a", "b")),
    ("Mul", {"a": f32(3, 4, 5), "b": f32(5)}, None, "", ("a", "b")),
    ("Div", {"a": f32(3, 4), "b": pos(3, 4)}, None, "", ("a", "b")),
    ("Pow", {"a": pos(3, 4), "b": f32(3, 4)}, None, "", ("a", "b")),
    ("Max", {"a": f32(3, 4), "b": f32(4)}, None, "", ("a", "b")),
    ("Where", {"c": R.random((3, 4)) > 0.5, "x": f32(3, 4), "y": f32(4)}, None, "", ("x", "y")),
    ("Relu", {"x": f32(4, 5)}, None, "", ("x",)),
    ("Tanh", {"x": f32(4, 5)}, None, "", ("x",)),
    ("Sigmoid", {"x": f32(4, 5)}, None, "", ("x",)),
    ("Gelu", {"x": f32(4, 5)}, None, "", ("x",)),
    ("Gelu", {"x": f32(4, 5)}, {"approximate": "tanh"}, "", ("x",)),
    ("Erf", {"x": f32(4, 5)}, None, "", ("x",)),
    ("Exp", {"x": f32(4, 5)}, None, "", ("x",)),
    ("Log", {"x": pos(4, 5)}, None, "", ("x",)),
    ("Sqrt", {"x": pos(4, 5)}, None, "", ("x",)),
    ("Abs", {"x": f32(4, 5)}, None, "", ("x",)),
    ("Sin", {"x": f32(4, 5)}, None, "", ("x",)),
    ("Cos", {"x": f32(4, 5)}, None, "", ("x",)),
    ("Sign", {"x": f32(4, 5)}, None, "", ("x",)),
    # fixed values (no draw from R: later cases keep their data): halves round to even
    *[(op, {"x": np.array([[-2.5, -1.5, -0.5, 0.5], [1.5, 2.5, -3.7, 3.7]], np.float32)}, None, "", ())
      for op in ("Floor", "Ceil", "Round")],
    ("Mod", {"a": f32(3, 4), "b": pos(4)}, {"fmod": 1}, "", ("a",)),
    ("Mod", {"a": f32(3, 4), "b": pos(4)}, {"fmod": 0}, "", ()),
    ("Mod", {"a": np.array([[7, -7, 5]], np.int64), "b": np.array([3, 3, -2], np.int64)}, None, "", ()),
    ("LeakyRelu", {"x": f32(4, 5)}, {"alpha": 0.2}, "", ("x",)),
    ("Softplus", {"x": f32(4, 5)}, None, "", ("x",)),
    ("Clip", {"x": f32(4, 5), "lo": np.float32(-0.5), "hi": np.float32(0.5)}, None, "", ("x",)),
    ("Softmax", {"x": f32(3, 7)}, None, "", ("x",)),
    ("Softmax", {"x": f32(3, 7, 4)}, {"axis": 1}, "", ("x",)),
    ("LogSoftmax", {"x": f32(3, 300)}, None, "", ("x",)),
    ("LayerNormalization", {"x": f32(6, 33), "s": f32(33), "b": f32(33)}, {"epsilon": 1e-5}, "", ("x", "s", "b")),
    ("ReduceSum", {"x": f32(3, 4, 5), "axes": np.array([1], np.int64)}, None, "", ("x",)),
    ("ReduceMean", {"x": f32(3, 4, 5), "axes": np.array([0, 2], np.int64)}, {"keepdims": 0}, "", ("x",)),
    ("ReduceMax", {"x": f32(3, 400)}, None, "", ("x",)),
    # a NaN in a long row: the block reduction keeps it (it dropped it before issue 14)
    ("ReduceMax", {"x": np.where(np.arange(400) == 123, np.nan, f32b(2, 400))}, None, "", ()),
    ("ReduceMin", {"x": np.where(np.arange(300) == 7, np.nan, f32b(2, 300))}, {"keepdims": 0}, "", ()),
    # L1/L2/SumSquare/LogSumExp: a thread per output (leading or mixed axes), a block per output
    # (a long innermost axis), zero norms and non-finite values
    ("ReduceL1", {"x": f32b(3, 4, 5), "axes": np.array([1], np.int64)}, None, "", ("x",)),
    ("ReduceL2", {"x": f32b(3, 4, 5), "axes": np.array([0, 2], np.int64)}, {"keepdims": 0}, "", ("x",)),
    ("ReduceL2", {"x": f32b(3, 400)}, None, "", ("x",)),
    ("ReduceL2", {"x": np.array([[0.0, 0.0, 0.0], [3.0, -4.0, 0.0], [np.inf, 1.0, 2.0], [np.nan, 1.0, 0.0]],
                                np.float32), "axes": np.array([-1], np.int64)}, None, "", ("x",)),
    ("ReduceL1", {"x": np.array([[0.0, -0.0, 2.0], [np.nan, 1.0, -1.0]], np.float32),
                  "axes": np.array([1], np.int64)}, {"keepdims": 0}, "", ("x",)),
    ("ReduceSumSquare", {"x": f32b(3, 4, 5), "axes": np.array([2], np.int64)}, {"keepdims": 0}, "", ("x",)),
    ("ReduceLogSumExp", {"x": f32b(3, 4, 5) * 10, "axes": np.array([0], np.int64)}, None, "", ("x",)),
    ("ReduceLogSumExp", {"x": f32b(3, 400) * 30}, {"keepdims": 0}, "", ("x",)),
    ("ReduceLogSumExp", {"x": np.array([[-np.inf, -np.inf, -np.inf], [np.inf, 1.0, -np.inf], [np.nan, 1.0, 2.0],
                                        [1e30, 1e30, -1e30]], np.float32), "axes": np.array([1], np.int64)},
     None, "", ("x",)),
    ("ReduceLogSumExp", {"x": np.where(np.arange(400) == 123, np.nan, f32b(2, 400))}, None, "", ()),
    ("ArgMax", {"x": np.round(f32(3, 7, 5))}, {"axis": 1, "keepdims": 0}, "", ()),
    ("ArgMin", {"x": np.round(f32(3, 7, 5))}, {"axis": -1, "select_last_index": 1}, "", ()),
    ("ArgMax", {"x": np.array([[1.0, np.nan, 3.0, np.nan], [2.0, 2.0, -1.0, 0.0]], np.float32)}, None, "", ()),
    # non-finite values and ties take eager's rule on both devices (tests/test_nonfinite.py)
    *[(op, {"x": SPECIAL}, attrs, "", ("x",)) for op, attrs in [
        ("Relu", None), ("Abs", None), ("Sign", None), ("Elu", {"alpha": 1.0}), ("HardSwish", None),
        ("HardSigmoid", {"alpha": 1 / 6, "beta": 0.5}), ("Celu", {"alpha": 1.5})]],
    ("Max", {"a": SPECIAL, "b": SPECIAL[::-1].copy()}, None, "", ("a", "b")),
    ("HardTanh", {"x": SPECIAL, "lo": np.float32(-1.5), "hi": np.float32(3.0)}, None, "ortmod", ("x",)),
    ("Clip", {"x": SPECIAL, "lo": np.float32(-1.5), "hi": np.float32(3.0)}, None, "", ("x",)),
    ("Min", {"a": SPECIAL, "b": np.roll(SPECIAL, 1)}, None, "", ("a", "b")),
    ("PRelu", {"x": SPECIAL, "slope": np.array([0.25], np.float32)}, None, "", ("x", "slope")),
    ("Transpose", {"x": f32(2, 3, 4)}, {"perm": [2, 0, 1]}, "", ("x",)),
    ("Gather", {"x": f32(10, 4), "i": np.array([[1, 9], [-1, 1]], np.int64)}, {"axis": 0}, "", ("x",)),
    ("Concat", {"a": f32(2, 3), "b": f32(2, 5)}, {"axis": 1}, "", ("a", "b")),
    ("Slice", {"x": f32(6, 8), "s": np.array([1, 7], np.int64), "e": np.array([5, 0], np.int64),
               "ax": np.array([0, 1], np.int64), "st": np.array([2, -2], np.int64)}, None, "", ("x",)),
    ("Expand", {"x": f32(3, 1), "s": np.array([2, 3, 4], np.int64)}, None, "", ("x",)),
    ("Split", {"x": f32(4, 6), "sp": np.array([2, 4], np.int64)}, {"axis": 1}, "", ("x",)),
    ("Cast", {"x": f32(4, 5)}, {"to": 11}, "", ("x",)),
    ("Tile", {"x": f32(2, 3), "r": np.array([2, 2], np.int64)}, None, "", ("x",)),
    ("BiasGelu", {"x": f32(4, 6), "b": f32(6)}, None, "ortmod", ("x", "b")),
    ("SimplifiedLayerNormalization", {"x": f32(4, 16), "s": f32(16)}, None, "ortmod", ("x", "s")),
]
CONST = {"axes", "s", "e", "ax", "st", "sp", "r", "lo", "hi"}


@pytest.mark.parametrize("op,inputs,attrs,domain,grad", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_op_matches_cpu(op, inputs, attrs, domain, grad):
    n_out = 2 if op == "Split" else 1
    const = tuple(k for k in inputs if k in CONST and not (op == "LayerNormalization" and k == "s")
                  and not (op == "SimplifiedLayerNormalization" and k == "s"))
    check(op, inputs, attrs, domain, grad, n_outputs=n_out, const_inputs=const)


# The Llama fusions (fused_llama.cu), from their own draws and run after the other cases (in the
# emulator's groups too): adding them moved no other case's inputs or output gradients. Gate/up
# broadcast, rotate_half's split of an even and of an odd head dim (chunk's ceil(d/2)), cos/sin
# broadcast over heads with and without their gradients. (op, inputs, attrs, domain, grad, const)
_R18 = np.random.default_rng(18)


def _f32l(*shape):
    return _R18.standard_normal(shape).astype(np.float32)


LLAMA_CASES = [
    ("SwiGLU", {"g": _f32l(4, 6) * 3, "u": _f32l(4, 6)}, None, "ortmod", ("g", "u"), ()),
    ("SwiGLU", {"g": _f32l(2, 3, 6), "u": _f32l(6)}, None, "ortmod", ("g", "u"), ()),
    ("FusedRotary", {"x": _f32l(2, 3, 5, 8), "cs": _f32l(5, 8), "sn": _f32l(5, 8), "split": np.array([4], np.int64),
                     "end": np.array([2**63 - 1], np.int64)}, None, "ortmod", ("x",), ("split", "end")),
    ("FusedRotary", {"x": _f32l(2, 2, 3, 7), "cs": _f32l(2, 1, 3, 7), "sn": _f32l(2, 1, 3, 7),
                     "split": np.array([4], np.int64), "end": np.array([8], np.int64)}, None, "ortmod",
     ("x", "cs", "sn"), ("split", "end")),
]


def test_softmax_cross_entropy_matches_cpu():
    x, y = f32(8, 11), R.integers(0, 11, 8).astype(np.int64)
    y[2] = -100
    check("SoftmaxCrossEntropyLoss", {"x": x, "y": y}, {"reduction": "mean", "ignore_index": -100}, "", ("x",))


def test_dropout_masks_match_cpu():
    # the same counter-based RNG: CPU and GPU draw the same mask for the same seed and call
    x = f32(64, 33)
    oc, og, gc, gg = run_both("Dropout", {"x": x, "ratio": np.float32(0.3), "t": np.bool_(True)}, None, "", ("x",),
                              n_outputs=2, const_inputs=("ratio", "t"))
    np.testing.assert_array_equal(oc[1], og[1])
    np.testing.assert_allclose(og[0], oc[0], rtol=1e-6)
    np.testing.assert_allclose(gg[0], gc[0], rtol=1e-6)


@pytest.mark.parametrize("dt", [torch.bfloat16, torch.float16])
def test_matmul_half_precision(dt):
    a, b = torch.randn(64, 48, device="cuda", dtype=dt), torch.randn(48, 32, device="cuda", dtype=dt)
    from onnx import TensorProto, helper
    t = TensorProto.BFLOAT16 if dt == torch.bfloat16 else TensorProto.FLOAT16
    g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "mm",
                          [helper.make_tensor_value_info("a", t, None), helper.make_tensor_value_info("b", t, None)],
                          [helper.make_tensor_value_info("y", TensorProto.UNDEFINED, None)])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)]).SerializeToString()
    eng = _C.Engine(model, [True, True])
    caps, stash = eng.forward([a, b], True, torch.cuda.current_stream().cuda_stream)
    y = torch.from_dlpack(caps[0])
    assert y.dtype == dt
    torch.testing.assert_close(y.float(), a.float() @ b.float(), rtol=2e-2, atol=2e-2)


# ---- conv.cu, pool.cu, norm.cu, misc.cu, scan.cu, rnn.cu: every op of the table that runs as a kernel
# (id, op, inputs, attrs, grad, n_outputs, const_inputs, tolerance). Backward ops (ConvGradX/W,
# MaxPoolGrad, PadGrad, LSTMGrad, RNNGrad, ...) run through the forward op's gradient.

def i64(*vals):
    return np.array(vals, np.int64)


def _rnn_inputs(cell, T, B, I, H, D, full=True, scale=1.0, draw=f32):
    G = {"LSTM": 4, "GRU": 3, "RNN": 1}[cell]
    inp = {"X": draw(T, B, I), "W": draw(D, G * H, I) * scale, "R": draw(D, G * H, H) * scale}
    if full:
        inp.update({"B": draw(D, 2 * G * H), "sequence_lens": None, "initial_h": draw(D, B, H)})
        if cell == "LSTM":
            inp["initial_c"] = f32(D, B, H)
    return inp


LOOSE = dict(rtol=1e-4, atol=1e-4)
NEW_CASES = [
    # Conv: im2col + GEMMs, col2im gather, grads for X, W, B
    ("conv2d-pads-strides-bias", "Conv", {"x": f32(2, 3, 7, 6), "w": f32(4, 3, 3, 3), "b": f32(4)},
     {"pads": [1, 1, 1, 1], "strides": [2, 1]}, ("x", "w", "b"), 1, (), LOOSE),
    ("conv2d-groups-dilation-same", "Conv", {"x": f32(3, 4, 8, 9), "w": f32(6, 2, 3, 3)},
     {"group": 2, "dilations": [2, 1], "auto_pad": "SAME_UPPER"}, ("x", "w"), 1, (), LOOSE),
    ("conv2d-depthwise", "Conv", {"x": f32(2, 6, 5, 5), "w": f32(6, 1, 3, 3), "b": f32(6)},
     {"group": 6, "pads": [1, 0, 1, 2]}, ("x", "w", "b"), 1, (), LOOSE),
    ("conv2d-1x1", "Conv", {"x": f32(2, 3, 5, 4), "w": f32(4, 3, 1, 1), "b": f32(4)}, None, ("x", "w", "b"), 1, (),
     LOOSE),
    ("conv1d", "Conv", {"x": f32(3, 2, 10), "w": f32(5, 2, 4), "b": f32(5)}, {"strides": [2], "pads": [1, 2]},
     ("x", "w", "b"), 1, (), LOOSE),
    ("conv-bias-grad-only", "Conv", {"x": f32(2, 3, 6, 6), "w": f32(4, 3, 3, 3), "b": f32(4)}, None, ("x", "b"), 1,
     ("w",), LOOSE),
    # ConvTranspose: ConvGradX's pass with x as dy (col2im adds the bias), grads through Conv, ConvGradW
    # (x and dy swapped) and ReduceSum
    ("convt2d-strides-outpad-groups-bias", "ConvTranspose", {"x": f32(2, 4, 5, 4), "w": f32(4, 3, 3, 3), "b": f32(6)},
     {"strides": [2, 2], "pads": [1, 0, 1, 1], "output_padding": [1, 0], "group": 2}, ("x", "w", "b"), 1, (), LOOSE),
    ("convt1d-dilation", "ConvTranspose", {"x": f32(3, 2, 7), "w": f32(2, 5, 3)}, {"dilations": [2], "pads": [1, 2]},
     ("x", "w"), 1, (), LOOSE),
    ("convt3d-bias", "ConvTranspose", {"x": f32(1, 2, 3, 4, 3), "w": f32(2, 3, 2, 3, 2), "b": f32(3)},
     {"strides": [1, 2, 1], "pads": [0, 1, 0, 0, 1, 0]}, ("x", "w", "b"), 1, (), LOOSE),
    ("convt2d-1x1-bias", "ConvTranspose", {"x": f32(2, 3, 4, 5), "w": f32(3, 4, 1, 1), "b": f32(4)}, None,
     ("x", "w", "b"), 1, (), LOOSE),
    # BatchNormalization: training (batch statistics, running stats), inference
    ("bn-train-4d", "BatchNormalization",
     {"x": f32(4, 3, 5, 6) * 2 + 0.5, "s": f32(3), "b": f32(3), "m": f32(3), "v": pos(3)},
     {"training_mode": 1, "momentum": 0.9, "epsilon": 1e-5}, ("x", "s", "b"), 3, (), LOOSE),
    ("bn-train-2d", "BatchNormalization", {"x": f32(6, 4), "s": f32(4), "b": f32(4), "m": f32(4), "v": pos(4)},
     {"training_mode": 1, "momentum": 0.8}, ("x", "s", "b"), 3, (), LOOSE),
    ("bn-inference", "BatchNormalization", {"x": f32(4, 3, 5), "s": f32(3), "b": f32(3), "m": f32(3), "v": pos(3)},
     None, ("x", "s", "b"), 1, (), LOOSE),
    # pools
    ("maxpool2d", "MaxPool", {"x": f32(2, 3, 9, 8)}, {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]},
     ("x",), 1, (), {}),
    ("maxpool2d-ceil-dilation-indices", "MaxPool", {"x": f32(2, 2, 9, 9)},
     {"kernel_shape": [2, 3], "strides": [2, 2], "dilations": [2, 1], "ceil_mode": 1}, ("x",), 2, (), {}),
    ("maxpool1d", "MaxPool", {"x": f32(2, 3, 11)}, {"kernel_shape": [3], "strides": [2], "pads": [1, 1]}, ("x",), 1,
     (), {}),
    ("avgpool2d-include-pad-ceil", "AveragePool", {"x": f32(2, 3, 7, 8)},
     {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1, "ceil_mode": 1},
     ("x",), 1, (), {}),
    ("avgpool2d-exclude-pad", "AveragePool", {"x": f32(2, 3, 7, 8)},
     {"kernel_shape": [3, 2], "strides": [1, 2], "pads": [1, 0, 1, 1]}, ("x",), 1, (), {}),
    ("avgpool1d", "AveragePool", {"x": f32(2, 3, 10)}, {"kernel_shape": [4], "strides": [3]}, ("x",), 1, (), {}),
    ("global-avgpool", "GlobalAveragePool", {"x": f32(2, 3, 4, 5)}, None, ("x",), 1, (), {}),
    ("global-maxpool", "GlobalMaxPool", {"x": f32(2, 3, 4, 5)}, None, ("x",), 1, (), {}),
    ("global-avgpool-1d", "GlobalAveragePool", {"x": f32(3, 2, 70)}, None, ("x",), 1, (), {}),
    # Pad (the value is a device tensor, read by the kernel) and PadGrad
    ("pad-constant", "Pad", {"x": f32(2, 3, 4), "pads": i64(0, 1, 2, 1, 2, 3), "value": np.float32(0.5)},
     {"mode": "constant"}, ("x",), 1, ("pads",), {}),
    ("pad-reflect", "Pad", {"x": f32(2, 3, 4), "pads": i64(0, 1, 2, 1, 2, 3)}, {"mode": "reflect"}, ("x",), 1,
     ("pads",), {}),
    ("pad-edge", "Pad", {"x": f32(2, 3, 4), "pads": i64(0, 1, 2, 1, 2, 3)}, {"mode": "edge"}, ("x",), 1,
     ("pads",), {}),
    ("pad-wrap", "Pad", {"x": f32(2, 3, 4), "pads": i64(0, 1, 2, 1, 2, 3)}, {"mode": "wrap"}, ("x",), 1,
     ("pads",), {}),
    ("pad-axes-crop", "Pad", {"x": f32(3, 5), "pads": i64(1, -2), "value": None, "axes": i64(-1)}, None, ("x",), 1,
     ("pads", "axes"), {}),
    ("pad-int64", "Pad", {"x": np.arange(12, dtype=np.int64).reshape(3, 4), "pads": i64(1, 0, 0, 2)},
     {"mode": "edge"}, (), 1, ("pads",), {}),
    # Einsum: gathers + one strided-batched GEMM (or a row sum), layouts as they come
    ("einsum-bmm", "Einsum", {"a": f32(2, 3, 4), "b": f32(2, 4, 5)}, {"equation": "bij,bjk->bik"}, ("a", "b"), 1,
     (), LOOSE),
    ("einsum-attn-scores", "Einsum", {"a": f32(2, 2, 3, 4), "b": f32(2, 2, 5, 4)}, {"equation": "bhqd,bhkd->bhqk"},
     ("a", "b"), 1, (), LOOSE),
    ("einsum-ellipsis-broadcast", "Einsum", {"a": f32(2, 1, 3, 4), "b": f32(3, 4, 2)},
     {"equation": "...ij,...jk->...ik"}, ("a", "b"), 1, (), LOOSE),
    ("einsum-implicit", "Einsum", {"a": f32(3, 4), "b": f32(4, 2)}, {"equation": "ij,jk"}, ("a", "b"), 1, (), LOOSE),
    ("einsum-outer", "Einsum", {"a": f32(3), "b": f32(4)}, {"equation": "i,j->ij"}, ("a", "b"), 1, (), LOOSE),
    ("einsum-dot-rows", "Einsum", {"a": f32(3, 4), "b": f32(3, 4)}, {"equation": "bi,bi->b"}, ("a", "b"), 1, (),
     LOOSE),
    ("einsum-transpose", "Einsum", {"a": f32(2, 3, 4)}, {"equation": "ijk->kji"}, ("a",), 1, (), LOOSE),
    ("einsum-sum", "Einsum", {"a": f32(3, 40)}, {"equation": "ij->i"}, (), 1, (), LOOSE),   # no gradient rule
    # CumSum: a block scan per row (inner 1, several chunks), a column per thread otherwise; ints, bool
    ("cumsum-rows", "CumSum", {"x": f32(3, 700), "axis": i64(1)}, None, ("x",), 1, ("axis",), LOOSE),
    ("cumsum-rows-exclusive-reverse", "CumSum", {"x": f32(4, 300), "axis": i64(-1)}, {"exclusive": 1, "reverse": 1},
     ("x",), 1, ("axis",), LOOSE),
    ("cumsum-cols", "CumSum", {"x": f32(5, 4, 3), "axis": i64(0)}, {"reverse": 1}, ("x",), 1, ("axis",), {}),
    ("cumsum-int64", "CumSum", {"x": R.integers(-5, 5, (2, 9)).astype(np.int64), "axis": np.array(1, np.int32)},
     {"exclusive": 1}, (), 1, ("axis",), {}),
    ("cumsum-bool", "CumSum", {"x": R.random((3, 33)) > 0.4, "axis": i64(1)}, None, (), 1, ("axis",), {}),
    # GatherElements / GatherElementsGrad / ScatterElements (indices are data: device tensors)
    ("gather-elements", "GatherElements", {"x": f32(4, 5), "i": np.array([[0, 3, -1, 2, 1], [3, 3, 0, 0, -4]])},
     {"axis": 0}, ("x",), 1, (), {}),
    ("gather-elements-smaller", "GatherElements", {"x": f32(3, 4, 5), "i": R.integers(-5, 5, (2, 3, 6))},
     {"axis": 2}, ("x",), 1, (), {}),
    ("gather-elements-int32-idx", "GatherElements", {"x": R.integers(0, 9, (4, 3)).astype(np.int64),
     "i": np.array([[1, 0, 3], [2, 2, 0]], np.int32)}, {"axis": 0}, (), 1, (), {}),
    ("scatter-elements-dups", "ScatterElements", {"x": f32(4, 5), "i": np.array([[1, 0, 1], [1, 3, 1]]),
     "u": f32(2, 3)}, {"axis": 0}, ("x", "u"), 1, (), {}),
    ("scatter-elements-add", "ScatterElements", {"x": f32(3, 6), "i": np.array([[0, 5, 5, -1], [2, 2, 0, 0]]),
     "u": f32(2, 4)}, {"axis": 1, "reduction": "add"}, ("x", "u"), 1, (), {}),
    # LSTM / GRU and LSTMGrad / GRUGrad
    ("lstm-forward", "LSTM", _rnn_inputs("LSTM", 5, 3, 4, 6, 1), {"hidden_size": 6}, ("X", "W", "R", "B", "initial_h",
     "initial_c"), 3, (), LOOSE),
    ("lstm-reverse", "LSTM", _rnn_inputs("LSTM", 5, 3, 4, 6, 1), {"hidden_size": 6, "direction": "reverse"},
     ("X", "W", "R", "B", "initial_h", "initial_c"), 3, (), LOOSE),
    ("lstm-bidirectional", "LSTM", _rnn_inputs("LSTM", 5, 3, 4, 6, 2), {"hidden_size": 6, "direction": "bidirectional"},
     ("X", "W", "R", "B", "initial_h", "initial_c"), 3, (), LOOSE),
    ("lstm-minimal-y-h", "LSTM", _rnn_inputs("LSTM", 5, 3, 4, 6, 1, full=False), {"hidden_size": 6},
     ("X", "W", "R"), 2, (), LOOSE),
    ("lstm-larger", "LSTM", _rnn_inputs("LSTM", 9, 5, 16, 24, 2, scale=0.2),
     {"hidden_size": 24, "direction": "bidirectional"}, ("X", "W", "R", "B"), 3, (), LOOSE),
    ("gru-lbr", "GRU", _rnn_inputs("GRU", 5, 3, 4, 6, 1), {"hidden_size": 6, "linear_before_reset": 1},
     ("X", "W", "R", "B", "initial_h"), 2, (), LOOSE),
    ("gru-no-lbr", "GRU", _rnn_inputs("GRU", 5, 3, 4, 6, 1), {"hidden_size": 6, "linear_before_reset": 0},
     ("X", "W", "R", "B", "initial_h"), 2, (), LOOSE),
    ("gru-bidirectional-no-lbr", "GRU", _rnn_inputs("GRU", 5, 3, 4, 6, 2),
     {"hidden_size": 6, "direction": "bidirectional"}, ("X", "W", "R", "B", "initial_h"), 2, (), LOOSE),
    ("gru-reverse-lbr", "GRU", _rnn_inputs("GRU", 5, 3, 4, 6, 1),
     {"hidden_size": 6, "direction": "reverse", "linear_before_reset": 1}, ("X", "W", "R", "B", "initial_h"), 2, (),
     LOOSE),
    ("gru-minimal", "GRU", _rnn_inputs("GRU", 5, 3, 4, 6, 1, full=False), {"hidden_size": 6, "linear_before_reset": 1},
     ("X", "W", "R"), 2, (), LOOSE),
    # GatherND / GatherNDGrad / ScatterND (cuda/gather_nd.cu; last: their draws from R leave the earlier
    # cases' inputs as they were): tuples are data, negative entries wrap,
    # repeats accumulate (GatherNDGrad, add) or the last one wins (none)
    ("gather-nd-slices", "GatherND", {"x": f32(4, 5, 3), "i": np.array([[[0, 4], [-1, 2]], [[3, -5], [0, 4]]])},
     None, ("x",), 1, (), {}),
    ("gather-nd-elements", "GatherND", {"x": f32(3, 4, 5), "i": R.integers(-3, 3, (7, 3))}, None, ("x",), 1, (), {}),
    ("gather-nd-batch-dims", "GatherND", {"x": f32(2, 3, 4), "i": np.array([[[2], [0], [2]], [[1], [1], [-3]]])},
     {"batch_dims": 1}, ("x",), 1, (), {}),
    ("gather-nd-int64-data-int32-idx", "GatherND", {"x": R.integers(0, 9, (4, 3)).astype(np.int64),
     "i": np.array([[1], [3], [1]], np.int32)}, None, (), 1, (), {}),
    ("scatter-nd-dups", "ScatterND", {"x": f32(5, 3), "i": np.array([[1], [3], [1], [4], [1]]), "u": f32(5, 3)},
     None, ("x", "u"), 1, (), {}),
    ("scatter-nd-slice-assign", "ScatterND", {"x": f32(2, 6, 3), "i": np.stack(np.meshgrid(
        np.arange(2), np.arange(1, 6), indexing="ij"), -1).astype(np.int64), "u": f32(2, 5, 3)},
     None, ("x", "u"), 1, (), {}),
    ("scatter-nd-add", "ScatterND", {"x": f32(4, 3), "i": np.array([[[0, 2]], [[0, 2]], [[-1, -3]], [[3, 0]]]),
     "u": f32(4, 1)}, {"reduction": "add"}, ("x", "u"), 1, (), {}),
    ("scatter-nd-int64-labels", "ScatterND", {"x": np.zeros((2, 5), np.int64), "i": np.stack(np.meshgrid(
        np.arange(2), np.arange(1, 5), indexing="ij"), -1).astype(np.int64),
     "u": R.integers(0, 64, (2, 4)).astype(np.int64)}, None, (), 1, (), {}),
    # OneHot (cuda/nonzero.cu; literal inputs, no draw): negative indices wrap, the new axis anywhere
    ("one-hot-axis-1", "OneHot", {"i": np.array([[0, 3, -1], [2, -4, 1]], np.int64), "d": np.array(4, np.int64),
     "v": np.array([0.0, 1.0], np.float32)}, {"axis": 1}, (), 1, ("d", "v"), {}),
    ("one-hot-last-int32", "OneHot", {"i": np.array([1, 0, 2, -3], np.int32), "d": np.array([3], np.int64),
     "v": np.array([-2, 5], np.int64)}, None, (), 1, ("d", "v"), {}),
    # RNN / RNNGrad (tanh and relu; drawn from R23)
    ("rnn-tanh-forward", "RNN", _rnn_inputs("RNN", 5, 3, 4, 6, 1, draw=f32r), {"hidden_size": 6},
     ("X", "W", "R", "B", "initial_h"), 2, (), LOOSE),
    ("rnn-relu-reverse", "RNN", _rnn_inputs("RNN", 5, 3, 4, 6, 1, draw=f32r),
     {"hidden_size": 6, "direction": "reverse", "activations": ["Relu"]}, ("X", "W", "R", "B", "initial_h"), 2, (),
     LOOSE),
    ("rnn-bidirectional-relu-tanh", "RNN", _rnn_inputs("RNN", 5, 3, 4, 6, 2, draw=f32r),
     {"hidden_size": 6, "direction": "bidirectional", "activations": ["Relu", "Tanh"]},
     ("X", "W", "R", "B", "initial_h"), 2, (), LOOSE),
    ("rnn-minimal-relu", "RNN", _rnn_inputs("RNN", 5, 3, 4, 6, 1, full=False, draw=f32r),
     {"hidden_size": 6, "activations": ["Relu"]}, ("X", "W", "R"), 2, (), LOOSE),
    ("rnn-larger-tanh", "RNN", _rnn_inputs("RNN", 9, 5, 16, 24, 2, scale=0.2, draw=f32r),
     {"hidden_size": 24, "direction": "bidirectional"}, ("X", "W", "R", "B"), 2, (), LOOSE),
    # (last: cases draw their inputs from one generator in order, so a case added in the middle
    # changes every later case's inputs; bf16-rnn-larger-tanh sits at its tolerance's edge)
    # ceil_mode windows past the padded input: a dilated kernel longer than it (extent 5 over
    # 2 + 1 + 1, one window), and AveragePool's kernel 4 over 1 + 1 + 1 (model fuzzer seed 80058)
    ("maxpool2d-ceil-extent-past-padding", "MaxPool", {"x": f32(2, 3, 2, 9)},
     {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "dilations": [2, 2], "ceil_mode": 1},
     ("x",), 2, (), {}),
    ("avgpool1d-ceil-extent-past-padding", "AveragePool", {"x": f32(2, 3, 1)},
     {"kernel_shape": [4], "strides": [2], "pads": [1, 1], "ceil_mode": 1}, ("x",), 1, (), {}),
]


def _ties(*shape, levels=4):
    """Small integers (exact in fp16/bf16 too): rows full of ties."""
    return R14.integers(0, levels, shape).astype(np.float32)


def _ties_nan(*shape):
    x = _ties(*shape)
    x.reshape(-1)[::7] = np.nan
    x.reshape(-1)[3::11] = -0.0
    return x


# TopK / Sort: the indices must be the CPU's exactly, ties and NaN included (cuda/topk.cu replays
# the CPU's order). (name, op, inputs, attrs, domain, grad, n_outputs, const)
SELECT_CASES = [
    ("topk-largest-sorted", "TopK", {"x": _ties_nan(4, 37), "k": np.array([5], np.int64)}, {"axis": 1}, "", ("x",), 2,
     ("k",)),
    ("topk-partial-sort-path", "TopK", {"x": _ties(3, 300), "k": np.array([4], np.int64)}, {"axis": -1}, "", ("x",),
     2, ("k",)),
    ("topk-smallest-unsorted-axis0", "TopK", {"x": _ties_nan(20, 3, 2), "k": np.array([7], np.int64)},
     {"axis": 0, "largest": 0, "sorted": 0}, "", ("x",), 2, ("k",)),
    ("topk-all", "TopK", {"x": f32b(5, 9), "k": np.array([9], np.int64)}, {"axis": 1, "largest": 1}, "", ("x",), 2,
     ("k",)),
    ("topk-int64", "TopK", {"x": R14.integers(-3, 3, (4, 30)), "k": np.array([6], np.int64)}, None, "", (), 2,
     ("k",)),
    ("sort-descending", "Sort", {"x": _ties_nan(3, 50)}, {"axis": -1, "descending": 1}, "ortmod", ("x",), 2, ()),
    ("sort-ascending-axis1", "Sort", {"x": _ties(2, 40, 3)}, {"axis": 1}, "ortmod", ("x",), 2, ()),
    ("sort-stable", "Sort", {"x": _ties_nan(3, 70)}, {"axis": 1, "stable": 1}, "ortmod", ("x",), 2, ()),
]


@pytest.mark.parametrize("op,inputs,attrs,domain,grad,n_out,const", [c[1:] for c in SELECT_CASES],
                         ids=[c[0] for c in SELECT_CASES])
def test_select_op_matches_cpu(op, inputs, attrs, domain, grad, n_out, const):
    check(op, inputs, attrs, domain, grad, n_outputs=n_out, const_inputs=const)


@pytest.mark.parametrize("op,inputs,attrs,grad,n_out,const,tol", [c[1:] for c in NEW_CASES],
                         ids=[c[0] for c in NEW_CASES])
def test_new_op_matches_cpu(op, inputs, attrs, grad, n_out, const, tol):
    check(op, inputs, attrs, "", grad, n_outputs=n_out, const_inputs=const, **tol)


# float64 takes the double kernels and cuBLAS's D GEMMs: agreement to fp64 rounding
F64_CASES = [c for c in NEW_CASES if c[0] in ("conv2d-groups-dilation-same", "conv2d-pads-strides-bias", "bn-train-4d",
                                              "convt2d-strides-outpad-groups-bias",
                                              "avgpool2d-include-pad-ceil", "einsum-attn-scores", "cumsum-rows",
                                              "pad-reflect", "scatter-elements-add", "scatter-nd-add",
                                              "gather-nd-batch-dims", "lstm-bidirectional",
                                              "gru-bidirectional-no-lbr", "rnn-bidirectional-relu-tanh")]


@pytest.mark.parametrize("op,inputs,attrs,grad,n_out,const", [c[1:7] for c in F64_CASES],
                         ids=[c[0] for c in F64_CASES])
def test_new_op_float64_matches_cpu(op, inputs, attrs, grad, n_out, const):
    inputs = {k: (v.astype(np.float64) if isinstance(v, (np.ndarray, np.generic)) and v.dtype == np.float32 else v)
              for k, v in inputs.items()}
    check(op, inputs, attrs, "", grad, n_outputs=n_out, const_inputs=const, rtol=1e-9, atol=1e-10)


def test_conv_large_batch_takes_several_im2col_chunks():
    # im2col scratch is taken in chunks of at most 256 MiB: a 3x3 kernel over 128 channels at 128x128
    # is 75 MiB of columns per image, so these 5 images take two chunks (3 + 2)
    x, w = f32(5, 128, 128, 128), f32(8, 128, 3, 3) * 0.05
    check("Conv", {"x": x, "w": w}, {"pads": [1, 1, 1, 1]}, "", ("x", "w"), rtol=1e-3, atol=1e-3)


def test_maxpool_nan_wins_its_window_as_on_cpu():
    x = f32(1, 1, 4, 4)
    x[0, 0, 1, 1] = np.nan
    oc, og, _, _ = run_both("MaxPool", {"x": x}, {"kernel_shape": [2, 2], "strides": [2, 2]}, "", (), n_outputs=2)
    np.testing.assert_array_equal(og[1], oc[1])
    np.testing.assert_array_equal(np.isnan(og[0]), np.isnan(oc[0]))
    np.testing.assert_allclose(og[0][~np.isnan(og[0])], oc[0][~np.isnan(oc[0])])


def test_gather_elements_out_of_range_index_reads_zero_on_the_gpu():
    # the CPU raises; the GPU cannot without a synchronization: the element contributes 0
    x = f32(3, 2)
    model = make_model("GatherElements", {"x": x, "i": np.array([[3, 0]], np.int64)}, {"axis": 0})
    eng = _C.Engine(model, None)
    caps, _ = eng.forward([torch.from_numpy(x).cuda(), torch.tensor([[3, 0]], device="cuda")], False,
                          torch.cuda.current_stream().cuda_stream)
    y = torch.from_dlpack(caps[0]).cpu().numpy()
    np.testing.assert_array_equal(y, [[0.0, x[0, 1]]])


# Indices that are a constant are known at plan time: the shape rule refuses one out of range on a
# CUDA plan too, as the CPU kernel does (the GPU kernels, which cannot report an index without a
# synchronization, would read 0 as above). (op, inputs, attrs, the message after the node's name)
CONSTANT_OUT_OF_RANGE = [
    ("Gather", {"x": np.ones((3, 2), np.float32), "i": np.array([0, 3], np.int64)}, {"axis": 0},
     r"index 3 \(at position 1\) is out of range for axis 0 of size 3"),
    ("GatherElements", {"x": np.ones((3, 2), np.float32), "i": np.array([[3, 0]], np.int64)}, {"axis": 0},
     r"index 3 \(at position 0\) is out of range for axis 0 of size 3"),
    ("ScatterElements", {"x": np.ones((3, 2), np.float32), "i": np.array([[0, -4]], np.int64),
                         "u": np.ones((1, 2), np.float32)}, {"axis": 0},
     r"index -4 \(at position 1\) is out of range for axis 0 of size 3"),
    ("GatherND", {"x": np.ones((3, 2), np.float32), "i": np.array([[0, 2]], np.int64)}, {},
     r"index 2 \(tuple 0, entry 1\) is out of range for a dim of size 2"),
    ("ScatterND", {"x": np.ones((3, 2), np.float32), "i": np.array([[3]], np.int64), "u": np.ones((1, 2), np.float32)},
     {}, r"index 3 \(tuple 0, entry 0\) is out of range for a dim of size 3"),
]



@pytest.mark.parametrize("op,inputs,attrs,match", CONSTANT_OUT_OF_RANGE, ids=[c[0] for c in CONSTANT_OUT_OF_RANGE])
def test_constant_index_out_of_range_is_refused_on_the_gpu(op, inputs, attrs, match):
    eng = _C.Engine(make_model(op, inputs, attrs, const_inputs=("i",)), None)
    feeds = [torch.from_numpy(a).cuda() for n, a in inputs.items() if n != "i"]
    with pytest.raises(_C.EngineError, match=f"{op} node .*" + match):
        eng.forward(feeds, False, torch.cuda.current_stream().cuda_stream)


# CTCLoss / CTCLossGrad (cuda/ctc.cu against csrc/ops/ctc.c): log-probabilities from their own
# draws; lengths as device inputs or as plan-time constants; NaN gradients of an impossible
# alignment compare equal. (name, inputs, attrs, grad, const)
R31 = np.random.default_rng(31)


def _log_probs(*shape):
    x = R31.standard_normal(shape).astype(np.float32)
    m = x.max(-1, keepdims=True)
    return (x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))).astype(np.float32)


def _i64(*v):
    return np.array(v, np.int64)


CTC_CASES = [
    ("ctc-padded-varying-lengths", {"lp": _log_probs(16, 3, 6), "tg": _i64([1, 2, 2, 3, 1], [4, 4, 4, 1, 0],
                                                                           [2, 3, 0, 0, 0]),
                                    "il": _i64(16, 12, 7), "tl": _i64(5, 4, 2)}, None, ("lp",), ()),
    ("ctc-concatenated-blank-last", {"lp": _log_probs(12, 2, 5), "tg": _i64(0, 1, 1, 2, 3, 3, 0),
                                     "il": _i64(12, 9), "tl": _i64(4, 3)}, {"blank": 4}, ("lp",), ()),
    ("ctc-impossible", {"lp": _log_probs(8, 2, 5), "tg": _i64([1, 1, 1, 1], [2, 3, 0, 0]),
                        "il": _i64(5, 8), "tl": _i64(4, 2)}, None, ("lp",), ()),
    ("ctc-impossible-zero-infinity", {"lp": _log_probs(8, 2, 5), "tg": _i64([1, 1, 1, 1], [2, 3, 0, 0]),
                                      "il": _i64(5, 8), "tl": _i64(4, 2)}, {"zero_infinity": 1}, ("lp",), ()),
    ("ctc-unbatched-constant-lengths", {"lp": _log_probs(10, 5), "tg": _i64(2, 4, 4, 1), "il": _i64(10),
                                        "tl": _i64(4)}, None, ("lp",), ("il", "tl")),
    ("ctc-int32-empty-target-zero-input", {"lp": _log_probs(6, 3, 4), "tg": np.array([[1, 2], [0, 0], [3, 1]], np.int32),
                                           "il": _i64(6, 5, 0), "tl": _i64(2, 0, 1)}, None, ("lp",), ()),
    ("ctc-masked-targets", {"lp": _log_probs(10, 3, 5), "tg": _i64([1, 2, -1, 3], [-1, 4, 4, -1], [2, -1, -1, -1]),
                            "il": _i64(10, 9, 6), "tl": _i64(3, 2, 1),
                            "mask": np.array([[1, 1, 0, 1], [0, 1, 1, 0], [1, 0, 0, 0]], bool)}, None, ("lp",), ()),
]


@pytest.mark.parametrize("inputs,attrs,grad,const", [c[1:] for c in CTC_CASES], ids=[c[0] for c in CTC_CASES])
def test_ctc_op_matches_cpu(inputs, attrs, grad, const):
    check("CTCLoss", inputs, attrs, "ortmod", grad, const_inputs=const, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("op,inputs,attrs,domain,grad,const", LLAMA_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(LLAMA_CASES)])
def test_llama_op_matches_cpu(op, inputs, attrs, domain, grad, const):
    check(op, inputs, attrs, domain, grad, const_inputs=const)


# sequence_lens shorter than seq_length: the CPU kernels implement them (tests/test_ops_rnn.py); the
# CUDA kernels do not, and refuse them by name rather than run them full length
@pytest.mark.parametrize("cell", ["LSTM", "GRU", "RNN"])
def test_short_sequence_lens_are_refused_on_the_gpu(cell):
    inputs = _rnn_inputs(cell, 4, 2, 3, 2, 1)
    inputs["sequence_lens"] = np.array([4, 2], np.int32)
    eng = _C.Engine(make_model(cell, inputs, {"hidden_size": 2}, n_outputs=2, const_inputs=("sequence_lens",)), None)
    feeds = [torch.from_numpy(a).cuda() for n, a in inputs.items() if a is not None and n != "sequence_lens"]
    with pytest.raises(Exception, match="sequence_lens shorter than seq_length on this device"):
        eng.forward(feeds, False, torch.cuda.current_stream().cuda_stream)
