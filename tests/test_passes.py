"""Fusion passes: each applied to small graphs built with onnx.helper. For each, the pass
must fire (the optimized forward shows the fused op) and the forward outputs and every
gradient must equal those of the same model with that pass switched off
(ortmod.options.disable_passes, ORTMOD_DISABLE_PASSES=<name>: read when the Engine is created). Patterns that do not
match exactly must be left alone."""
import json
import os
import warnings
import zlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from oputil import run
from ortmod import _C, options

F32 = TensorProto.FLOAT


def _Disabled(names):
    """The passes named are skipped by the engines created in the block."""
    return options.overridden(disable_passes=names)


def model(nodes, inputs, outputs, inits=(), opset=20):
    """inputs: list of (name, shape) float32 graph inputs (rank declared), or (name, shape, elem_type)."""
    gi = [helper.make_tensor_value_info(i[0], i[2] if len(i) > 2 else F32, [f"{i[0]}_{d}" for d in range(len(i[1]))])
          for i in inputs]
    go = [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs]
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in inits]
    g = helper.make_graph(nodes, "g", gi, go, initializer=inits)
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)]).SerializeToString()


def const(name, value, dtype=np.float32):
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value, dtype=dtype)))


def optimized_ops(m, grad_flags=None):
    eng = _C.Engine(m, grad_flags)
    opt = onnx.load_from_string(eng.export_onnx("optimized"))
    return [n.op_type for n in opt.graph.node], json.loads(eng.report())


def check_pass(name, m, feeds, grad_flags, fused_op, rtol=1e-5, atol=1e-6, fires=True):
    ops, report = optimized_ops(m, grad_flags)
    if fires:
        assert fused_op in ops, f"pass {name} did not fire: {ops}"
        fired = [p for p in report["passes"] if p["pass"] == name]
        assert fired and fired[0]["fired"] >= 1
    else:
        assert fused_op not in ops, f"pass {name} fired on a pattern it must leave alone: {ops}"
    outs, grads, dys = run(m, feeds, grad=grad_flags)
    with _Disabled(name):
        ops_off, _ = optimized_ops(m, grad_flags)
        assert fused_op not in ops_off or not fires
        outs0, grads0, _ = run(m, feeds, grad=grad_flags)
    assert len(outs) == len(outs0)
    for a, b in zip(outs, outs0):
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol + rtol * _size(b))
    for a, b, f in zip(grads, grads0, grad_flags):
        if f:
            assert a is not None and b is not None
            np.testing.assert_allclose(a, b, rtol=rtol, atol=atol + rtol * _size(b))
    return outs, grads


def _size(t):
    """A tensor's size for its tolerance: its largest finite magnitude (a fused kernel sums in
    another order, so an element near zero carries rounding from the tensor's large ones)."""
    t = np.asarray(t, dtype=np.float64)
    t = t[np.isfinite(t)]
    return float(np.abs(t).max()) if t.size else 0.0


rng = np.random.default_rng(0)


@pytest.fixture(autouse=True)
def _own_draws(request):
    """Each test draws from a generator seeded by its own name, so that its inputs do not
    depend on which tests ran before it (adding a test must not change another's draws)."""
    global rng
    rng = np.random.default_rng(zlib.crc32(request.node.name.encode()))


def rnd(*shape, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


# ---- softmax_cross_entropy -------------------------------------------------------------

@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_softmax_cross_entropy(reduction):
    nodes = [helper.make_node("LogSoftmax", ["x"], ["lp"], axis=1),
             helper.make_node("NegativeLogLikelihoodLoss", ["lp", "t"], ["loss"], reduction=reduction,
                              ignore_index=2)]
    m = model(nodes, [("x", [6, 5]), ("t", [6], TensorProto.INT64)], ["loss"])
    t = np.array([0, 1, 2, 3, 4, 1], dtype=np.int64)
    check_pass("softmax_cross_entropy", m, [rnd(6, 5), t], [True, False], "SoftmaxCrossEntropyLoss")


def test_softmax_cross_entropy_keeps_log_probs_for_other_readers():
    nodes = [helper.make_node("LogSoftmax", ["x"], ["lp"], axis=-1),
             helper.make_node("NegativeLogLikelihoodLoss", ["lp", "t"], ["loss"]),
             helper.make_node("Exp", ["lp"], ["p"])]
    m = model(nodes, [("x", [4, 3]), ("t", [4], TensorProto.INT64)], ["loss", "p"])
    ops, _ = optimized_ops(m, [True, False])
    assert "LogSoftmax" not in ops and "SoftmaxCrossEntropyLoss" in ops
    check_pass("softmax_cross_entropy", m, [rnd(4, 3), np.array([0, 1, 2, 1], dtype=np.int64)], [True, False],
               "SoftmaxCrossEntropyLoss")


def test_softmax_cross_entropy_wrong_axis_left_alone():
    # (N, C, d) with LogSoftmax over the last axis is not NLL's class axis: no fusion
    nodes = [helper.make_node("LogSoftmax", ["x"], ["lp"], axis=-1),
             helper.make_node("NegativeLogLikelihoodLoss", ["lp", "t"], ["loss"])]
    m = model(nodes, [("x", [2, 3, 4]), ("t", [2, 4], TensorProto.INT64)], ["loss"])
    t = np.array([[0, 1, 2, 1], [2, 2, 0, 1]], dtype=np.int64)
    check_pass("softmax_cross_entropy", m, [rnd(2, 3, 4), t], [True, False], "SoftmaxCrossEntropyLoss", fires=False)


# ---- matmul_add_bias -------------------------------------------------------------------

@pytest.mark.parametrize("xshape", [(5, 4), (2, 3, 4), (4,)])
def test_matmul_add_bias(xshape):
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])]
    m = model(nodes, [("x", list(xshape)), ("w", [4, 6]), ("b", [6])], ["y"])
    check_pass("matmul_add_bias", m, [rnd(*xshape), rnd(4, 6), rnd(6)], [True, True, True], "MatMulBias")


