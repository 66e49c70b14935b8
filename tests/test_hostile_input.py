"""Hostile input: crafted ONNX models, checkpoints and parameters, and two threads on one
forward. Every case gets a clean error that names the problem (an exception from
``_C.Engine``, a nonzero exit status from ``ortmod-train``) or the right result, never a
crash, an over-read or silent garbage.

The engine cases run in a child process (one for all of them, restarted after a crash), so
that a segfault fails the case that caused it instead of killing pytest. The child loads
only the extension (no torch), from ``ORTMOD_HOSTILE_SO`` when set: point it at an
ASan/UBSan build to run these cases under the sanitizers, e.g.

    cmake -S . -B build/san -G Ninja -DORTMOD_SANITIZE=ON -DORTMOD_CUDA=OFF && cmake --build build/san
    ORTMOD_HOSTILE_SO=$(ls build/san/_C*.so) \
    LD_PRELOAD=$(gcc -print-file-name=libasan.so) \
    ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1:max_allocation_size_mb=4096 \
    python -m pytest tests/test_hostile_input.py -k crafted

(ORTMOD_TRAIN_BINARY=build/san/ortmod-train does the same for the runner cases; `make test-asan`
runs all of it.)
"""
import json
import os
import struct
import shutil
import subprocess
import sys
import textwrap

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

import buildpaths

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BINARY = os.environ.get("ORTMOD_TRAIN_BINARY") or buildpaths.RUNNER
I64_MIN, I64_MAX = -(2 ** 63), 2 ** 63 - 1


def model(nodes, inputs, outputs, inits=(), opset=17, extra_opsets=()):
    g = h.make_graph(nodes, "g", inputs, outputs, list(inits))
    return h.make_model(g, opset_imports=[h.make_opsetid("", opset), *extra_opsets])


X = h.make_tensor_value_info("x", T.FLOAT, [2, 3])
Y = h.make_tensor_value_info("y", T.FLOAT, None)


def relu():
    return model([h.make_node("Relu", ["x"], ["y"])], [X], [Y])


def raw_tensor(name, dims, data=b"", dtype=T.FLOAT):
    t = onnx.TensorProto()
    t.name = name
    t.data_type = dtype
    t.dims.extend(dims)
    if data:
        t.raw_data = data
    return t


def ints(name, vals):
    return nh.from_array(np.array(vals, np.int64), name)


# ---- the crafted models ----------------------------------------------------------------
# Each case: model bytes, grad flags, and either an expected error (exception name and
# fragments of its message) or a run: inputs, and the outputs (and input gradients for
# output gradients of ones) that numpy computes.

def case_no_op_type():
    n = onnx.NodeProto()
    n.input.append("x")
    n.output.append("y")
    return model([n], [X], [Y])


def case_input_without_name():
    vi = onnx.ValueInfoProto()
    vi.type.tensor_type.elem_type = T.FLOAT
    return model([h.make_node("Relu", ["x"], ["y"])], [X, vi], [Y])


def case_output_without_name():
    m = relu()
    m.graph.output.add()
    return m


def case_initializer_without_name():
    return model([h.make_node("Relu", ["x"], ["y"])], [X], [Y], [raw_tensor("", [1], b"\0" * 4)])


def case_attr_without_name():
    n = h.make_node("Relu", ["x"], ["y"])
    n.attribute.add().CopyFrom(h.make_attribute("axis", 1))
    n.attribute[0].name = ""
    return model([n], [X], [Y])


def case_dims_overflow(op):
    # 2^32 * 2^32 * 16 wraps to 0 elements, which 0 bytes of data "match"
    w = raw_tensor("w", [2 ** 32, 2 ** 32, 16])
    attrs = {"axis": -1} if op == "Softmax" else {"keepdims": 0}
    return model([h.make_node(op, ["w"], ["y"], **attrs)], [], [Y], [w])


def case_empty_with_huge_dims():
    # no element, but a row of 2^80 elements for a kernel that multiplies the trailing dims
    return model([h.make_node("Softmax", ["w"], ["y"], axis=0)], [], [Y], [raw_tensor("w", [0, 2 ** 40, 2 ** 40])])


def case_huge_dims_no_data():
    # 4 TiB claimed, nothing held: refused before anything is allocated (not a MemoryError)
    return model([h.make_node("Add", ["x", "w"], ["y"])], [X], [Y], [raw_tensor("w", [2 ** 40])])


def case_raw_data_short():
    return model([h.make_node("Add", ["x", "w"], ["y"])], [X], [Y], [raw_tensor("w", [2, 3], b"\0" * 20)])


def case_negative_dim():
    return model([h.make_node("Add", ["x", "w"], ["y"])], [X], [Y], [raw_tensor("w", [2, -3])])


def case_bool_out_of_range():
    w = onnx.TensorProto()
    w.name, w.data_type = "w", T.BOOL
    w.dims.append(2)
    w.int32_data.extend([1, 7])
    return model([h.make_node("Not", ["w"], ["y"])], [], [h.make_tensor_value_info("y", T.BOOL, None)], [w])


def case_constant_value_overflow():
    n = h.make_node("Constant", [], ["y"])
    n.attribute.add().CopyFrom(h.make_attribute("value", raw_tensor("v", [2 ** 31, 2 ** 31, 2 ** 31])))
    return model([n], [], [Y])


