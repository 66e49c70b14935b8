"""ortmod/capture/onnx_wire.py: what the TorchScript capture reads from an exported model's bytes without the
onnx package, checked field by field against onnx's own parser, and the first call that no longer
imports onnx at all."""
import os
import subprocess
import sys

import onnx
import pytest
import torch
from onnx import TensorProto, helper

from ortmod.capture import torchscript, onnx_wire

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _model():
    """Inputs typed and untyped, an initializer, INT (negative, and past field 15), float, string,
    tensor and graph attributes, an If whose branches read an outer value, names past ASCII."""
    then_g = helper.make_graph([helper.make_node("Identity", ["x"], ["t_out"], name="then_id")], "then", [],
                               [helper.make_tensor_value_info("t_out", TensorProto.FLOAT, None)])
    else_g = helper.make_graph([helper.make_node("Neg", ["w\u00e9"], ["e_out"])], "else", [],
                               [helper.make_tensor_value_info("e_out", TensorProto.FLOAT, None)])
    nodes = [
        helper.make_node("Gemm", ["x", "w\u00e9", "b"], ["y"], name="gemm", alpha=0.5, transB=1),
        helper.make_node("ReduceSum", ["y"], ["s"], keepdims=-3, name="r"),
        helper.make_node("Constant", [], ["c"], value=helper.make_tensor("v", TensorProto.FLOAT, [2], [1.0, 2.0])),
        helper.make_node("Cast", ["c"], ["cond"], to=TensorProto.BOOL),
        helper.make_node("If", ["cond"], ["z"], then_branch=then_g, else_branch=else_g, name="if"),
        helper.make_node("StopGradient", ["z"], ["sg"], domain="ortmod", note="text"),
        helper.make_node("BatchNormalization", ["x", "b", "b", "b", "b"], ["bn", "", "rv"], training_mode=1),
    ]
    graph = helper.make_graph(
        nodes, "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 4]),
         helper.make_tensor_value_info("w\u00e9", TensorProto.DOUBLE, [3, 4]),
         helper.make_value_info("b", onnx.TypeProto())],
        [helper.make_tensor_value_info("s", TensorProto.INT64, []),
         helper.make_tensor_value_info("sg", TensorProto.UNDEFINED, None)],
        initializer=[helper.make_tensor("b", TensorProto.FLOAT, [3], [0.0, 1.0, 2.0])])
    graph.value_info.append(helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3]))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("ortmod", 1)])


def _same_graph(ours, theirs):
    assert [(v.name, v.elem_type) for v in ours.input] == [(v.name, v.type.tensor_type.elem_type)
                                                           for v in theirs.input]
    assert [(v.name, v.elem_type) for v in ours.output] == [(v.name, v.type.tensor_type.elem_type)
                                                            for v in theirs.output]
    assert ours.initializer == [t.name for t in theirs.initializer]
    assert len(ours.node) == len(theirs.node)
    for a, b in zip(ours.node, theirs.node):
        assert (a.op_type, a.domain, a.name, a.input, a.output) == (b.op_type, b.domain, b.name,
                                                                    tuple(b.input), tuple(b.output))
        assert a.ints == {x.name: x.i for x in b.attribute if x.type == onnx.AttributeProto.INT}
        subs = [x.g for x in b.attribute if x.HasField("g")] + [g for x in b.attribute for g in x.graphs]
        assert len(a.subgraphs) == len(subs)
        for sa, sb in zip(a.subgraphs, subs):
            _same_graph(sa, sb)


def test_reads_what_onnx_reads():
    proto = _model()
    model = onnx_wire.parse_model(proto.SerializeToString())
    _same_graph(model.graph, proto.graph)
    assert model.graph.node[1].ints == {"keepdims": -3}
    assert [len(n.subgraphs) for n in model.graph.node] == [0, 0, 0, 0, 2, 0, 0]


def test_output_dependencies_agree_between_the_reader_and_onnx():
    proto = _model()
    model = onnx_wire.parse_model(proto.SerializeToString())
    deps = torchscript._output_dependencies(model)
    assert deps == torchscript._output_dependencies(proto)
    # sg reaches nothing (a StopGradient); s depends on x, w and b through Gemm
    assert deps == [frozenset({"x", "w\u00e9", "b"}), frozenset()]