def test_matmul_add_bias_linear_export_transpose_folded():
    # nn.Linear on 3-D input: Transpose(W) -> MatMul -> Add(b, .)
    nodes = [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]),
             helper.make_node("MatMul", ["x", "wt"], ["h"]), helper.make_node("Add", ["b", "h"], ["y"])]
    m = model(nodes, [("x", [2, 3, 4]), ("w", [6, 4]), ("b", [6])], ["y"])
    ops, _ = optimized_ops(m, [True, True, True])
    assert ops == ["MatMulBias"], ops
    check_pass("matmul_add_bias", m, [rnd(2, 3, 4), rnd(6, 4), rnd(6)], [True, True, True], "MatMulBias")


def test_matmul_add_bias_only_some_grads():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])]
    m = model(nodes, [("x", [2, 3, 4]), ("w", [4, 6]), ("b", [6])], ["y"])
    check_pass("matmul_add_bias", m, [rnd(2, 3, 4), rnd(4, 6), rnd(6)], [False, True, False], "MatMulBias")


def test_matmul_add_not_a_bias_left_alone():
    # the added tensor is a full matrix, not a per-column bias
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"])]
    m = model(nodes, [("x", [5, 4]), ("w", [4, 6]), ("b", [5, 6])], ["y"])
    check_pass("matmul_add_bias", m, [rnd(5, 4), rnd(4, 6), rnd(5, 6)], [True, True, True], "MatMulBias",
               fires=False)


def test_matmul_add_intermediate_read_elsewhere_left_alone():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["y"]),
             helper.make_node("Relu", ["h"], ["z"])]
    m = model(nodes, [("x", [5, 4]), ("w", [4, 6]), ("b", [6])], ["y", "z"])
    check_pass("matmul_add_bias", m, [rnd(5, 4), rnd(4, 6), rnd(6)], [True, True, True], "MatMulBias", fires=False)


# ---- gelu / bias_gelu --------------------------------------------------------------------

def gelu_tanh_nodes(x, y):
    """GPT-2's gelu_new as torch.onnx exports it."""
    return [const("c_half", 0.5), const("c_three", 3.0), const("c_k1", 0.044715),
            const("c_k0", 0.7978845608028654), const("c_one", 1.0),
            helper.make_node("Mul", [x, "c_half"], ["g_a"]),
            helper.make_node("Pow", [x, "c_three"], ["g_p"]),
            helper.make_node("Mul", ["g_p", "c_k1"], ["g_b"]),
            helper.make_node("Add", [x, "g_b"], ["g_c"]),
            helper.make_node("Mul", ["g_c", "c_k0"], ["g_d"]),
            helper.make_node("Tanh", ["g_d"], ["g_t"]),
            helper.make_node("Add", ["g_t", "c_one"], ["g_e"]),
            helper.make_node("Mul", ["g_a", "g_e"], [y])]


def test_gelu_tanh_written_out():
    m = model(gelu_tanh_nodes("x", "y"), [("x", [3, 8])], ["y"])
    ops, _ = optimized_ops(m, [True])
    assert ops == ["Gelu"], ops
    check_pass("gelu", m, [rnd(3, 8, scale=2)], [True], "Gelu", rtol=1e-5, atol=1e-6)


def test_gelu_erf_written_out():
    nodes = [const("c_sqrt2", 1.4142135623730951), const("c_one", 1.0), const("c_half", 0.5),
             helper.make_node("Div", ["x", "c_sqrt2"], ["a"]), helper.make_node("Erf", ["a"], ["b"]),
             helper.make_node("Add", ["b", "c_one"], ["c"]), helper.make_node("Mul", ["x", "c"], ["d"]),
             helper.make_node("Mul", ["d", "c_half"], ["y"])]
    m = model(nodes, [("x", [3, 8])], ["y"])
    ops, _ = optimized_ops(m, [True])
    assert ops == ["Gelu"], ops
    check_pass("gelu", m, [rnd(3, 8, scale=2)], [True], "Gelu")


def test_gelu_wrong_constant_left_alone():
    nodes = gelu_tanh_nodes("x", "y")
    nodes[2] = const("c_k1", 0.05)
    m = model(nodes, [("x", [3, 8])], ["y"])
    check_pass("gelu", m, [rnd(3, 8)], [True], "Gelu", fires=False)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu(approximate):
    nodes = [helper.make_node("Add", ["x", "b"], ["h"]), helper.make_node("Gelu", ["h"], ["y"], approximate=approximate)]
    m = model(nodes, [("x", [2, 3, 8]), ("b", [8])], ["y"])
    check_pass("bias_gelu", m, [rnd(2, 3, 8), rnd(8)], [True, True], "BiasGelu")