def case_constant_of_shape_huge():
    # the shape is data: the product overflows only when the shape rule runs
    return model([h.make_node("ConstantOfShape", ["s"], ["y"])], [], [Y], [ints("s", [2 ** 40, 2 ** 40])])


def case_gemm_empty_a():
    b = nh.from_array(np.ones((3, 3), np.float32), "b")
    c = nh.from_array(np.ones(3, np.float32), "c")
    return model([h.make_node("Gemm", ["", "b", "c"], ["y"])], [X], [Y], [b, c])


def case_matmul_add_empty_output():
    w = nh.from_array(np.ones((3, 3), np.float32), "w")
    b = nh.from_array(np.ones(3, np.float32), "b")
    return model([h.make_node("MatMul", ["x", "w"], [""]), h.make_node("Add", ["x", "b"], ["y"])], [X], [Y], [w, b])


def case_internal_op_empty_inputs():
    # internal ops mark absent values anywhere, so the importer lets them through: the passes
    # (matmul_bias_gelu reads MatMulBias's inputs into its fused node) and the shape rules cope
    b = nh.from_array(np.ones(3, np.float32), "b")
    return model([h.make_node("MatMulBias", ["x", "", "b"], ["z"], domain="com.microsoft"),
                  h.make_node("Gelu", ["z"], ["y"])], [X], [Y], [b],
                 extra_opsets=[h.make_opsetid("com.microsoft", 1)])


def case_opset(v):
    return model([h.make_node("Relu", ["x"], ["y"])], [X], [Y], opset=v)


def case_opset_twice():
    m = relu()
    m.opset_import.add().CopyFrom(h.make_opsetid("", 18))
    return m


def case_attr_type(op, attr, value, inputs=("x",)):
    return model([h.make_node(op, list(inputs), ["y"], **{attr: value})], [X], [Y])


def case_attr_twice():
    n = h.make_node("Softmax", ["x"], ["y"], axis=0)
    n.attribute.extend([h.make_attribute("axis", 1)])
    return model([n], [X], [Y])


def case_attr_nul_byte():
    return case_attr_type("Gelu", "approximate", b"tanh\0none", ("x",))


def case_value_defined_twice():
    return model([h.make_node("Relu", ["x"], ["x"]), h.make_node("Relu", ["x"], ["y"])], [X], [Y])


def case_input_listed_twice():
    return model([h.make_node("Relu", ["x"], ["y"])], [X, X], [Y])


def case_reads_undefined():
    return model([h.make_node("Relu", ["q"], ["y"])], [X], [Y])


def case_output_undefined():
    return model([h.make_node("Relu", ["x"], ["y"])], [X], [h.make_tensor_value_info("z", T.FLOAT, None)])


def case_slice(starts, ends, steps):
    x = h.make_tensor_value_info("x", T.FLOAT, [5, 7])
    inits = [ints("s", starts), ints("e", ends), ints("a", list(range(len(starts)))), ints("t", steps)]
    return model([h.make_node("Slice", ["x", "s", "e", "a", "t"], ["y"])], [x], [Y], inits)


def np_slice(x, starts, ends, steps):
    return x[tuple(slice(s, e, t) for s, e, t in zip(starts, ends, steps))]


SLICES = {
    "slice_min_to_max": ([I64_MIN, I64_MIN], [I64_MAX, I64_MAX], [1, 1]),
    "slice_step_max": ([0, 2], [I64_MAX, I64_MAX], [I64_MAX, I64_MAX]),
    "slice_step_min": ([I64_MAX, 3], [I64_MIN, I64_MIN], [I64_MIN, I64_MIN]),
    "slice_backwards_min": ([-1, I64_MAX], [I64_MIN, -8], [-2, -3]),
    "slice_empty_extreme": ([I64_MAX, 0], [I64_MIN, I64_MAX], [1, I64_MAX]),
}