def test_added_outputs_are_what_onnx_helper_would_add():
    proto = _model()
    model = onnx_wire.parse_model(proto.SerializeToString())
    data = model.with_outputs([("rv", TensorProto.FLOAT, ["rv_dim0"]), ("y", TensorProto.DOUBLE, ["a", "b"])])
    want = _model()
    want.graph.output.append(helper.make_tensor_value_info("rv", TensorProto.FLOAT, ["rv_dim0"]))
    want.graph.output.append(helper.make_tensor_value_info("y", TensorProto.DOUBLE, ["a", "b"]))
    got = onnx.load_from_string(data)
    assert got == want
    _same_graph(onnx_wire.parse_model(data).graph, want.graph)


def test_a_long_graph_field_keeps_its_length_right():
    # a graph past 127 and 16383 bytes: its length takes two and three varint bytes
    for n in (20, 2000):
        nodes = [helper.make_node("Relu", [f"v{i}"], [f"v{i + 1}"], name=f"relu_{i}") for i in range(n)]
        g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("v0", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info(f"v{n}", TensorProto.FLOAT, [2])])
        proto = helper.make_model(g)
        data = onnx_wire.parse_model(proto.SerializeToString()).with_outputs([("v1", TensorProto.FLOAT, ["d"])])
        got = onnx.load_from_string(data)
        assert [o.name for o in got.graph.output] == [f"v{n}", "v1"]
        assert len(got.graph.node) == n


@pytest.mark.parametrize("cut", [1, 5, -1, -7])
def test_truncated_bytes_are_an_error(cut):
    data = _model().SerializeToString()
    with pytest.raises(ValueError):
        onnx_wire.parse_model(data[:cut] if cut > 0 else data[:len(data) + cut])


def test_two_graph_fields_are_refused_not_merged():
    data = _model().SerializeToString()
    extra = helper.make_model(helper.make_graph([], "h", [], [])).graph.SerializeToString()
    with pytest.raises(ValueError, match="graph fields"):
        onnx_wire.parse_model(data + b"\x3a" + bytes([len(extra)]) + extra)


def test_data_type_names_are_onnx_s():
    values = set(TensorProto.DataType.values())
    for value in range(len(onnx_wire.DATA_TYPE_NAMES)):    # an older onnx may know fewer
        if value in values:
            assert onnx_wire.data_type_name(value) == TensorProto.DataType.Name(value)
    assert {TensorProto.FLOAT, TensorProto.BFLOAT16, TensorProto.INT64} <= set(range(len(onnx_wire.DATA_TYPE_NAMES)))
    assert onnx_wire.data_type_name(1000) == "data type 1000"


def test_torch_s_onnxscript_step_still_runs_for_an_op_with_a_registered_function(monkeypatch):
    from torch.onnx._internal.torchscript_exporter import onnx_proto_utils, registration
    calls = []
    monkeypatch.setattr(onnx_proto_utils, "_add_onnxscript_fn", lambda b, opsets: calls.append(b) or b + b"")
    real = registration.registry.get_function_group
    monkeypatch.setattr(registration.registry, "get_function_group",
                        lambda name: object() if name == "custom::Foo" else real(name))
    plain = _model().SerializeToString()
    custom = _model()
    custom.graph.node[4].attribute[0].g.node.append(helper.make_node("Foo", ["x"], ["f"], domain="custom"))
    custom = custom.SerializeToString()
    parsed = {}
    with torchscript._onnxscript_functions_when_used(parsed):
        assert onnx_proto_utils._add_onnxscript_fn(plain, {}) == plain
        assert calls == [] and parsed["model"].data == plain      # nothing registered: torch's step skipped
        parsed.clear()
        onnx_proto_utils._add_onnxscript_fn(custom, {})
        assert calls == [custom] and "model" not in parsed          # inside an If branch: torch's step runs
    assert onnx_proto_utils._add_onnxscript_fn is not None
    assert calls == [custom]


_FIRST_CALL = r"""
import sys
import torch
import torch.nn as nn
from ortmod import DebugOptions, ORTModule
torch.manual_seed(0)
net = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.LazyLinear(2))
x = torch.randn(2, 3, 6, 6)
net(x)
ref = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(64, 2))
ref.load_state_dict(net.state_dict())
ort = ORTModule(net, DebugOptions(capture="torchscript")).train()
ort(x).square().sum().backward()
ref(x).square().sum().backward()
assert "onnx" not in sys.modules, "the first call imported onnx"
torch.testing.assert_close(net[1].running_var, ref[1].running_var)       # BatchNorm's added outputs
torch.testing.assert_close(net[0].weight.grad, ref[0].weight.grad, rtol=1e-4, atol=1e-5)
assert int(net[1].num_batches_tracked) == int(ref[1].num_batches_tracked) == 2   # net(x) counted one
print("ok")
"""


def test_the_torchscript_first_call_does_not_import_onnx():
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", _FIRST_CALL], capture_output=True, text=True, env=env, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]
