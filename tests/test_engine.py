"""The engine through its Python binding, without ORTModule: errors, planning, stash."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from ortmod import _C
from oputil import _Cap, make_model


def mlp_model():
    """y = relu(x @ w + b), loss = mean(y): a tiny model built by hand."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["xw"]),
        helper.make_node("Add", ["xw", "b"], ["h"]),
        helper.make_node("Relu", ["h"], ["y"]),
        helper.make_node("ReduceMean", ["y"], ["loss"], keepdims=0),
    ]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("x", "w", "b")]
    outputs = [helper.make_tensor_value_info("loss", TensorProto.FLOAT, None),
               helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]
    g = helper.make_graph(nodes, "mlp", inputs, outputs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)]).SerializeToString()


def np_of(cap):
    return np.from_dlpack(_Cap(cap))


def test_corrupt_onnx_raises_named_error():
    with pytest.raises(_C.InvalidInputError, match="not a valid ONNX model"):
        _C.Engine(b"\x08\x07garbage-that-is-not-protobuf\xff\xff", None)
    with pytest.raises(_C.InvalidInputError, match="empty"):
        _C.Engine(b"", None)


def test_unsupported_op_names_op_and_node():
    m = make_model("Det", {"x": np.zeros((2, 3, 3), np.float32)})   # torch.linalg.det's export
    with pytest.raises(_C.UnsupportedOpError, match="Det"):
        _C.Engine(m, None)


def test_wrong_dtype_and_count_are_named():
    eng = _C.Engine(mlp_model(), [False, True, True])
    x, w, b = np.ones((2, 3), np.float32), np.ones((3, 4), np.float32), np.ones(4, np.float32)
    with pytest.raises(ValueError, match="input 'x' has dtype float64"):
        eng.forward([x.astype(np.float64), w, b], True)
    with pytest.raises(ValueError, match="takes 3 inputs"):
        eng.forward([x, w], True)
    with pytest.raises(TypeError, match="input 1"):
        eng.forward([x, "w", b], True)


def test_forward_backward_and_replan():
    eng = _C.Engine(mlp_model(), [False, True, True])
    rng = np.random.default_rng(0)
    for batch in (2, 5, 2):   # a new batch size re-plans; the old plan is reused after
        x = rng.standard_normal((batch, 3)).astype(np.float32)
        w = rng.standard_normal((3, 4)).astype(np.float32)
        b = rng.standard_normal(4).astype(np.float32)
        outs, stash = eng.forward([x, w, b], True)
        loss, y = (np_of(c) for c in outs)
        h = x @ w + b
        np.testing.assert_allclose(y, np.maximum(h, 0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(loss, np.maximum(h, 0).mean(), rtol=1e-5)
        grads = eng.backward(stash, [np.ones((), np.float32), None])
        assert grads[0] is None
        dh = (h > 0) / h.size
        np.testing.assert_allclose(np_of(grads[1]), x.T @ dh, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np_of(grads[2]), dh.sum(0), rtol=1e-5, atol=1e-6)


def test_two_forwards_then_two_backwards():
    eng = _C.Engine(mlp_model(), [False, True, True])
    rng = np.random.default_rng(1)
    w, b = rng.standard_normal((3, 4)).astype(np.float32), np.zeros(4, np.float32)
    x1, x2 = (rng.standard_normal((2, 3)).astype(np.float32) for _ in range(2))
    _, s1 = eng.forward([x1, w, b], True)
    _, s2 = eng.forward([x2, w, b], True)
    g2 = np_of(eng.backward(s2, [np.ones((), np.float32), None])[1])
    g1 = np_of(eng.backward(s1, [np.ones((), np.float32), None])[1])
    for x, g in ((x1, g1), (x2, g2)):
        h = x @ w + b
        np.testing.assert_allclose(g, x.T @ ((h > 0) / h.size), rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="already"):
        eng.backward(s1, [np.ones((), np.float32), None])


def test_gradient_seed_shape_is_checked():
    eng = _C.Engine(mlp_model(), [False, True, True])
    x, w, b = np.ones((2, 3), np.float32), np.ones((3, 4), np.float32), np.ones(4, np.float32)
    _, stash = eng.forward([x, w, b], True)
    with pytest.raises(ValueError, match="gradient for output 'y'"):
        eng.backward(stash, [np.ones((), np.float32), np.ones((3, 3), np.float32)])


def test_noncontiguous_input_is_read_correctly():
    eng = _C.Engine(mlp_model(), None)
    rng = np.random.default_rng(2)
    xt = rng.standard_normal((3, 2)).astype(np.float32)
    w, b = rng.standard_normal((3, 4)).astype(np.float32), np.zeros(4, np.float32)
    outs, stash = eng.forward([xt.T, w, b], False)
    assert stash is None
    np.testing.assert_allclose(np_of(outs[1]), np.maximum(xt.T @ w + b, 0), rtol=1e-5, atol=1e-6)


def test_export_stages_are_valid_onnx():
    import onnx
    eng = _C.Engine(mlp_model(), [False, True, True])
    for stage in ("optimized", "execution"):
        m = onnx.load_from_string(eng.export_onnx(stage))
        assert len(m.graph.node) >= 4
    exe = onnx.load_from_string(eng.export_onnx("execution"))
    assert any(o.name.endswith("_grad") or "grad" in o.name for o in exe.graph.input)
    with pytest.raises(ValueError):
        eng.export_onnx("nonsense")


def two_heads_model():
    """h = x @ w; a = relu(h) @ wa; b = tanh(h) @ wb: two outputs sharing a trunk."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Relu", ["h"], ["ra"]),
        helper.make_node("Tanh", ["h"], ["tb"]),
        helper.make_node("MatMul", ["ra", "wa"], ["a"]),
        helper.make_node("MatMul", ["tb", "wb"], ["b"]),
    ]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("x", "w", "wa", "wb")]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("a", "b")]
    g = helper.make_graph(nodes, "two_heads", inputs, outputs)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)]).SerializeToString()


def test_outputs_without_gradient_cost_nothing_and_give_none():
    eng = _C.Engine(two_heads_model(), [False, True, True, True])
    rng = np.random.default_rng(3)
    x, w, wa, wb = (rng.standard_normal(s).astype(np.float32) for s in ((4, 3), (3, 5), (5, 2), (5, 2)))
    da = rng.standard_normal((4, 2)).astype(np.float32)
    h = x @ w
    expect_w = x.T @ ((da @ wa.T) * (h > 0))
    for _ in range(2):   # the second call reuses the cached backward variant
        _, stash = eng.forward([x, w, wa, wb], True)
        grads = eng.backward(stash, [da, None])
        assert grads[0] is None and grads[3] is None, "wb only reaches the output without a gradient"
        np.testing.assert_allclose(np_of(grads[1]), expect_w, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(np_of(grads[2]), np.maximum(h, 0).T @ da, rtol=1e-5, atol=1e-6)
    # both gradients present: the full program, wb gets its gradient
    _, stash = eng.forward([x, w, wa, wb], True)
    db = rng.standard_normal((4, 2)).astype(np.float32)
    grads = eng.backward(stash, [da, db])
    np.testing.assert_allclose(np_of(grads[3]), np.tanh(h).T @ db, rtol=1e-5, atol=1e-6)
    expect_w = x.T @ ((da @ wa.T) * (h > 0) + (db @ wb.T) * (1 - np.tanh(h) ** 2))
    np.testing.assert_allclose(np_of(grads[1]), expect_w, rtol=1e-5, atol=1e-5)