def engine_cases():
    c = {}

    def err(name, m, exc, *frags, grad=None, inputs=None):
        c[name] = dict(model=m.SerializeToString(), grad=grad, error=exc, fragments=list(frags))
        if inputs is not None:   # the error comes when a forward plans the shapes
            c[name].update(run=True, inputs=inputs, shape=np.shape(inputs[0]))

    err("no_op_type", case_no_op_type(), "InvalidInputError", "node 0 ('y') has no op_type")
    err("input_without_name", case_input_without_name(), "InvalidInputError", "graph input 1 has no name")
    err("output_without_name", case_output_without_name(), "InvalidInputError", "graph output 1 has no name")
    err("initializer_without_name", case_initializer_without_name(), "InvalidInputError", "initializer 0 has no name")
    err("initializer_twice", model([h.make_node("Add", ["x", "w"], ["y"])], [X], [Y],
                                   [raw_tensor("w", [3], b"\0" * 12)] * 2), "InvalidInputError",
        "initializer 'w' is given twice")
    err("attr_without_name", case_attr_without_name(), "InvalidInputError", "attribute 0 has no name")
    err("dims_overflow_reduce_sum", case_dims_overflow("ReduceSum"), "InvalidInputError", "tensor 'w'", "overflows")
    err("dims_overflow_softmax", case_dims_overflow("Softmax"), "InvalidInputError", "tensor 'w'", "overflows")
    err("empty_with_huge_dims", case_empty_with_huge_dims(), "InvalidInputError", "tensor 'w'", "overflows")
    err("huge_dims_no_data", case_huge_dims_no_data(), "InvalidInputError",
        "tensor 'w' holds 0 elements of data", "needs 1099511627776")
    err("raw_data_short", case_raw_data_short(), "InvalidInputError", "tensor 'w' holds 20 bytes", "needs 24")
    err("negative_dim", case_negative_dim(), "InvalidInputError", "tensor 'w' has a negative dim (-3 at axis 1)")
    err("bool_out_of_range", case_bool_out_of_range(), "InvalidInputError", "initializer 0: tensor 'w' (bool)",
        "is 7, outside 0..1")
    err("constant_value_overflow", case_constant_value_overflow(), "InvalidInputError", "attribute 'value'",
        "overflows")
    err("constant_of_shape_huge", case_constant_of_shape_huge(), "InvalidInputError", "ConstantOfShape node",
        "larger than a tensor can be")
    err("expand_beyond_memory", model([h.make_node("Expand", ["x", "s"], ["y"])], [X], [Y], [ints("s", [2 ** 30, 2, 3])]),
        "MemoryError", "out of memory for output 'y' (25769803776 bytes)", inputs=[np.ones((2, 3)).tolist()])
    err("gemm_empty_a", case_gemm_empty_a(), "InvalidInputError", "(Gemm): input 0 is required, but its name is empty",
        grad=[True])
    err("matmul_empty_output", case_matmul_add_empty_output(), "InvalidInputError",
        "node '#0' (MatMul): output 0 is required", grad=[True])
    err("opset_huge", case_opset(2 ** 62), "InvalidInputError", "opset version 4611686018427387904", "outside 1..100")
    err("opset_negative", case_opset(-5), "InvalidInputError", "opset -5 is too old")
    err("opset_too_old", case_opset(12), "InvalidInputError", "opset 12 is too old")
    err("opset_twice", case_opset_twice(), "InvalidInputError", "imports the default ONNX opset twice")
    err("attr_float_for_int", case_attr_type("Softmax", "axis", 0.5), "InvalidInputError",
        "node 'y' (Softmax): attribute 'axis' is of type float, but Softmax's axis is of type int")
    err("attr_int_for_ints", case_attr_type("Transpose", "perm", 1), "InvalidInputError",
        "attribute 'perm' is of type int, but Transpose's perm is of type ints")
    err("attr_int_for_string", case_attr_type("Gelu", "approximate", 1), "InvalidInputError",
        "attribute 'approximate' is of type int, but Gelu's approximate is of type string")
    err("attr_string_for_float", case_attr_type("LeakyRelu", "alpha", "big"), "InvalidInputError",
        "attribute 'alpha' is of type string, but LeakyRelu's alpha is of type float")
    err("attr_twice", case_attr_twice(), "InvalidInputError", "node 'y' (Softmax): attribute 'axis' is given twice")
    err("attr_nul_byte", case_attr_nul_byte(), "InvalidInputError", "string attribute 'approximate' holds a NUL byte")
    err("value_defined_twice", case_value_defined_twice(), "InvalidInputError",
        "writes 'x', which a graph input already defines")
    err("input_listed_twice", case_input_listed_twice(), "InvalidInputError", "graph input 'x' is listed twice")
    err("reads_undefined", case_reads_undefined(), "InvalidInputError", "reads 'q', which no earlier node")
    err("output_undefined", case_output_undefined(), "InvalidInputError", "graph output 'z' is not defined")
    err("internal_op_empty_inputs", case_internal_op_empty_inputs(), "InvalidInputError",
        "(MatMulBiasGelu): input 1 has unsupported dtype undefined", grad=[True], inputs=[np.ones((2, 3)).tolist()])
    # found by the fuzzer: the model's own integers overflow a shape rule's arithmetic
    x46 = h.make_tensor_value_info("x", T.FLOAT, [4, 6])
    ones46 = [np.ones((4, 6)).tolist()]
    err("reshape_dims_overflow", model([h.make_node("Reshape", ["x", "s"], ["y"])], [x46], [Y],
                                       [ints("s", [2 ** 32, 2 ** 32, 6])]),
        "InvalidInputError", "Reshape node 'y'", "the dims of shape multiply past int64", inputs=ones46)
    err("split_sizes_overflow", model([h.make_node("Split", ["x", "s"], ["y", "z"], axis=1)], [x46], [Y],
                                      [ints("s", [I64_MAX, 7])]),
        "InvalidInputError", "Split node 'y'", "split sizes add up past int64", inputs=ones46)
    err("pad_overflow", model([h.make_node("Pad", ["x", "p"], ["y"], mode="constant")], [x46], [Y],
                              [ints("p", [I64_MAX, 0, 0, 0])]),
        "InvalidInputError", "Pad node 'y'", "pads of axis 0 (9223372036854775807, 0) are out of range", inputs=ones46)
    # found by the fuzzer under ASan: a node imported with fewer inputs than its op takes
    # (BiasDropout without residual, ratio, training_mode) had its gradient rule read past them
    short = model([h.make_node("BiasDropout", ["x", "b"], ["y"], domain="com.microsoft")], [x46], [Y],
                  [nh.from_array(np.full(6, 0.5, np.float32), "b")], extra_opsets=[h.make_opsetid("com.microsoft", 1)])
    c["short_node_gradient"] = dict(model=short.SerializeToString(), grad=[True], run=True, inputs=ones46,
                                    expect=[np.full((4, 6), 1.5).tolist()], expect_grad=[np.ones((4, 6)).tolist()],
                                    shape=[4, 6])
    err("internal_op_empty_input0", model([h.make_node("FusedAttention", ["", "x", "x"], ["y"], domain="com.microsoft")],
                                          [X], [Y], extra_opsets=[h.make_opsetid("com.microsoft", 1)]),
        "InvalidInputError", "(FusedAttention): input 0 is required, but its name is empty")
    err("gradient_shape_overflow", model([h.make_node("ReduceGrad", ["x", "s"], ["y"], domain="com.microsoft")], [X],
                                         [Y], [ints("s", [2 ** 40, 2 ** 40, 3])],
                                         extra_opsets=[h.make_opsetid("com.microsoft", 1)]),
        "InvalidInputError", "ReduceGrad node 'y': the shape in input 1", "is not one a tensor can have",
        inputs=[np.ones((2, 3)).tolist()])
    # found by the fuzzer under ASan: gradient rules that read their node after emitting
    # nodes (the array had moved): GatherElements and ScatterElements
    idx = ints("i", [[0, 2, 1, 0], [2, 1, 0, 1]])
    ge = model([h.make_node("Mul", ["x", "x"], ["m"]), h.make_node("GatherElements", ["m", "i"], ["y"], axis=0)],
               [h.make_tensor_value_info("x", T.FLOAT, [3, 4])], [Y], [idx])
    xg = np.arange(12, dtype=np.float32).reshape(3, 4)
    want = np.take_along_axis(xg * xg, np.array([[0, 2, 1, 0], [2, 1, 0, 1]]), 0)
    dx = np.zeros_like(xg)
    np.add.at(dx, (np.array([[0, 2, 1, 0], [2, 1, 0, 1]]), np.arange(4)[None, :].repeat(2, 0)), 1.0)
    c["gather_elements_gradient"] = dict(model=ge.SerializeToString(), grad=[True], run=True, inputs=[xg.tolist()],
                                         expect=[want.tolist()], expect_grad=[(2 * xg * dx).tolist()], shape=[2, 4])
    # found by make fuzz (libFuzzer): Softmax over the empty axis of a [0, 2^40] initializer looped
    # 2^40 times, folding nothing; a node whose outputs hold no element is skipped now
    empty_huge = model([h.make_node("Softmax", ["w"], ["y"], axis=0)], [], [Y], [raw_tensor("w", [0, 2 ** 40])])
    c["softmax_empty_huge_axis"] = dict(model=empty_huge.SerializeToString(), grad=None, run=True, inputs=[],
                                        expect=[[]])
    # an int where the schema says float is refused too (ONNX's checker does; main's attrs lists)
    err("attr_int_for_float", case_attr_type("LeakyRelu", "alpha", 1), "InvalidInputError",
        "attribute 'alpha' is of type int, but LeakyRelu's alpha is of type float")
    # an output that is the input itself: no backward node, its gradient passes straight through
    x23 = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    through = model([h.make_node("Relu", ["x"], ["y"])], [X], [h.make_tensor_value_info("x", T.FLOAT, None)])
    c["output_is_input"] = dict(model=through.SerializeToString(), grad=[True], run=True, inputs=[x23.tolist()],
                                expect=[x23.tolist()], expect_grad=[np.ones((2, 3)).tolist()], shape=[2, 3])
    rng = np.random.default_rng(0)
    x = rng.standard_normal((5, 7)).astype(np.float32)
    for name, (s, e, t) in SLICES.items():
        y = np_slice(x, s, e, t)
        dx = np.zeros_like(x)
        dx[tuple(slice(a, b, k) for a, b, k in zip(s, e, t))] = 1
        c[name] = dict(model=case_slice(s, e, t).SerializeToString(), grad=[True], run=True, inputs=[x.tolist()],
                       expect=[y.tolist()], expect_grad=[dx.tolist()], shape=list(y.shape))
    return c