def test_matmul_add_gelu_is_matmul_and_bias_gelu():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"])]
    nodes += gelu_tanh_nodes("a", "y")
    m = model(nodes, [("x", [2, 3, 4]), ("w", [4, 8]), ("b", [8])], ["y"])
    with _Disabled("matmul_bias_gelu"):
        ops, _ = optimized_ops(m, [True, True, True])
        assert ops == ["MatMul", "BiasGelu"], ops
    with _Disabled("matmul_bias_gelu,bias_gelu"):
        assert optimized_ops(m, [True, True, True])[0] == ["MatMulBias", "Gelu"]
    check_pass("bias_gelu", m, [rnd(2, 3, 4), rnd(4, 8), rnd(8)], [True, True, True], "BiasGelu", fires=False)


# ---- matmul_bias_gelu ----------------------------------------------------------------------

@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("via", ["bias_gelu", "matmul_add_bias"])
def test_matmul_bias_gelu(approximate, via):
    """Either earlier fusion's result (MatMul + BiasGelu, or MatMulBias + Gelu) becomes one node."""
    nodes = [helper.make_node("Transpose", ["w"], ["wt"], perm=[1, 0]), helper.make_node("MatMul", ["x", "wt"], ["h"]),
             helper.make_node("Add", ["h", "b"], ["a"]), helper.make_node("Gelu", ["a"], ["y"], approximate=approximate)]
    m = model(nodes, [("x", [2, 3, 4]), ("w", [8, 4]), ("b", [8])], ["y"])
    other = "matmul_add_bias" if via == "bias_gelu" else "bias_gelu"
    feeds = [rnd(2, 3, 4), rnd(8, 4), rnd(8)]
    with _Disabled(other):
        ops, _ = optimized_ops(m, [True, True, True])
    assert ops == ["MatMulBiasGelu"], ops
    check_pass("matmul_bias_gelu", m, feeds, [True, True, True], "MatMulBiasGelu")
    check_pass("matmul_bias_gelu", m, feeds, [False, True, False], "MatMulBiasGelu")
    # inference: no pre-activation output, the GELU runs in place on the GEMM's result
    assert optimized_ops(m, None)[0] == ["MatMulBiasGelu"]
    y = run(m, feeds)[0][0]
    with _Disabled("matmul_bias_gelu"):
        y0 = run(m, feeds)[0][0]
    np.testing.assert_allclose(y, y0, rtol=1e-5, atol=1e-6)


# ---- matmul_grad_gelu (the joint graph) --------------------------------------------------------

def executed_ops(m, grad_flags):
    eng = _C.Engine(m, grad_flags)
    g = onnx.load_from_string(eng.export_onnx("execution"))
    joint = {p["pass"]: p["fired"] for p in json.loads(eng.report())["passes"] if p["stage"] == "joint"}
    return [n.op_type for n in g.graph.node], joint.get("matmul_grad_gelu", 0)


def mlp(approximate, transB, h_read_twice=False):
    """x -> Linear -> GELU -> Linear (+ the GELU's output read again by a second product)."""
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h1"]), helper.make_node("Add", ["h1", "b1"], ["a"]),
             helper.make_node("Gelu", ["a"], ["g"], approximate=approximate)]
    w2 = "w2"
    if transB:
        nodes.append(helper.make_node("Transpose", ["w2"], ["w2t"], perm=[1, 0]))
        w2 = "w2t"
    nodes += [helper.make_node("MatMul", ["g", w2], ["h2"]), helper.make_node("Add", ["h2", "b2"], ["y"])]
    outs = ["y"]
    if h_read_twice:
        nodes.append(helper.make_node("MatMul", ["g", w2], ["y2"]))
        outs.append("y2")
    w2_shape = [5, 8] if transB else [8, 5]
    m = model(nodes, [("x", [2, 3, 4]), ("w1", [4, 8]), ("b1", [8]), ("w2", w2_shape), ("b2", [5])], outs)
    feeds = [rnd(2, 3, 4), rnd(4, 8), rnd(8), rnd(*w2_shape), rnd(5)]
    return m, feeds


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("transB", [0, 1])
@pytest.mark.parametrize("flags", [[True] * 5, [True, True, True, False, False], [False, True, True, False, True]])
def test_matmul_grad_gelu(approximate, transB, flags):
    """The backward's GeluGrad rides on the down projection's dx: gone from the executed graph,
    outputs and gradients as with the pass off."""
    m, feeds = mlp(approximate, transB)
    ops, fired = executed_ops(m, flags)
    assert fired == 1 and "GeluGrad" not in ops, ops
    with _Disabled("matmul_grad_gelu"):
        ops0, fired0 = executed_ops(m, flags)
        assert fired0 == 0 and "GeluGrad" in ops0, ops0
        outs0, grads0, _ = run(m, feeds, grad=flags)
    outs, grads, _ = run(m, feeds, grad=flags)
    for a, b in zip(outs, outs0):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for a, b, f in zip(grads, grads0, flags):
        if f:
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)


def test_matmul_grad_gelu_leaves_a_summed_gradient_alone():
    """The GELU's output read by two products: its gradient is a sum, no product's dx alone."""
    m, feeds = mlp("tanh", 0, h_read_twice=True)
    ops, fired = executed_ops(m, [True] * 5)
    assert fired == 0 and "GeluGrad" in ops, ops


