"""Attributes: the engine refuses, by name and at compile time, every ONNX attribute (and
attribute value) that the op does not implement, and accepts every attribute an exporter
writes at its ONNX default.

What each op implements is its `attrs` list in the op table (csrc/ops/op.h), listed here
through `_C.op_attributes()`. The tests check the lists against the ONNX schemas (opsets
13, the oldest the importer takes, up to the installed onnx's newest), refuse an unknown
attribute on every op of the table, refuse unimplemented values, and print (shown with
`pytest -rP`) the schema attributes each ONNX op does not implement.
"""
import os
import re
import subprocess
import warnings

import onnx
import pytest
from onnx import AttributeProto, TensorProto, defs, helper

import buildpaths

from ortmod import _C

TYPES = {"int": AttributeProto.INT, "float": AttributeProto.FLOAT, "string": AttributeProto.STRING,
         "ints": AttributeProto.INTS, "floats": AttributeProto.FLOATS, "tensor": AttributeProto.TENSOR,
         "strings": AttributeProto.STRINGS}
ENTRY = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*):(int|float|string|ints|floats|tensor|strings)(?:=([^ ]+))?$")
MIN_OPSET = 13   # the importer refuses older models
MAX_OPSET = defs.onnx_opset_version()
# attributes an op reads only in the form older opsets gave them (now inputs): the op table
# lists them because the engine implements them, the opset-13+ schemas no longer have them
LEGACY = {("Squeeze", "axes"): 11, ("Unsqueeze", "axes"): 11, ("ReduceSum", "axes"): 11,
          ("Split", "split"): 11}


def parse(attrs):
    """attrs list -> {name: (type, allowed values or None)}."""
    out = {}
    for entry in attrs.split():
        m = ENTRY.match(entry)
        assert m, f"malformed attrs entry {entry!r}"
        name, typ, vals = m.groups()
        assert name not in out, f"{name} listed twice"
        if vals is not None:
            # (strings: the values each element may take)
            assert typ in ("int", "float", "string", "strings"), f"{entry}: only int, float, string(s) take values"
            conv = {"int": int, "float": float, "string": str, "strings": str}[typ]
            vals = [conv(v) for v in vals.split("|")]
        out[name] = (typ, vals)
    return out


OPS = [(name, domain, parse(attrs)) for name, domain, attrs in _C.op_attributes()]
ONNX_OPS = [(n, a) for n, d, a in OPS if d == ""]


def schemas(op):
    """The op's schemas for every opset the importer takes: {since_version: schema}."""
    out = {}
    for v in range(MIN_OPSET, MAX_OPSET + 1):
        try:
            s = defs.get_schema(op, v, "")
        except defs.SchemaError:
            continue
        out[s.since_version] = s
    return out


def schema_attrs(op):
    """{attribute: [(since_version, ONNX type, default or None)]} over the op's schemas."""
    out = {}
    for since, s in sorted(schemas(op).items()):
        for name, a in s.attributes.items():
            d = a.default_value
            dflt = helper.get_attribute_value(d) if d is not None and d.name else None
            if isinstance(dflt, list):
                dflt = [v.decode() if isinstance(v, bytes) else v for v in dflt]
            out.setdefault(name, []).append((since, a.type, dflt.decode() if isinstance(dflt, bytes) else dflt))
    return out