# ---- the child that runs them ---------------------------------------------------------

CHILD = textwrap.dedent(r'''
    import glob, importlib.util, json, os, resource, sys
    import numpy as np
    # a model may ask for any memory; past this a malloc fails (a clean MemoryError) instead of
    # the OOM killer ending the child. (Under ASan, whose shadow memory needs address space,
    # ASAN_OPTIONS=allocator_may_return_null=1:max_allocation_size_mb=4096 does the same.)
    if not os.environ.get("ORTMOD_HOSTILE_SO"):
        resource.setrlimit(resource.RLIMIT_AS, (6 << 30, 6 << 30))
    so = os.environ.get("ORTMOD_HOSTILE_SO") or glob.glob(os.path.join(sys.argv[1], "ortmod", "_C*.so"))[0]
    spec = importlib.util.spec_from_file_location("ortmod._C", so)
    _C = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(_C)
    cases = json.load(open(sys.argv[2]))
    for name in sys.argv[3:]:
        c = cases[name]
        print(json.dumps({"start": name}), flush=True)
        out = {"name": name}
        try:
            eng = _C.Engine(bytes.fromhex(c["model"]), c["grad"])
            if c.get("run"):
                ins = [np.array(v, np.float32) for v in c["inputs"]]
                caps, stash = eng.forward(ins, bool(c["grad"]))
                out["outputs"] = [np.from_dlpack(type("C", (), {"__dlpack__": lambda s, **k: cap,
                                  "__dlpack_device__": lambda s: (1, 0)})()).tolist() for cap in caps]
                if stash is not None:
                    gy = [np.ones(c["shape"], np.float32)]
                    grads = eng.backward(stash, gy)
                    out["grads"] = [None if g is None else np.from_dlpack(type("C", (), {
                        "__dlpack__": lambda s, **k: g, "__dlpack_device__": lambda s: (1, 0)})()).tolist()
                        for g in grads]
            out["ok"] = True
        except Exception as e:
            out["error"] = type(e).__name__
            out["message"] = str(e)
        print(json.dumps(out), flush=True)
''')