def test_matmul_bias_gelu_preactivation_read_elsewhere_left_alone():
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Add", ["h", "b"], ["a"]),
             helper.make_node("Gelu", ["a"], ["y"]), helper.make_node("Mul", ["a", "y"], ["o"])]
    m = model(nodes, [("x", [5, 4]), ("w", [4, 6]), ("b", [6])], ["o"])
    check_pass("matmul_bias_gelu", m, [rnd(5, 4), rnd(4, 6), rnd(6)], [True, True, True], "MatMulBiasGelu",
               fires=False)


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_matmul_bias_gelu_torch_linear_gelu(approximate):
    """nn.Linear + nn.GELU + nn.Linear as torch exports it: the first Linear and the GELU fuse;
    outputs and every gradient match the graph with the pass off."""
    torch = pytest.importorskip("torch")
    import io
    net = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.GELU(approximate=approximate), torch.nn.Linear(16, 3))
    x = torch.randn(2, 5, 6)
    names = ["x"] + [n for n, _ in net.named_parameters()]
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(net, (x,), f, dynamo=False, training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, export_params=False, keep_initializers_as_inputs=True,
                          opset_version=20, input_names=names, dynamic_axes={"x": {0: "b", 1: "t"}})
    m = f.getvalue()
    feeds = [x.numpy()] + [p.detach().numpy() for _, p in net.named_parameters()]
    flags = [True] * len(feeds)
    ops, _ = optimized_ops(m, flags)
    assert ops.count("MatMulBiasGelu") == 1 and "Gelu" not in ops and "BiasGelu" not in ops, ops
    outs, grads = check_pass("matmul_bias_gelu", m, feeds, flags, "MatMulBiasGelu", rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(outs[0], net(x).detach().numpy(), rtol=1e-5, atol=1e-5)


# ---- bias_dropout_residual ---------------------------------------------------------------

def dropout_nodes(x, y, ratio, training=True):
    return [const(f"{y}_ratio", ratio), const(f"{y}_train", training, np.bool_),
            helper.make_node("Dropout", [x, f"{y}_ratio", f"{y}_train"], [y, f"{y}_mask"])]


@pytest.mark.parametrize("bias,residual", [(True, True), (False, True), (True, False)])
def test_bias_dropout_residual(bias, residual):
    nodes, inputs, feeds = [], [("x", [2, 3, 8])], [rnd(2, 3, 8)]
    h = "x"
    if bias:
        nodes.append(helper.make_node("Add", ["x", "b"], ["h"]))
        inputs.append(("b", [8]))
        feeds.append(rnd(8))
        h = "h"
    nodes += dropout_nodes(h, "d", 0.0)
    out = "d"
    if residual:
        nodes.append(helper.make_node("Add", ["r", "d"], ["y"]))
        inputs.append(("r", [2, 3, 8]))
        feeds.append(rnd(2, 3, 8))
        out = "y"
    m = model(nodes, inputs, [out])
    check_pass("bias_dropout_residual", m, feeds, [True] * len(feeds), "BiasDropout")


def test_bias_dropout_residual_with_dropout_matches_its_own_mask():
    # with p > 0 the random streams of fused and unfused differ (the seed is per node);
    # check the fused result against its own mask instead: y = mask * (x + b) / (1 - p) + r
    nodes = [helper.make_node("Add", ["x", "b"], ["h"])] + dropout_nodes("h", "d", 0.25)
    nodes.append(helper.make_node("Add", ["d", "r"], ["y"]))
    m = model(nodes, [("x", [4, 64]), ("b", [64]), ("r", [4, 64])], ["y"])
    ops, _ = optimized_ops(m, [True, True, True])
    assert ops == ["BiasDropout"]
    x, b, r = rnd(4, 64), rnd(64), rnd(4, 64)
    (y,), grads, (dy,) = run(m, [x, b, r], grad=[True, True, True])
    kept = y - r != 0
    assert 0.5 < kept.mean() < 0.95
    np.testing.assert_allclose(y, np.where(kept, (x + b) / 0.75, 0) + r, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads[0], np.where(kept, dy / 0.75, 0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(grads[1], np.where(kept, dy / 0.75, 0).sum(0), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(grads[2], dy)


def test_dropout_mask_read_by_model_left_alone():
    nodes = [helper.make_node("Add", ["x", "b"], ["h"])] + dropout_nodes("h", "d", 0.0)
    nodes.append(helper.make_node("Cast", ["d_mask"], ["mf"], to=F32))
    nodes.append(helper.make_node("Add", ["d", "mf"], ["y"]))
    m = model(nodes, [("x", [2, 8]), ("b", [8])], ["y"])
    check_pass("bias_dropout_residual", m, [rnd(2, 8), rnd(8)], [True, True], "BiasDropout", fires=False)


# ---- batch_norm_relu -----------------------------------------------------------------------

def bn_relu_model(shape, training=True, dtype=F32, y_read_twice=False, momentum=0.9):
    """BatchNormalization -> Relu; outputs the Relu's y and, in training, the running statistics."""
    attrs = {"epsilon": 1e-5}
    if training:
        attrs.update(training_mode=1, momentum=momentum)
    outs = ["h", "rm", "rv"] if training else ["h"]
    nodes = [helper.make_node("BatchNormalization", ["x", "s", "b", "m", "v"], outs, **attrs),
             helper.make_node("Relu", ["h"], ["y"])]
    graph_outs = ["y"] + outs[1:]
    if y_read_twice:
        nodes.append(helper.make_node("Neg", ["h"], ["hn"]))
        graph_outs.append("hn")
    C = shape[1]
    return model(nodes, [("x", shape, dtype)] + [(n, [C], dtype) for n in "sbmv"], graph_outs)


def bn_relu_feeds(shape, np_dtype=np.float32, nan=False):
    C = shape[1]
    x = (rng.standard_normal(shape) * 2 + 0.5).astype(np_dtype)
    s, b = rnd(C).astype(np_dtype), rnd(C).astype(np_dtype)
    m, v = rnd(C).astype(np_dtype), (np.abs(rnd(C)) + 0.5).astype(np_dtype)
    if C > 2:
        s[2] = 0           # y = b exactly over the channel: the mask at its edge
        b[2] = -0.0
    if C > 1:
        b[1] = 0.0         # channel 1 normalized around 0: about half its y are masked
        s[1] = 1.0
    if nan:
        x.flat[1] = np.nan                 # channel 0 becomes NaN: Relu keeps it, its gradient passes
        b[C - 1] = np.nan
    return [x, s, b, m, v]


def same_bits(a, b, what):
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    assert a.dtype == b.dtype and a.shape == b.shape, what
    bad = a.view(np.uint8).reshape(-1, a.itemsize) != b.view(np.uint8).reshape(-1, b.itemsize)
    assert not bad.any(), f"{what}: {bad.any(1).sum()} elements differ (first fused/unfused: " \
        f"{a.flat[np.argmax(bad.any(1))]!r} / {b.flat[np.argmax(bad.any(1))]!r})"


def check_bn_relu(m, feeds, flags, fires=True):
    """The fused and the unfused graph (pass off) give the same outputs (y, running statistics)
    and gradients bit for bit; the fused one runs BatchNormRelu and BatchNormReluGrad and no
    ReluGrad."""
    ops, report = optimized_ops(m, flags)
    fired = [p["fired"] for p in report["passes"] if p["pass"] == "batch_norm_relu"]
    if not fires:
        assert "BatchNormRelu" not in ops and fired == [0], ops
        return
    assert ops == ["BatchNormRelu"] and fired == [1], ops
    executed, _ = executed_ops(m, flags)
    if any(flags):
        assert "BatchNormReluGrad" in executed and "ReluGrad" not in executed, executed
    outs, grads, dys = run(m, feeds, grad=flags)
    with _Disabled("batch_norm_relu"):
        ops_off, _ = optimized_ops(m, flags)
        assert ops_off == ["BatchNormalization", "Relu"], ops_off
        outs0, grads0, _ = run(m, feeds, grad=flags)
    assert len(outs) == len(outs0)
    for i, (a, b) in enumerate(zip(outs, outs0)):
        same_bits(a, b, f"output {i}")
    for i, (a, b, f) in enumerate(zip(grads, grads0, flags)):
        if f:
            assert a is not None and b is not None
            same_bits(a, b, f"gradient {i}")
    return outs, grads, dys


@pytest.mark.parametrize("shape", [(3, 5, 7, 3), (5, 3), (2, 3, 17), (4, 6, 33), (1, 4, 1, 1), (2, 3, 4, 4, 3)])
def test_batch_norm_relu_training_bit_exact(shape):
    check_bn_relu(bn_relu_model(shape), bn_relu_feeds(shape), [True, True, True, False, False])


def test_batch_norm_relu_nan_propagates_as_relu_and_relu_grad():
    shape = (3, 4, 5, 7)
    outs, grads, dys = check_bn_relu(bn_relu_model(shape), bn_relu_feeds(shape, nan=True),
                                     [True, True, True, False, False])
    y = outs[0]
    assert np.isnan(y[:, 0]).all() and np.isnan(y[:, 3]).all()       # NaN mean; NaN bias
    assert not np.isnan(y[:, 1]).any() and (y[:, 1] == 0).any() and (y[:, 1] > 0).any()
    assert np.isnan(grads[0][:, 0]).all()
    # a NaN y passes its dy (threshold_backward): channel 3's bias gradient is all of dy's sum
    np.testing.assert_allclose(grads[2][3], dys[0][:, 3].sum(), rtol=1e-5)
    assert abs(grads[2][1] - dys[0][:, 1].sum()) > 1e-3                # channel 1 is masked


@pytest.mark.parametrize("flags", [[True, False, False, False, False], [False, True, True, False, False],
                                   [False, False, True, False, False]])
def test_batch_norm_relu_some_grads(flags):
    shape = (4, 3, 6, 5)
    check_bn_relu(bn_relu_model(shape), bn_relu_feeds(shape), flags)


def test_batch_norm_relu_inference_mode():
    shape = (4, 3, 6, 5)
    check_bn_relu(bn_relu_model(shape, training=False), bn_relu_feeds(shape), [True, True, True, False, False])


def test_batch_norm_relu_float64():
    shape = (3, 5, 9)
    check_bn_relu(bn_relu_model(shape, dtype=TensorProto.DOUBLE), bn_relu_feeds(shape, np.float64, nan=True),
                  [True, True, True, False, False])


def test_batch_norm_relu_float16_keeps_relus_negative_zero():
    """On the CPU a half node runs on fp32 twins and rounds once; the unfused Relu sees the rounded
    Y, where a tiny negative value is -0 and stays -0. The fused kernel must keep it too."""
    shape = (4, 3, 5, 6)
    feeds = bn_relu_feeds(shape, np.float16)
    feeds[1][1] = np.float16(1e-7)      # channel 1: |y| ~ 1e-7 around bias 0: many round to -0 in fp16
    feeds[2][1] = np.float16(0)
    outs, _, _ = check_bn_relu(bn_relu_model(shape, dtype=TensorProto.FLOAT16), feeds,
                               [True, True, True, False, False])
    y1 = outs[0][:, 1]
    assert (np.signbit(y1) & (y1 == 0)).any(), "no -0 in the case meant to produce some"


def test_batch_norm_relu_y_read_elsewhere_left_alone():
    shape = (2, 3, 4)
    check_bn_relu(bn_relu_model(shape, y_read_twice=True), bn_relu_feeds(shape), [True, True, True, False, False],
                  fires=False)


# ---- layer_norm ----------------------------------------------------------------------------

def layer_norm_nodes(x, y, square="pow", bias=True):
    nodes = [const("ax", [-1], np.int64), const("two", 2.0), const("eps", 1e-5),
             helper.make_node("ReduceMean", [x, "ax"], ["mu"]),
             helper.make_node("Sub", [x, "mu"], ["d"])]
    if square == "pow":
        nodes.append(helper.make_node("Pow", ["d", "two"], ["d2"]))
    else:
        nodes.append(helper.make_node("Mul", ["d", "d"], ["d2"]))
    nodes += [helper.make_node("ReduceMean", ["d2", "ax"], ["var"]),
              helper.make_node("Add", ["var", "eps"], ["ve"]),
              helper.make_node("Sqrt", ["ve"], ["sd"]),
              helper.make_node("Div", ["d", "sd"], ["n"]),
              helper.make_node("Mul", ["n", "scale"], ["ns" if bias else y])]
    if bias:
        nodes.append(helper.make_node("Add", ["ns", "bias"], [y]))
    return nodes


@pytest.mark.parametrize("square", ["pow", "mul"])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm(square, bias):
    inputs = [("x", [2, 3, 16]), ("scale", [16])] + ([("bias", [16])] if bias else [])
    feeds = [rnd(2, 3, 16) + 1, rnd(16), rnd(16)][: len(inputs)]
    m = model(layer_norm_nodes("x", "y", square, bias), inputs, ["y"])
    ops, _ = optimized_ops(m, [True] * len(feeds))
    assert ops == ["LayerNormalization"], ops
    check_pass("layer_norm", m, feeds, [True] * len(feeds), "LayerNormalization", rtol=1e-4, atol=1e-5)


def test_layer_norm_wrong_axis_left_alone():
    nodes = layer_norm_nodes("x", "y")
    nodes[0] = const("ax", [1], np.int64)
    m = model(nodes, [("x", [2, 3, 16]), ("scale", [16]), ("bias", [16])], ["y"])
    check_pass("layer_norm", m, [rnd(2, 3, 16), rnd(16), rnd(16)], [True] * 3, "LayerNormalization", fires=False)


@pytest.mark.parametrize("form", ["div", "reciprocal", "one_over", "one_over_cast"])
def test_rms_norm(form):
    # one_over: torch.rsqrt as torch.onnx writes it (Div(1, Sqrt)), the benchmark Llama's RMSNorm;
    # one_over_cast: transformers' (x.float() ... .to(input_dtype)), whose Casts are no-ops in fp32
    nodes = [const("ax", [-1], np.int64), const("two", 2.0), const("eps", 1e-6),
             helper.make_node("Pow", ["x", "two"], ["x2"]),
             helper.make_node("ReduceMean", ["x2", "ax"], ["ms"]),
             helper.make_node("Add", ["ms", "eps"], ["mse"]),
             helper.make_node("Sqrt", ["mse"], ["rms"])]
    if form == "div":
        nodes.append(helper.make_node("Div", ["x", "rms"], ["n"]))
    elif form == "reciprocal":
        nodes += [helper.make_node("Reciprocal", ["rms"], ["inv"]), helper.make_node("Mul", ["x", "inv"], ["n"])]
    else:
        nodes += [const("one", 1.0), helper.make_node("Div", ["one", "rms"], ["inv"]),
                  helper.make_node("Mul", ["x", "inv"], ["n"])]
    if form == "one_over_cast":
        nodes[-1] = helper.make_node("Mul", ["x", "inv"], ["n0"])
        nodes.append(helper.make_node("Cast", ["n0"], ["n"], to=TensorProto.FLOAT))
    nodes.append(helper.make_node("Mul", ["scale", "n"], ["y"]))
    m = model(nodes, [("x", [2, 3, 16]), ("scale", [16])], ["y"])
    ops, _ = optimized_ops(m, [True, True])
    assert ops == ["SimplifiedLayerNormalization"], ops
    check_pass("layer_norm", m, [rnd(2, 3, 16), rnd(16)], [True, True], "SimplifiedLayerNormalization",
               rtol=1e-4, atol=1e-5)


def test_rms_norm_one_over_left_alone_unless_one():
    # 2 / Sqrt(...) is not a reciprocal; a Cast that changes the dtype is not a no-op
    nodes = [const("ax", [-1], np.int64), const("two", 2.0), const("eps", 1e-6),
             helper.make_node("Pow", ["x", "two"], ["x2"]), helper.make_node("ReduceMean", ["x2", "ax"], ["ms"]),
             helper.make_node("Add", ["ms", "eps"], ["mse"]), helper.make_node("Sqrt", ["mse"], ["rms"]),
             helper.make_node("Div", ["two", "rms"], ["inv"]), helper.make_node("Mul", ["x", "inv"], ["n"]),
             helper.make_node("Mul", ["scale", "n"], ["y"])]
    m = model(nodes, [("x", [2, 3, 16]), ("scale", [16])], ["y"])
    check_pass("layer_norm", m, [rnd(2, 3, 16), rnd(16)], [True, True], "SimplifiedLayerNormalization", fires=False)


# ---- attention ---------------------------------------------------------------------------

def attention_nodes(scale_mode="post_mul", mask=None, dropout=None, k_transposed=False, cast=False):
    nodes = []
    k = "k"
    if not k_transposed:
        nodes.append(helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]))
        k = "kt"
    q = "q"
    if scale_mode == "split":      # SDPA: sqrt(scale) on Q and on K^T
        nodes += [const("sq", 0.125 ** 0.5), helper.make_node("Mul", ["q", "sq"], ["qs"]),
                  helper.make_node("Mul", [k, "sq"], ["ks"])]
        q, k = "qs", "ks"
    nodes.append(helper.make_node("MatMul", [q, k], ["s"]))
    s = "s"
    if scale_mode == "post_mul":
        nodes += [const("sc", 0.125), helper.make_node("Mul", ["s", "sc"], ["s1"])]
        s = "s1"
    elif scale_mode == "post_div":
        nodes += [const("sc", 8.0), helper.make_node("Div", ["s", "sc"], ["s1"])]
        s = "s1"
    if mask is not None:
        nodes.append(helper.make_node("Add", [s, mask], ["s2"]))
        s = "s2"
    nodes.append(helper.make_node("Softmax", [s], ["p"], axis=-1))
    p = "p"
    if cast:
        nodes.append(helper.make_node("Cast", ["p"], ["pc"], to=F32))
        p = "pc"
    if dropout is not None:
        nodes += dropout_nodes(p, "pd", dropout)
        p = "pd"
    nodes.append(helper.make_node("MatMul", [p, "v"], ["o"]))
    return nodes


B, H, L, S, D = 2, 3, 5, 7, 4


def qkv(k_transposed=False, L=L, S=S):
    return [rnd(B, H, L, D), rnd(B, H, D, S) if k_transposed else rnd(B, H, S, D), rnd(B, H, S, D)]


@pytest.mark.parametrize("scale_mode", ["post_mul", "post_div", "split", "none"])
def test_attention_scales(scale_mode):
    m = model(attention_nodes(scale_mode), [("q", [B, H, L, D]), ("k", [B, H, S, D]), ("v", [B, H, S, D])], ["o"])
    ops, _ = optimized_ops(m, [True] * 3)
    assert ops == ["FusedAttention"], ops
    check_pass("attention", m, qkv(), [True] * 3, "FusedAttention")


def test_attention_gpt2_eager_form_with_mask_cast_dropout0_and_mask_grad():
    nodes = attention_nodes("post_mul", mask="mask", dropout=0.0, cast=True)
    m = model(nodes, [("q", [B, H, L, D]), ("k", [B, H, S, D]), ("v", [B, H, S, D]), ("mask", [B, 1, L, S])], ["o"])
    mask = np.where(rng.random((B, 1, L, S)) < 0.3, -1e4, 0).astype(np.float32) + rnd(B, 1, L, S, scale=0.1)
    check_pass("attention", m, qkv() + [mask], [True] * 4, "FusedAttention", rtol=1e-4, atol=1e-5)


def test_attention_k_already_transposed_long_keys():
    # more keys than one tile, so the online softmax rescales across tiles
    Sl = 300
    m = model(attention_nodes("post_mul", k_transposed=True), [("q", [B, H, L, D]), ("k", [B, H, D, Sl]),
                                                              ("v", [B, H, Sl, D])], ["o"])
    check_pass("attention", m, qkv(True, S=Sl), [True] * 3, "FusedAttention", rtol=1e-4, atol=1e-5)


def test_attention_mask_broadcast_over_rows():
    nodes = attention_nodes("post_mul", mask="mask")
    m = model(nodes, [("q", [B, H, L, D]), ("k", [B, H, S, D]), ("v", [B, H, S, D]), ("mask", [B, 1, 1, S])], ["o"])
    check_pass("attention", m, qkv() + [rnd(B, 1, 1, S)], [True] * 4, "FusedAttention", rtol=1e-4, atol=1e-5)


def test_attention_softmax_read_elsewhere_left_alone():
    nodes = attention_nodes("post_mul")
    nodes.append(helper.make_node("ReduceSum", ["p"], ["ps"], keepdims=0))
    m = model(nodes, [("q", [B, H, L, D]), ("k", [B, H, S, D]), ("v", [B, H, S, D])], ["o", "ps"])
    check_pass("attention", m, qkv(), [True] * 3, "FusedAttention", fires=False)


def test_attention_dropout_matches_dropout_semantics():
    # p > 0: the fused kernel must be a valid dropout of the probabilities; check the
    # expectation-free identity: with ratio 0.5, the output equals P_dropped @ V where the
    # kept set is recovered from a one-hot V
    Sd = 6
    nodes = attention_nodes("post_mul", dropout=0.5)
    m = model(nodes, [("q", [1, 1, 4, D]), ("k", [1, 1, Sd, D]), ("v", [1, 1, Sd, Sd])], ["o"])
    assert optimized_ops(m, [True] * 3)[0] == ["FusedAttention"]
    q, k = rnd(1, 1, 4, D), rnd(1, 1, Sd, D)
    v = np.eye(Sd, dtype=np.float32).reshape(1, 1, Sd, Sd)
    (o,), grads, (do,) = run(m, [q, k, v], grad=[True, True, True])
    s = (q @ k.transpose(0, 1, 3, 2)) * 0.125
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    kept = o != 0
    assert 0 < kept.mean() < 1
    np.testing.assert_allclose(o, np.where(kept, p * 2, 0), rtol=1e-5, atol=1e-6)
    # dV = P_dropped^T dO
    np.testing.assert_allclose(grads[2], np.swapaxes(np.where(kept, p * 2, 0), -1, -2) @ do, rtol=1e-5, atol=1e-6)


def _export_sdpa(causal, mask):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    class M(torch.nn.Module):
        def forward(self, q, k, v, *m):
            return F.scaled_dot_product_attention(q, k, v, attn_mask=m[0] if m else None, is_causal=causal)

    args = [torch.randn(B, H, L, D), torch.randn(B, H, S if not causal else L, D),
            torch.randn(B, H, S if not causal else L, D)]
    names = ["q", "k", "v"]
    if mask:
        args.append(torch.randn(B, 1, L, S))
        names.append("m")
    import io
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(M(), tuple(args), f, dynamo=False, training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, export_params=False, keep_initializers_as_inputs=True,
                          opset_version=20, input_names=names,
                          dynamic_axes={n: {d: f"{n}{d}" for d in range(a.dim())} for n, a in zip(names, args)})
    return f.getvalue(), [a.numpy() for a in args]


@pytest.mark.parametrize("causal,mask", [(True, False), (False, True), (False, False)])
def test_attention_torch_sdpa_export(causal, mask):
    m, feeds = _export_sdpa(causal, mask)
    ops, _ = optimized_ops(m, [True] * len(feeds))
    assert "FusedAttention" in ops and "Softmax" not in ops and "MatMul" not in ops, ops
    if causal:
        assert "Trilu" not in ops and "Where" not in ops, ops   # the causal mask is never built
    outs, grads = check_pass("attention", m, feeds, [True] * len(feeds), "FusedAttention", rtol=1e-4, atol=1e-5)
    # against a numpy reference too
    q, k, v = feeds[:3]
    s = q @ np.swapaxes(k, -1, -2) / np.sqrt(D)
    if mask:
        s = s + feeds[3]
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], dtype=bool)), s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    np.testing.assert_allclose(outs[0], p @ v, rtol=1e-4, atol=1e-5)


