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


def f32(*shape):
    return R.standard_normal(shape).astype(np.float32)


def pos(*shape):
    return (np.abs(R.standard_normal(shape)) + 0.5).astype(np.float32)


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


def test_missing_kernel_fails_at_plan_time_naming_the_op():
    x = f32(1, 2, 5, 5)
    w = f32(3, 2, 3, 3)
    model = make_model("Conv", {"x": x, "w": w})
    eng = _C.Engine(model, [True, True])
    with pytest.raises(_C.UnsupportedOpError, match=r"Conv.*CUDA kernel"):
        eng.forward([torch.from_numpy(x).cuda(), torch.from_numpy(w).cuda()], True,
                    torch.cuda.current_stream().cuda_stream)


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