def run_child(cases, names, tmp):
    """Runs the named cases in child processes; a crash is recorded as the case's result and
    the next child goes on after it. Returns {name: result}."""
    path = os.path.join(tmp, "cases.json")
    with open(path, "w") as f:
        json.dump({n: dict(c, model=c["model"].hex()) for n, c in cases.items()}, f)
    results, todo = {}, list(names)
    while todo:
        r = subprocess.run([sys.executable, "-c", CHILD, ROOT, path, *todo], capture_output=True, text=True,
                           timeout=600)
        started = None
        for line in r.stdout.splitlines():
            msg = json.loads(line)
            if "start" in msg:
                started = msg["start"]
            else:
                results[msg["name"]] = msg
                started = None
        if started is not None:   # the child died inside this case
            results[started] = {"name": started, "crash": r.returncode, "stderr": r.stderr[-3000:]}
        elif r.returncode != 0 and len(results) < len(names):
            raise AssertionError(f"the child failed outside any case ({r.returncode}): {r.stderr[-3000:]}")
        todo = [n for n in todo if n not in results]
    return results


CASES = engine_cases()


@pytest.fixture(scope="module")
def engine_results(tmp_path_factory):
    return run_child(CASES, list(CASES), str(tmp_path_factory.mktemp("hostile")))


@pytest.mark.parametrize("name", list(CASES))
def test_crafted_model_gets_a_clean_answer(engine_results, name):
    c, r = CASES[name], engine_results[name]
    assert "crash" not in r, f"{name}: the engine crashed (status {r['crash']}):\n{r['stderr']}"
    if "error" in c:
        assert r.get("error") == c["error"], (name, r)
        for frag in c["fragments"]:
            assert frag in r["message"], (name, frag, r["message"])
        return
    assert r.get("ok"), (name, r)
    for got, want in zip(r["outputs"], c["expect"]):
        np.testing.assert_allclose(np.array(got, np.float32).reshape(np.shape(want)), want)
    for got, want in zip(r.get("grads", []), c.get("expect_grad", [])):
        np.testing.assert_allclose(np.array(got, np.float32), want)


# ---- concurrent backward ----------------------------------------------------------------

THREADS = textwrap.dedent(r'''
    import sys, threading
    sys.path.insert(0, sys.argv[1])
    import torch
    from ortmod import ORTModule, _C
    torch.manual_seed(0)
    torch.set_num_threads(1)
    net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.Tanh(), torch.nn.Linear(512, 256))
    ref = [p.detach().clone() for p in net.parameters()]
    x = torch.randn(128, 256)
    net(x).square().sum().backward()
    want = [p.grad.clone() for p in net.parameters()]
    m = ORTModule(net)

    def race(backward):
        errors, barrier = [], threading.Barrier(2)
        def go():
            barrier.wait()
            try:
                backward()
            except Exception as e:
                errors.append(e)
        ts = [threading.Thread(target=go) for _ in range(2)]
        for t in ts: t.start()
        for t in ts: t.join()
        return errors

    # 1. two threads backward one loss (retain_graph=True, so that autograd lets both run)
    for it in range(int(sys.argv[2])):
        for p in net.parameters(): p.grad = None
        loss = m(x).square().sum()
        errors = race(lambda: loss.backward(retain_graph=True))
        # eager would give 2x the gradient; the engine gives one backward and one clean error
        assert len(errors) == 1, errors
        msg = str(errors[0])
        assert isinstance(errors[0], _C.InvalidInputError), repr(errors[0])
        assert "already being used by a backward" in msg or "already used by a backward" in msg, msg
        for p, w in zip(net.parameters(), want):
            torch.testing.assert_close(p.grad, w, rtol=1e-4, atol=1e-4)
    # 2. retain_graph=True, twice in a row: the first is right, the second a clean error
    for p in net.parameters(): p.grad = None
    loss = m(x).square().sum()
    loss.backward(retain_graph=True)
    try:
        loss.backward()
        raise AssertionError("a second backward through one forward ran")
    except _C.InvalidInputError as e:
        assert "already used by a backward" in str(e) and "retain_graph" in str(e), str(e)
    for p, w in zip(net.parameters(), want):
        torch.testing.assert_close(p.grad, w, rtol=1e-4, atol=1e-4)
    print("ok")
''')