# ---- a transformer block: every pass on, each off ------------------------------------------

def test_gpt2_tiny_node_count_and_parity_each_pass_off():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    import io

    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    cfg._attn_implementation = "eager"
    gm = transformers.GPT2LMHeadModel(cfg).train()

    class W(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, ids, am, labels):
            return self.m(input_ids=ids, attention_mask=am, labels=labels).loss

    ids = torch.randint(0, 256, (2, 16))
    am = torch.ones(2, 16, dtype=torch.long)
    am[1, 12:] = 0
    names = ["ids", "am", "labels"]
    f = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(W(gm), (ids, am, ids), f, dynamo=False, training=torch.onnx.TrainingMode.TRAINING,
                          do_constant_folding=False, export_params=False, keep_initializers_as_inputs=True,
                          opset_version=20, input_names=names,
                          dynamic_axes={n: {0: "b", 1: "t"} for n in names})
    m = f.getvalue()
    mp = onnx.load_from_string(m)
    params = dict(gm.named_parameters())
    feeds, flags = [], []
    for gi in mp.graph.input:
        if gi.name == "ids" or gi.name == "labels":
            feeds.append(ids.numpy()); flags.append(False)
        elif gi.name == "am":
            feeds.append(am.numpy()); flags.append(False)
        else:
            feeds.append(params[gi.name[2:]].detach().numpy())
            flags.append(True)
    eng = _C.Engine(m, flags)
    r = json.loads(eng.report())
    fired = {p["pass"]: p["fired"] for p in r["passes"] if p["stage"] == "forward"}
    assert fired.get("attention") == 2 and fired.get("gelu") == 2, fired
    assert fired.get("bias_dropout_residual", 0) >= 4, fired
    assert r["optimized_nodes"] <= 0.7 * r["exported_nodes"], (r["exported_nodes"], r["optimized_nodes"])
    joint = {p["pass"]: p["fired"] for p in r["passes"] if p["stage"] == "joint"}
    assert joint.get("matmul_grad_gelu") == 2, joint   # each MLP's GeluGrad rides on its down projection
    (loss,), grads, _ = run(m, feeds, grad=flags)
    with torch.no_grad():
        ref = gm(input_ids=ids, attention_mask=am, labels=ids).loss.item()
    np.testing.assert_allclose(loss, ref, rtol=1e-4)
    for p in ["gelu", "attention", "bias_dropout_residual", "matmul_add_bias", "bias_gelu", "layer_norm",
              "softmax_cross_entropy", "matmul_grad_gelu"]:
        with _Disabled(p):
            (loss0,), grads0, _ = run(m, feeds, grad=flags)
        np.testing.assert_allclose(loss0, loss, rtol=1e-5)
        for a, b in zip(grads, grads0):
            if a is not None:
                np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-6, err_msg=p)