def model(op, domain="", attrs=(), n_in=1, n_out=1, opset=20, node_name=None):
    """A one-node model of op with n_in float inputs; attrs are (name, value) pairs (or
    AttributeProtos), added as given (so a name may repeat)."""
    ins = [f"x{i}" for i in range(n_in)]
    outs = [f"y{j}" for j in range(n_out)]
    node = helper.make_node(op, ins, outs, name=node_name or f"the_{op}", domain=domain)
    for a in attrs:
        node.attribute.append(a if isinstance(a, AttributeProto) else helper.make_attribute(*a))
    graph = helper.make_graph([node], "one_op",
                              [helper.make_tensor_value_info(i, TensorProto.FLOAT, [2, 3, 4, 5]) for i in ins],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outs])
    opsets = [helper.make_opsetid("", opset)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(graph, opset_imports=opsets).SerializeToString()


ARITY = re.compile(r"expected (\d+)\.\.(\d+) and (\d+)\.\.(\d+)")
_arity_cache = {}


def arity(op, domain):
    """(inputs, outputs) the op takes at least (at least 1 output), from the importer's own
    arity error: the table keeps them, not the Python side."""
    key = (op, domain)
    if key not in _arity_cache:
        try:
            _C.Engine(model(op, domain, (), n_in=1, n_out=1), None)
            _arity_cache[key] = (1, 1)
        except (_C.InvalidInputError, _C.UnsupportedOpError, _C.EngineError) as e:
            m = ARITY.search(str(e))
            _arity_cache[key] = (int(m.group(1)), max(1, int(m.group(3)))) if m else (1, 1)
    return _arity_cache[key]


def compile_error(op, domain="", attrs=(), **kw):
    """The error compiling a one-node model of op gives, or None when it compiles."""
    n_in, n_out = arity(op, domain)
    kw.setdefault("n_in", n_in)
    kw.setdefault("n_out", n_out)
    try:
        _C.Engine(model(op, domain, attrs, **kw), None)
    except (_C.InvalidInputError, _C.UnsupportedOpError, _C.EngineError) as e:
        return e
    return None


def is_attribute_error(e):
    return e is not None and "attribute '" in str(e)


# ---- the lists themselves ------------------------------------------------------------------

def test_every_list_parses_and_names_real_schema_attributes_with_their_types():
    for op, attrs in ONNX_OPS:
        sa = schema_attrs(op)
        assert sa or not attrs or all((op, n) in LEGACY for n in attrs), op
        for name, (typ, _) in attrs.items():
            if (op, name) in LEGACY:
                old = defs.get_schema(op, LEGACY[op, name], "")
                assert name in old.attributes and old.attributes[name].type == TYPES[typ], (op, name)
                continue
            assert name in sa, f"{op} lists '{name}', which no ONNX schema of opset {MIN_OPSET}+ has"
            for since, t, _ in sa[name]:
                assert t == TYPES[typ], f"{op}.{name} is {typ} in the table, ONNX type {t} in opset {since}"


def test_every_schema_default_is_accepted():
    """Exporters write defaults explicitly: an attribute at its ONNX default (in any opset
    the importer takes) is one the op lists, with the default among its allowed values."""
    for op, attrs in ONNX_OPS:
        for name, versions in schema_attrs(op).items():
            for since, t, dflt in versions:
                if dflt is None:
                    continue
                assert name in attrs, f"{op}.{name} (default {dflt!r} in opset {since}) is not in the op's list"
                typ, vals = attrs[name]
                listed = all(v in vals for v in dflt) if vals is not None and typ == "strings" else \
                    vals is None or dflt in vals
                assert listed, f"{op}.{name}: ONNX default {dflt!r} not in {vals}"


# ---- (1) an unknown attribute, on every op of the table ------------------------------------

@pytest.mark.parametrize("op,domain", [(n, d) for n, d, _ in OPS], ids=[f"{d or 'onnx'}.{n}" for n, d, _ in OPS])
def test_unknown_attribute_is_refused_by_name(op, domain):
    e = compile_error(op, domain, [("ortmod_no_such_attribute", 1)])
    assert isinstance(e, _C.UnsupportedOpError), (op, e)
    assert f"node 'the_{op}' ({op}): attribute 'ortmod_no_such_attribute' is not implemented by ortmod" in str(e)


def test_com_microsoft_ops_are_checked_against_the_ortmod_lists():
    e = compile_error("FusedMatMul", "com.microsoft", [("transBatchA", 1)])
    assert isinstance(e, _C.UnsupportedOpError) and "attribute 'transBatchA' = 1" in str(e)
    assert not is_attribute_error(compile_error("FusedMatMul", "com.microsoft",
                                                [("alpha", 0.5), ("transBatchA", 0), ("transBatchB", 0)]))


# ---- (2) defaults accepted, unimplemented values refused -----------------------------------

def default_attrs(op):
    """Every schema attribute of op at its default (the newest opset's), as an exporter
    writing them all explicitly would."""
    out = []
    for name, versions in schema_attrs(op).items():
        dflt = versions[-1][2]
        if dflt is not None:
            out.append((name, dflt))
    return out


@pytest.mark.parametrize("op", [n for n, _ in ONNX_OPS if any(v[-1][2] is not None for v in schema_attrs(n).values())])
def test_all_defaults_written_explicitly_compile(op):
    assert not is_attribute_error(compile_error(op, "", default_attrs(op)))


REFUSED = [
    # (op, attributes, what the message says)
    ("LayerNormalization", [("stash_type", 11)], "attribute 'stash_type' = 11 is not implemented by ortmod (it implements 1)"),
    ("MaxPool", [("kernel_shape", [2, 2]), ("storage_order", 1)], "attribute 'storage_order' = 1"),
    ("MaxPool", [("kernel_shape", [2, 2]), ("auto_pad", "SAME")], "attribute 'auto_pad' = 'SAME'"),
    ("Conv", [("auto_pad", "")], "attribute 'auto_pad' = ''"),
    ("ConvTranspose", [("auto_pad", "SAME_UPPER")], "attribute 'auto_pad' = 'SAME_UPPER'"),
    ("ConvTranspose", [("output_shape", [4, 4])], "attribute 'output_shape' is not implemented"),
    ("Pad", [("mode", "symmetric")], "attribute 'mode' = 'symmetric'"),
    ("LSTM", [("hidden_size", 3), ("layout", 1)], "attribute 'layout' = 1"),
    ("LSTM", [("hidden_size", 3), ("input_forget", 1)], "attribute 'input_forget' = 1"),
    ("LSTM", [("hidden_size", 3), ("clip", 5.0)], "attribute 'clip' is not implemented"),
    ("LSTM", [("hidden_size", 3), ("activation_alpha", [1.0])], "attribute 'activation_alpha' is not implemented"),
    ("LSTM", [("hidden_size", 3), ("activations", ["Sigmoid", "Tanh", "Tanh"])],
     "attribute 'activations' is not implemented"),
    ("GRU", [("hidden_size", 3), ("direction", "sideways")], "attribute 'direction' = 'sideways'"),
    ("SoftmaxCrossEntropyLoss", [("reduction", "max")], "attribute 'reduction' = 'max'"),
    ("NegativeLogLikelihoodLoss", [("reduction", "")], "attribute 'reduction' = ''"),
    ("Gelu", [("approximate", "erf")], "attribute 'approximate' = 'erf'"),
    ("ScatterElements", [("reduction", "mul")], "attribute 'reduction' = 'mul'"),
    ("ScatterND", [("reduction", "max")], "attribute 'reduction' = 'max'"),
    ("Range", [("stash_type", 11)], "attribute 'stash_type' = 11"),
    ("Dropout", [("seed", 7)], "attribute 'seed' is not implemented"),
    ("Constant", [("value_string", "hi")], "attribute 'value_string' is not implemented"),
    ("Constant", [("value_strings", ["a", "b"])], "attribute 'value_strings' is not implemented"),
    ("Softplus", [("alpha", 2.0)], "attribute 'alpha' is not implemented"),      # Softplus has none
    ("LeakyRelu", [("beta", 2.0)], "attribute 'beta' is not implemented"),       # read by no LeakyRelu
    ("RNN", [("hidden_size", 3), ("activations", ["Tanh", "Sigmoid"])],
     "attribute 'activations' = [..., 'Sigmoid', ...] is not implemented by ortmod (it implements Tanh|Relu)"),
    ("RNN", [("hidden_size", 3), ("clip", 5.0)], "attribute 'clip' is not implemented"),
    ("RNN", [("hidden_size", 3), ("layout", 1)], "attribute 'layout' = 1"),
    ("RNN", [("hidden_size", 3), ("activation_alpha", [1.0])], "attribute 'activation_alpha' is not implemented"),
    ("GRU", [("hidden_size", 3), ("activations", ["Sigmoid", "Tanh"])], "attribute 'activations' is not implemented"),
]


@pytest.mark.parametrize("op,attrs,message", REFUSED, ids=[f"{o}.{a[-1][0]}" for o, a, _ in REFUSED])
def test_unimplemented_values_are_refused_by_name(op, attrs, message):
    e = compile_error(op, "", attrs)
    assert isinstance(e, _C.UnsupportedOpError), e
    assert f"node 'the_{op}' ({op}): " in str(e) and message in str(e), str(e)


@pytest.mark.parametrize("op,attrs", [
    ("Gemm", [("alpha", 1.0), ("beta", 1.0), ("transA", 0), ("transB", 1)]),
    ("Gemm", [("alpha", 0.5), ("beta", 2.0)]),            # implemented, not only at the default
    ("LayerNormalization", [("axis", -1), ("epsilon", 1e-5), ("stash_type", 1)]),
    ("MaxPool", [("kernel_shape", [2, 2]), ("storage_order", 0), ("auto_pad", "NOTSET"), ("ceil_mode", 1)]),
    ("LSTM", [("hidden_size", 3), ("layout", 0), ("input_forget", 0), ("direction", "bidirectional")]),
    ("Cast", [("to", 1), ("saturate", 1)]),
    ("Pad", [("mode", "wrap")]),
    ("ReduceMean", [("keepdims", 0), ("noop_with_empty_axes", 1)]),
])
def test_implemented_values_compile(op, attrs):
    assert not is_attribute_error(compile_error(op, "", attrs))


def test_wrong_type_and_repeated_attributes_are_invalid_models():
    e = compile_error("Gemm", "", [("alpha", 2)])          # an int where ONNX has a float
    assert isinstance(e, _C.InvalidInputError)
    assert "attribute 'alpha' is of type int, but Gemm's alpha is of type float" in str(e)
    e = compile_error("ConstantOfShape", "", [("value", 1.0)])   # silently 0 before: a tensor is expected
    assert isinstance(e, _C.InvalidInputError) and "is of type float" in str(e)
    e = compile_error("Softmax", "", [("axis", 1), ("axis", -1)])
    assert isinstance(e, _C.InvalidInputError) and "attribute 'axis' is given twice" in str(e)


def test_split_num_outputs_must_match_the_outputs():
    import numpy as np
    from oputil import make_model, run

    x = np.arange(10, dtype=np.float32)
    outs, _, _ = run(make_model("Split", {"x": x}, {"num_outputs": 3}, opset=18, n_outputs=3), [x])
    assert [o.tolist() for o in outs] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    with pytest.raises(_C.InvalidInputError, match="num_outputs is 2 but the node has 3 outputs"):
        run(make_model("Split", {"x": x}, {"num_outputs": 2}, opset=18, n_outputs=3), [x])


def test_missing_concat_axis_and_two_constant_values_are_refused():
    import numpy as np
    from oputil import make_model, run

    x = np.ones((2, 3), np.float32)
    with pytest.raises(_C.InvalidInputError, match="the axis attribute is missing"):   # was read as axis 0
        run(make_model("Concat", {"a": x, "b": x}), [x, x])
    m = make_model("Constant", {}, {"value_float": 1.0, "value_int": 2})
    with pytest.raises(_C.InvalidInputError, match="not 2 of them"):
        run(m, [])


# ---- the compiled graph: what passes and gradient rules set is in the lists ----------------

def test_compiled_graphs_are_checked_too():
    """om_engine_create checks the graph after the passes and autodiff against the same
    lists: every backward op the suite compiles carries only attributes its op lists (the
    model tests train GPT-2, BERT, CNNs, RNNs and rotary LLMs through it). Here: a few
    rules that emit attributes."""
    import numpy as np
    from oputil import make_model, run

    x = np.random.default_rng(0).standard_normal((2, 3, 8, 8)).astype(np.float32)
    w = np.random.default_rng(1).standard_normal((4, 3, 3, 3)).astype(np.float32)
    cases = [
        make_model("Conv", {"x": x, "w": w}, {"pads": [1, 1, 1, 1], "strides": [2, 2], "auto_pad": "NOTSET"}),
        make_model("AveragePool", {"x": x}, {"kernel_shape": [2, 2], "count_include_pad": 1, "ceil_mode": 1}),
        make_model("LeakyRelu", {"x": x}, {"alpha": 0.2}),
        make_model("Softmax", {"x": x}, {"axis": 1}),
        make_model("ReduceMean", {"x": x}, {"axes": [1], "keepdims": 0}, opset=17),
        make_model("Gelu", {"x": x}, {"approximate": "tanh"}),
    ]
    for m in cases:
        n_in = len(onnx.load_from_string(m).graph.input)
        run(m, [x, w][:n_in], grad=[True] * n_in)


# ---- the native runner goes through the same import ----------------------------------------

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_native_runner_refuses_the_attribute_by_name(tmp_path):
    import numpy as np
    import torch
    from ortmod.runner import write_shards

    r = buildpaths.build()
    assert r.returncode == 0, r.stdout + r.stderr
    path = tmp_path / "mlp.onnx"
    m = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.ReLU(), torch.nn.Linear(8, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(m, (torch.zeros(2, 6),), str(path), dynamo=False, input_names=["x"],
                          output_names=["logits"], dynamic_axes={"x": {0: "batch"}, "logits": {0: "batch"}},
                          opset_version=20)
    proto = onnx.load(str(path))
    gemm = next(n for n in proto.graph.node if n.op_type == "Gemm")
    gemm.attribute.append(helper.make_attribute("ortmod_no_such_attribute", 1))
    onnx.save(proto, str(path))
    rng = np.random.default_rng(0)
    write_shards(tmp_path / "train", {"x": rng.standard_normal((16, 6)).astype(np.float32),
                                      "labels": rng.integers(0, 3, 16).astype(np.int64)})
    r = subprocess.run([buildpaths.RUNNER, "--model", str(path), "--train_data_dir",
                        str(tmp_path / "train"), "--output_dir", str(tmp_path / "out"), "--num_train_steps", "1"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0
    assert f"node '{gemm.name}' (Gemm): attribute 'ortmod_no_such_attribute' is not implemented" in r.stderr, r.stderr


# ---- (4) the report: schema attributes each ONNX op does not implement ---------------------

# every value ONNX defines for the string attributes the table restricts (the schemas say it
# in prose only): a list naming them all refuses nothing ONNX means
ONNX_VALUES = {
    ("Gelu", "approximate"): ["none", "tanh"],
    ("SoftmaxCrossEntropyLoss", "reduction"): ["mean", "sum", "none"],
    ("NegativeLogLikelihoodLoss", "reduction"): ["mean", "sum", "none"],
    ("Pad", "mode"): ["constant", "reflect", "edge", "wrap"],
    ("ScatterElements", "reduction"): ["none", "add", "mul", "max", "min"],
    ("ScatterND", "reduction"): ["none", "add", "mul", "max", "min"],
    ("LSTM", "direction"): ["forward", "reverse", "bidirectional"],
    ("GRU", "direction"): ["forward", "reverse", "bidirectional"],
    **{(op, "auto_pad"): ["NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]
       for op in ("Conv", "ConvTranspose", "MaxPool", "AveragePool")},
}


def test_report_schema_attributes_not_implemented():
    """Prints, per ONNX op of the table, the attributes of its opset-13+ schemas that the
    engine refuses: not implemented at all, or only at some values."""
    lines = []
    for op, attrs in ONNX_OPS:
        missing, partial = [], []
        for name, versions in sorted(schema_attrs(op).items()):
            since = versions[0][0]
            where = f" (opset {since}+)" if since > MIN_OPSET else ""
            if name not in attrs:
                missing.append(name + where)
            elif attrs[name][1] is not None:
                vals = attrs[name][1]
                if (op, name) in ONNX_VALUES:
                    refused = [v for v in ONNX_VALUES[op, name] if v not in vals]
                    assert all(v in ONNX_VALUES[op, name] for v in vals), (op, name, vals)
                    if refused:
                        partial.append(f"{name} = {', '.join(refused)} not implemented{where}")
                else:
                    partial.append(f"{name} only = {'|'.join(str(v) for v in vals)}{where}")
        if missing or partial:
            lines.append(f"{op:26s} " + "; ".join(
                ([f"not implemented: {', '.join(missing)}"] if missing else []) + partial))
    print("\nONNX schema attributes the engine refuses (opset %d..%d):\n  %s" % (MIN_OPSET, MAX_OPSET,
                                                                                "\n  ".join(lines)))
    assert lines   # at least LSTM's clip and Dropout's seed