def test_two_threads_backward_one_forward_get_one_result_and_one_clean_error():
    r = subprocess.run([sys.executable, "-c", THREADS, ROOT, "12"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.returncode, r.stdout[-2000:], r.stderr[-4000:])


ENGINE_THREADS = textwrap.dedent(r'''
    import glob, importlib.util, os, sys, threading
    import numpy as np
    import onnx
    from onnx import helper as h, TensorProto as T, numpy_helper as nh
    spec = importlib.util.spec_from_file_location("ortmod._C", glob.glob(os.path.join(sys.argv[1], "ortmod", "_C*.so"))[0])
    _C = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(_C)
    rng = np.random.default_rng(0)
    w = nh.from_array(rng.standard_normal((512, 512)).astype(np.float32), "w")
    g = h.make_graph([h.make_node("MatMul", ["x", "w"], ["h"]), h.make_node("Tanh", ["h"], ["y"])], "g",
                     [h.make_tensor_value_info("x", T.FLOAT, [256, 512])], [h.make_tensor_value_info("y", T.FLOAT, None)],
                     [w])
    eng = _C.Engine(h.make_model(g, opset_imports=[h.make_opsetid("", 17)]).SerializeToString(), [True])
    x = rng.standard_normal((256, 512)).astype(np.float32)
    gy = np.ones((256, 512), np.float32)
    for it in range(int(sys.argv[2])):
        caps, stash = eng.forward([x], True)
        results, barrier = [], threading.Barrier(3)
        def go():
            barrier.wait()
            try:
                results.append(("ok", eng.backward(stash, [gy])))
            except _C.InvalidInputError as e:
                results.append(("error", str(e)))
        ts = [threading.Thread(target=go) for _ in range(3)]
        for t in ts: t.start()
        for t in ts: t.join()
        assert sorted(r[0] for r in results) == ["error", "error", "ok"], results
        for kind, msg in results:
            assert kind == "ok" or "already being used by a backward" in msg or "already used by a backward" in msg, msg
    print("ok")
''')


def test_threads_on_one_stash_through_the_engine_api():
    r = subprocess.run([sys.executable, "-c", ENGINE_THREADS, ROOT, "30"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), (r.returncode, r.stdout[-2000:], r.stderr[-4000:])


# ---- the runner ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def binary():
    if os.environ.get("ORTMOD_TRAIN_BINARY"):   # one built elsewhere (with sanitizers)
        return BINARY
    r = buildpaths.build()
    assert r.returncode == 0, r.stdout + r.stderr
    return BINARY


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    """A 4 -> 3 linear classifier written with onnx.helper, and 64 samples."""
    from ortmod.runner import write_shards

    d = tmp_path_factory.mktemp("hostile_runner")
    rng = np.random.default_rng(0)
    write_shards(d / "train", {"x": rng.standard_normal((64, 4)).astype(np.float32),
                               "labels": rng.integers(0, 3, 64).astype(np.int64)})
    (d / "mlp.onnx").write_bytes(linear_model().SerializeToString())
    return d


def linear_model():
    w = nh.from_array(np.full((3, 4), 0.1, np.float32), "w")
    b = nh.from_array(np.zeros(3, np.float32), "b")
    return model([h.make_node("Gemm", ["x", "w", "b"], ["logits"], transB=1)],
                 [h.make_tensor_value_info("x", T.FLOAT, ["batch", 4])],
                 [h.make_tensor_value_info("logits", T.FLOAT, ["batch", 3])], [w, b])


def run_cli(*args):
    return subprocess.run([BINARY, *map(str, args)], capture_output=True, text=True, timeout=120)


def fails(r, *fragments):
    assert r.returncode in (1, 2), (r.returncode, r.stderr)   # a signal is a negative status
    for f in fragments:
        assert f in r.stderr, (f, r.stderr)
    assert r.stderr.startswith("ortmod-train: error:"), r.stderr


@pytest.mark.parametrize("name,fragment", [
    ("no_op_type", "has no op_type"),
    ("input_without_name", "graph input 1 has no name"),
    ("initializer_without_name", "initializer 0 has no name"),
    ("dims_overflow", "overflows"),
    ("opset_huge", "outside 1..100"),
    ("attr_twice", "is given twice"),
    ("attr_type", "attribute 'transB' is of type float, but Gemm's transB is of type int"),
])
def test_runner_refuses_crafted_models(binary, task, tmp_path, name, fragment):
    m = linear_model()
    if name == "no_op_type":
        m.graph.node[0].ClearField("op_type")
    elif name == "input_without_name":
        m.graph.input.add().type.tensor_type.elem_type = T.FLOAT
    elif name == "initializer_without_name":
        m.graph.initializer[0].name = ""
    elif name == "dims_overflow":
        m.graph.initializer[0].CopyFrom(raw_tensor("w", [2 ** 32, 2 ** 32, 16]))
    elif name == "opset_huge":
        m.opset_import[0].version = 2 ** 62
    elif name == "attr_twice":
        m.graph.node[0].attribute.extend([h.make_attribute("transB", 0)])
    elif name == "attr_type":
        m.graph.node[0].attribute[0].CopyFrom(h.make_attribute("transB", 1.0))
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(m.SerializeToString())
    fails(run_cli("--model", path, "--train_data_dir", task / "train", "--num_train_steps", "2"), fragment,
          f"{name}.onnx")


@pytest.mark.parametrize("name,fragment", [
    ("data_short", "tensor 'fc1.bias' holds 8 bytes"),
    ("second_bad", "tensor 'fc2.weight' holds 4 bytes"),
    ("negative_dim", "tensor 'fc1.bias' has a negative dim"),
])
def test_runner_failed_model_load_leaks_nothing(binary, task, tmp_path, name, fragment):
    """Issue 15: a model whose initializer failed to load leaked the weight's name, 9 bytes for
    'fc1.bias', every time (rn_model_load; freed since 9904316, and since the importer's check
    runs first these models no longer reach that path). LeakSanitizer checks the whole failed
    load in a sanitizer build of the runner (make test-asan sets ORTMOD_TRAIN_BINARY to one; a
    leak put into the error path makes this fail there); the plain build checks the error alone."""
    w = nh.from_array(np.full((3, 4), 0.1, np.float32), "fc1.weight")
    b = raw_tensor("fc1.bias", [3], b"\0" * 12)
    w2 = nh.from_array(np.full((3, 3), 0.1, np.float32), "fc2.weight")
    if name == "data_short":
        b = raw_tensor("fc1.bias", [3], b"\0" * 8)
    elif name == "second_bad":
        w2 = raw_tensor("fc2.weight", [3, 3], b"\0" * 4)
    elif name == "negative_dim":
        b = raw_tensor("fc1.bias", [-3], b"")
    m = model([h.make_node("Gemm", ["x", "fc1.weight", "fc1.bias"], ["h"], transB=1),
               h.make_node("MatMul", ["h", "fc2.weight"], ["logits"])],
              [h.make_tensor_value_info("x", T.FLOAT, ["batch", 4])],
              [h.make_tensor_value_info("logits", T.FLOAT, ["batch", 3])], [w, b, w2])
    path = tmp_path / f"{name}.onnx"
    path.write_bytes(m.SerializeToString())
    r = subprocess.run([BINARY, "--model", path, "--train_data_dir", task / "train", "--num_train_steps", "2"],
                       capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1"))
    assert "LeakSanitizer" not in r.stderr, r.stderr
    fails(r, fragment, f"{name}.onnx")


def read_records(path):
    data, out, pos = path.read_bytes(), [], 0
    while pos < len(data):
        (n,) = struct.unpack_from("<I", data, pos)
        t = onnx.TensorProto()
        t.ParseFromString(data[pos + 4:pos + 4 + n])
        out.append(t)
        pos += 4 + n
    return out


def crc32c(data):
    table = crc32c.table
    if table is None:
        table = crc32c.table = []
        for i in range(256):
            c = i
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
            table.append(c)
    crc = 0xFFFFFFFF
    for b in data:
        crc = table[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


crc32c.table = None


def write_records(path, records, checksum=True):
    """Writes records as the runner does; a trailing meta/checksum record gets the CRC-32C of
    what precedes it, as a crafted (not a damaged) file would have (checksum=False keeps the
    stored one)."""
    body = b""
    for t in records:
        if t.name == "meta/checksum" and checksum:
            t.CopyFrom(nh.from_array(np.array([crc32c(body)], np.int64), "meta/checksum"))
        b = t.SerializeToString()
        body += struct.pack("<I", len(b)) + b
    path.write_bytes(body)


def trained_checkpoints(task, ck, steps=2):
    """Trains `steps` updates with a checkpoint after each: ck/checkpoint_1 .. checkpoint_<steps>."""
    common = ["--model", task / "mlp.onnx", "--train_data_dir", task / "train", "--checkpoints_dir", ck,
              "--train_batch_size", "8"]
    r = run_cli(*common, "--num_train_steps", steps, "--checkpoint_period", "1")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in ck.glob("checkpoint_*")) == [f"checkpoint_{i}" for i in range(1, steps + 1)]
    return common


def set_counter(state, index, value):
    recs = read_records(state)
    counters = next(t for t in recs if t.name == "meta/counters")
    vals = nh.to_array(counters).copy()
    vals[index] = value
    if (index, value) == (1, 1):   # one update, and the optimizer stepped once: only the directory differs
        vals[3] = 1
    counters.CopyFrom(nh.from_array(vals, "meta/counters"))
    write_records(state, recs)


def resumed_from(r, update):
    assert r.returncode == 0, r.stderr
    assert f"checkpoint_{update}/state.pb (update {update}," in r.stdout, r.stdout


@pytest.mark.parametrize("index,value,fragment", [
    (2, -5, "its data cursor counter is -5"),
    (2, I64_MAX - 3, "its data cursor counter is 9223372036854775804"),
    (2, 1, "its data cursor (1 samples) is behind its 2 steps"),
    (0, -1, "its step counter is -1"),
    (1, 3, "it counts 3 updates in 2 steps"),
    (1, 1, "its update counter is 1 but its directory says 2"),
    (1, -3, "its update counter is -3"),
    (3, 5, "5 optimizer steps and 0 skipped updates in 2 updates"),
    (6, 7, "its optimizer kind is 7"),
    (7, 9, "it counts 9 weights but holds 2"),
])
def test_runner_refuses_a_checkpoint_with_bad_counters(binary, task, tmp_path, index, value, fragment):
    """A crafted header (its checksum is right) is refused by name; resume takes the checkpoint
    before it, saying so, and fails, naming it, when there is none."""
    ck = tmp_path / "ck"
    common = trained_checkpoints(task, ck)
    set_counter(ck / "checkpoint_2" / "state.pb", index, value)
    r = run_cli(*common, "--num_train_steps", "3")
    resumed_from(r, 1)
    assert fragment in r.stderr and "resuming from the previous checkpoint" in r.stderr, r.stderr
    assert r.stderr.startswith("ortmod-train: warning: checkpoint '") and "checkpoint_2/state.pb' is corrupt" in r.stderr
    # the run saved a good checkpoint_2 again; craft it and drop checkpoint_1: nothing to fall back to
    shutil.rmtree(ck / "checkpoint_1")
    shutil.rmtree(ck / "checkpoint_3")
    set_counter(ck / "checkpoint_2" / "state.pb", index, value)
    fails(run_cli(*common, "--num_train_steps", "3"), "is corrupt", fragment, "no older checkpoint")


def test_runner_refuses_a_checkpoint_with_a_bad_loss_scale(binary, task, tmp_path):
    ck = tmp_path / "ck"
    common = ["--model", task / "mlp.onnx", "--train_data_dir", task / "train", "--checkpoints_dir", ck]
    assert run_cli(*common, "--num_train_steps", "1", "--checkpoint_period", "1").returncode == 0
    state = max(ck.glob("checkpoint_*")) / "state.pb"
    recs = read_records(state)
    ls = next(t for t in recs if t.name == "meta/loss_scale")
    ls.CopyFrom(nh.from_array(np.array([np.nan], np.float32), "meta/loss_scale"))
    write_records(state, recs)
    fails(run_cli(*common, "--num_train_steps", "2"), "its loss scale is nan")


def test_bit_flipped_checkpoints_are_detected_and_resume_falls_back(binary, task, tmp_path):
    """Ten single-bit flips spread over the newest checkpoint (header, weights, optimizer
    state; the last one in the checksum itself): each is named as damage and the run resumes from the
    checkpoint before it, ending with the weights of an undamaged run."""
    ck = tmp_path / "ck"
    common = trained_checkpoints(task, ck)
    ref = run_cli(*common[:-4], "--checkpoints_dir", tmp_path / "ref", *common[-2:], "--num_train_steps", "3",
                  "--output_dir", tmp_path / "ref_out")
    assert ref.returncode == 0, ref.stderr
    want = {t.name: nh.to_array(t) for t in onnx.load(str(tmp_path / "ref_out" / "trained_model.onnx")).graph.initializer}
    state = ck / "checkpoint_2" / "state.pb"
    good = state.read_bytes()
    rng = np.random.default_rng(15)
    detected = 0
    for k in range(10):
        pos = int(rng.integers(k * len(good) // 10, (k + 1) * len(good) // 10)) if k < 9 else len(good) - 1
        bit = int(rng.integers(0, 8))
        work = tmp_path / f"flip{k}"
        shutil.copytree(ck, work)
        bad = bytearray(good)
        bad[pos] ^= 1 << bit
        (work / "checkpoint_2" / "state.pb").write_bytes(bytes(bad))
        out = tmp_path / f"out{k}"
        r = run_cli(*common[:-4], "--checkpoints_dir", work, *common[-2:], "--num_train_steps", "3",
                    "--output_dir", out)
        assert r.returncode == 0, (pos, bit, r.stderr)
        assert "checkpoint_2/state.pb" in r.stderr and "resuming from the previous checkpoint" in r.stderr, (pos, bit,
                                                                                                            r.stderr)
        resumed_from(r, 1)
        got = {t.name: nh.to_array(t) for t in onnx.load(str(out / "trained_model.onnx")).graph.initializer}
        for name in want:
            np.testing.assert_array_equal(got[name], want[name], err_msg=f"flip at byte {pos} bit {bit}: {name}")
        detected += 1
        print(f"flip at byte {pos} bit {bit}: {r.stderr.split(' is ', 1)[1].split(';')[0][:120]}")
    print(f"bit flips detected: {detected}/10 in a {len(good)}-byte checkpoint")
    assert detected == 10


def test_checkpoint_without_checksum_is_accepted_with_a_warning(binary, task, tmp_path):
    """Format 1 (before checksums): read as before, with a warning that damage to it cannot be
    seen. A file of a format this ortmod does not know is refused by name, not taken as damage."""
    ck = tmp_path / "ck"
    common = trained_checkpoints(task, ck)
    state = ck / "checkpoint_2" / "state.pb"
    recs = read_records(state)
    assert recs[-1].name == "meta/checksum" and recs[-2].name == "meta/end"
    recs = recs[:-1]
    next(t for t in recs if t.name == "meta/format").CopyFrom(nh.from_array(np.array([1], np.int64), "meta/format"))
    write_records(state, recs)
    r = run_cli(*common, "--num_train_steps", "3")
    resumed_from(r, 2)
    assert "has no checksum (format 1" in r.stderr, r.stderr
    # a future format, intact: refused by name, no fall back
    ck = tmp_path / "ck2"
    common = trained_checkpoints(task, ck, steps=1)
    state = ck / "checkpoint_1" / "state.pb"
    recs = read_records(state)
    next(t for t in recs if t.name == "meta/format").CopyFrom(nh.from_array(np.array([3], np.int64), "meta/format"))
    write_records(state, recs)
    fails(run_cli(*common, "--num_train_steps", "3"), "has format 3; this ortmod reads formats 1 and 2")


@pytest.mark.parametrize("args,fragment", [
    (["--train_batch_size", str(2 ** 62), "--num_train_steps", "1"], "num_train_steps x train_batch_size"),
    (["--train_batch_size", str(2 ** 58), "--num_train_steps", "1"], "larger than a tensor can be"),
    (["--eval_batch_size", str(2 ** 62)], "eval_batch_size"),
])
def test_runner_refuses_huge_batch_sizes_before_allocating(binary, task, args, fragment):
    fails(run_cli("--model", task / "mlp.onnx", "--train_data_dir", task / "train", *args), fragment)
