"""fp16 / bf16 on the CPU side (issues 8 and 18): the shape rules take half-precision models, Cast
converts exactly as torch does (round to nearest even), what only moves or converts half tensors
runs as it is, and half math runs its fp32 kernel on widened copies, rounded once on store (the
CUDA kernels' rule): elementwise results match eager bit for bit.

Whole models against eager are in test_half_cpu.py; the CUDA kernels in tests/gpu/ (test_half_cuda.py)."""
import io
import warnings

import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import TensorProto, helper, numpy_helper

import ortmod
from ortmod import DebugOptions, ORTModule, _C
from ortmod.capture import flatten, torchscript, errors
from oputil import _Cap

HALF_ONNX = {torch.float16: TensorProto.FLOAT16, torch.bfloat16: TensorProto.BFLOAT16}
ONNX_TYPE = {torch.float32: TensorProto.FLOAT, torch.float64: TensorProto.DOUBLE, **HALF_ONNX}


def graph_model(nodes, inputs, outputs, inits=()):
    """inputs: [(name, torch dtype)]; outputs: names (dtypes inferred by the engine)."""
    g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(n, ONNX_TYPE[d], None) for n, d in inputs],
                          [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outputs],
                          initializer=list(inits))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)]).SerializeToString()


def forward(model, feeds, grad=None):
    eng = _C.Engine(model, grad)
    caps, stash = eng.forward([t.contiguous() for t in feeds], grad is not None)
    return eng, [torch.from_dlpack(c).clone() for c in caps], stash


def bits(t):
    return t.view(torch.int16)


# ---- Cast: fp32/fp64 <-> fp16/bf16 on the CPU -------------------------------------------------------

def special_values():
    """Values where rounding goes wrong first: ties (to even), subnormals of both formats,
    overflow to inf, the largest finites, signed zeros, inf and NaN."""
    u = np.array([0x3F808000, 0x3F818000, 0x3F80C000, 0x3F807FFF,    # bf16 ties and neighbours
                  0x3F801000, 0x3F803000, 0x3F802000,                # fp16 ties (13 dropped bits)
                  0x00000001, 0x007FFFFF, 0x33800000, 0x33000000,   # fp32 subnormals, fp16 subnormal edges
                  0x387FC000, 0x38800000, 0x477FE000, 0x477FF000,   # fp16 min normal, max, first overflow
                  0x7F7FFFFF, 0x7F7F8000, 0x80000000, 0x00000000,   # bf16 overflow to inf, signed zeros
                  0x7F800000, 0xFF800000, 0x7FC00000], dtype=np.uint32)
    x = u.view(np.float32)
    rng = np.random.default_rng(8)
    wide = (rng.standard_normal(2000) * np.exp(rng.uniform(-30, 30, 2000))).astype(np.float32)
    return torch.from_numpy(np.concatenate([x, -x, wide]))


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
def test_cast_float32_to_half_rounds_as_torch(dt):
    x = special_values()
    _, (y,), _ = forward(graph_model([helper.make_node("Cast", ["x"], ["y"], to=HALF_ONNX[dt])], [("x", torch.float32)],
                                     ["y"]), [x])
    assert y.dtype == dt
    want = x.to(dt)
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(y), nan)
    assert torch.equal(bits(y)[~nan], bits(want)[~nan]), "fp32 -> half differs from torch's rounding"


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
def test_cast_half_to_float_is_exact_for_every_value(dt):
    """Every one of the 65536 half bit patterns widens exactly (NaNs stay NaN)."""
    h = torch.arange(-32768, 32768, dtype=torch.int32).to(torch.int16).view(dt)
    _, (y,), _ = forward(graph_model([helper.make_node("Cast", ["x"], ["y"], to=TensorProto.FLOAT)], [("x", dt)], ["y"]),
                         [h])
    want = h.float()
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(y), nan)
    assert torch.equal(y[~nan].view(torch.int32), want[~nan].view(torch.int32))


@pytest.mark.parametrize("src,dst", [(torch.float16, torch.bfloat16), (torch.bfloat16, torch.float16),
                                     (torch.float64, torch.float16), (torch.float64, torch.bfloat16),
                                     (torch.float16, torch.float64)])
def test_cast_between_half_and_other_floats(src, dst):
    x = special_values().to(src)
    _, (y,), _ = forward(graph_model([helper.make_node("Cast", ["x"], ["y"], to=ONNX_TYPE[dst])], [("x", src)], ["y"]),
                         [x])
    want = x.to(torch.float32).to(dst) if src == torch.float64 else x.to(dst)   # fp64 -> half goes through fp32
    nan = torch.isnan(want)
    assert torch.equal(torch.isnan(y), nan)
    assert torch.equal(y[~nan], want[~nan])


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
def test_cast_round_trip_and_its_gradient_run_on_the_cpu(dt):
    """x -> half -> float32 * w: the Casts (forward and their backward Casts) run on the CPU;
    the gradient passes through the rounding unchanged, as torch's does."""
    nodes = [helper.make_node("Cast", ["x"], ["h"], to=HALF_ONNX[dt]),
             helper.make_node("Cast", ["h"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["f", "w"], ["y"])]
    x, w = torch.randn(7, 5), torch.randn(7, 5)
    eng, (y,), stash = forward(graph_model(nodes, [("x", torch.float32), ("w", torch.float32)], ["y"]), [x, w],
                               grad=[True, True])
    torch.testing.assert_close(y, x.to(dt).float() * w, rtol=0, atol=0)
    dy = torch.randn(7, 5)
    gx, gw = [torch.from_dlpack(c) for c in eng.backward(stash, [dy])]
    torch.testing.assert_close(gx, (dy * w).to(dt).float(), rtol=0, atol=0)   # the backward Cast rounds too
    torch.testing.assert_close(gw, dy * x.to(dt).float(), rtol=0, atol=0)


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
def test_data_movement_ops_take_half_on_the_cpu(dt):
    """Transpose, Slice, Concat and their gradients (Transpose, SliceGrad, ConcatGrad) only move
    elements: they run on half tensors on the CPU, bit for bit."""
    nodes = [helper.make_node("Transpose", ["x"], ["t"], perm=[1, 0]),
             helper.make_node("Slice", ["t", "s", "e"], ["u"]),
             helper.make_node("Concat", ["u", "w"], ["y"], axis=0)]
    inits = [numpy_helper.from_array(np.array([1], np.int64), "s"), numpy_helper.from_array(np.array([3], np.int64), "e")]
    x, w = torch.randn(4, 5).to(dt), torch.randn(3, 4).to(dt)
    eng, (y,), stash = forward(graph_model(nodes, [("x", dt), ("w", dt)], ["y"], inits), [x, w], grad=[True, True])
    assert y.dtype == dt and torch.equal(y, torch.cat([x.t()[1:3], w]))
    dy = torch.randn(5, 4).to(dt)
    gx, gw = [torch.from_dlpack(c) for c in eng.backward(stash, [dy])]
    want = torch.zeros(5, 4, dtype=dt)
    want[1:3] = dy[:2]
    assert gx.dtype == dt and torch.equal(gx, want.t()) and torch.equal(gw, dy[2:])


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("raw", [True, False], ids=["raw_data", "int32_data"])
def test_half_initializers_and_constants_import(dt, raw):
    """FLOAT16/BFLOAT16 tensors in both TensorProto encodings (raw bytes, or one value per
    int32_data entry), as an initializer and as a Constant node's value."""
    v = torch.tensor([1.5, -0.1, 65504.0 if dt == torch.float16 else 3e38, 2 ** -20]).to(dt)
    # raw: the bytes; otherwise onnx.helper stores each value's bits in int32_data itself
    vals = v.view(torch.int16).numpy().tobytes() if raw else v.float().tolist()
    init = helper.make_tensor("c", HALF_ONNX[dt], [4], vals, raw=raw)
    nodes = [helper.make_node("Constant", [], ["k"], value=helper.make_tensor("kv", HALF_ONNX[dt], [4], vals, raw=raw)),
             helper.make_node("Cast", ["c"], ["c32"], to=TensorProto.FLOAT),
             helper.make_node("Cast", ["k"], ["k32"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["c32", "x"], ["y"]),
             helper.make_node("Add", ["k32", "x"], ["z"])]
    _, (y, z), _ = forward(graph_model(nodes, [("x", torch.float32)], ["y", "z"], [init]), [torch.zeros(4)])
    assert torch.equal(y, v.float()) and torch.equal(z, v.float())


# ---- half-precision math on the CPU: fp32 kernels on widened copies, rounded once ------------------

@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
def test_half_arithmetic_on_cpu_rounds_once_like_eager(dt):
    """Eager's CPU kernels widen half to fp32 per element and round the result: so do ortmod's, so
    Add/Mul/Div/Sub/Neg agree bit for bit (NaN, inf and subnormals included)."""
    nodes = [helper.make_node(op, ["a", "b"], [op.lower()]) for op in ("Add", "Mul", "Div", "Sub")]
    nodes.append(helper.make_node("Neg", ["a"], ["neg"]))
    model = graph_model(nodes, [("a", dt), ("b", dt)], ["add", "mul", "div", "sub", "neg"])
    a = special_values()[:2000].to(dt)
    b = special_values().flip(0)[:2000].to(dt)
    _, got, _ = forward(model, [a, b])
    for name, g, want in zip(("add", "mul", "div", "sub", "neg"), got, (a + b, a * b, a / b, a - b, -a)):
        assert g.dtype == dt
        same = (bits(g) == bits(want)) | (g.isnan() & want.isnan())
        assert bool(same.all()), f"{name}: {int((~same).sum())} elements differ, e.g. {g[~same][:4]} vs {want[~same][:4]}"


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
def test_half_conv_and_pool_run_on_the_cpu(dt):
    """Conv (a GEMM: products of half values are exact in fp32, summed in fp32) and MaxPool in
    half: the fp32 convolution of the same values, rounded once."""
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], name="the_conv", pads=[1, 1, 1, 1]),
             helper.make_node("MaxPool", ["c"], ["y"], name="the_pool", kernel_shape=[2, 2], strides=[2, 2])]
    x, w = torch.randn(2, 3, 8, 8).to(dt), torch.randn(4, 3, 3, 3).to(dt)
    _, (y,), _ = forward(graph_model(nodes, [("x", dt), ("w", dt)], ["y"]), [x, w])
    want = F.max_pool2d(F.conv2d(x.double(), w.double(), padding=1), 2).to(dt)
    assert y.dtype == dt
    torch.testing.assert_close(y.float(), want.float(), rtol=2 ** -7 if dt == torch.bfloat16 else 2 ** -10, atol=1e-5)


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
def test_half_gradient_rules_emit_constants_in_the_value_dtype(dt):
    """Sqrt's gradient emits 0.5: in the model's dtype, so the backward graph stays half (the
    execution graph shows it); on the CPU the plan then stops at the first half kernel."""
    model = graph_model([helper.make_node("Sqrt", ["x"], ["y"])], [("x", dt)], ["y"])
    eng = _C.Engine(model, [True])
    ex = onnx.load_from_string(eng.export_onnx("execution"))
    scalars = [numpy_helper.to_array(t) for t in ex.graph.initializer if t.data_type == HALF_ONNX[dt] and not t.dims]
    assert any(float(np.asarray(s, dtype=np.float32)) == 0.5 for s in scalars), \
        [(t.name, t.data_type) for t in ex.graph.initializer]
    x = (torch.rand(4) + 1).to(dt)
    caps, stash = eng.forward([x], True)
    (dx,) = eng.backward(stash, [torch.ones(4, dtype=dt)])
    dx = torch.from_dlpack(dx)
    want = (0.5 / x.float().sqrt()).to(dt)    # dy * 0.5 / sqrt(x), in fp32, rounded once
    assert dx.dtype == dt
    torch.testing.assert_close(dx.float(), want.float(), rtol=2 ** -7, atol=0)


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
def test_half_constants_fold_through_float32(dt):
    """Half math known at plan time (constants) folds on the CPU — through fp32, rounded once, as
    the CUDA kernels compute — so the CPU plan below runs: only Cast touches half at run time."""
    a, b = torch.tensor([1.1, -2.3, 7.7]).to(dt), torch.tensor([3.3, 0.7, 1e-3]).to(dt)
    inits = [numpy_helper.from_array(a.float().numpy(), "a32"), numpy_helper.from_array(b.float().numpy(), "b32")]
    nodes = [helper.make_node("Cast", ["a32"], ["a"], to=HALF_ONNX[dt]),
             helper.make_node("Cast", ["b32"], ["b"], to=HALF_ONNX[dt]),
             helper.make_node("Mul", ["a", "b"], ["ab"]),          # half math on constants: folded
             helper.make_node("Abs", ["ab"], ["s"]),
             helper.make_node("Cast", ["s"], ["s32"], to=TensorProto.FLOAT),
             helper.make_node("Add", ["x", "s32"], ["y"])]
    _, (y,), _ = forward(graph_model(nodes, [("x", torch.float32)], ["y"], inits), [torch.zeros(3)])
    want = ((a.float() * b.float()).to(dt).float().abs().to(dt)).float()
    torch.testing.assert_close(y, want, rtol=0, atol=0)


class RoundedMLP(nn.Module):
    """fp32 weights and math; activations rounded to a half format in between (what a
    mixed-precision simulation or a quantize-dequantize step exports): runs on the CPU."""

    def __init__(self, dt):
        super().__init__()
        self.dt = dt
        self.fc1, self.fc2 = nn.Linear(12, 16), nn.Linear(16, 3)

    def forward(self, x, y):
        h = F.gelu(self.fc1(x)).to(self.dt).to(torch.float32)
        return F.cross_entropy(self.fc2(h), y)


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
def test_rounding_casts_train_on_the_cpu_like_eager(dt):
    torch.manual_seed(0)
    ref = RoundedMLP(dt)
    ort = ORTModule(RoundedMLP(dt))
    ort.module.load_state_dict(ref.state_dict())
    o1, o2 = torch.optim.SGD(ref.parameters(), lr=0.1), torch.optim.SGD(ort.parameters(), lr=0.1)
    for _ in range(4):
        x, y = torch.randn(32, 12), torch.randint(0, 3, (32,))
        for m, o in ((ref, o1), (ort, o2)):
            o.zero_grad()
            loss = m(x, y)
            loss.backward()
            o.step()
        torch.testing.assert_close(ort.module.fc1.weight.grad, ref.fc1.weight.grad, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(ort.module.fc2.weight, ref.fc2.weight, rtol=1e-4, atol=1e-5)


# ---- half-precision models compile: every shape rule of forward and backward takes them ---------------

def tiny_gpt2(dt):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    return transformers.GPT2LMHeadModel(cfg).to(dt)


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
def test_half_gpt2_compiles_fuses_and_trains_on_the_cpu(dt, tmp_path):
    """A half GPT-2 through ORTModule on the CPU: exported in its own dtype (ortmod's SDPA
    symbolic), fused (attention, GELU with half constants, LayerNorm), differentiated, planned
    and run (its parity with eager is test_half_cpu.py's)."""
    model = ORTModule(tiny_gpt2(dt), DebugOptions(save_onnx=True, onnx_prefix="g", save_path=str(tmp_path)))
    ids = torch.randint(0, 256, (2, 16))
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert all(p.grad is not None and p.grad.dtype == dt for p in model.parameters())
    ex = onnx.load(str(tmp_path / "g_execution_model_training.onnx"))
    ops = [n.op_type for n in ex.graph.node]
    assert ops.count("FusedAttention") == 2 and ops.count("FusedAttentionGrad") == 2, ops
    # the written-out GELU (half constants) became Gelu, then rode into its Conv1D's GEMM
    assert ops.count("MatMulBiasGelu") == 2 and "GeluGrad" not in ops and "Softmax" not in ops, ops
    # the only float32 compute is the loss (transformers upcasts the logits) and its gradient
    casts = [n for n in ex.graph.node if n.op_type == "Cast"]
    to = sorted(helper.get_attribute_value(a) for n in casts for a in n.attribute if a.name == "to")
    assert to == sorted([TensorProto.FLOAT, HALF_ONNX[dt]]), to
    params = [i for i in ex.graph.input if i.name.startswith("module.")]
    assert params and all(i.type.tensor_type.elem_type == HALF_ONNX[dt] for i in params)


# ---- ortmod's scaled_dot_product_attention symbolic -------------------------------------------------

class SDPA(nn.Module):
    def __init__(self, mode):
        super().__init__()
        self.mode = mode
        self.proj = nn.Linear(8, 24)

    def forward(self, x, mask=None):
        B, L, _ = x.shape
        q, k, v = self.proj(x).view(B, L, 3, 2, 4).permute(2, 0, 3, 1, 4)
        if self.mode == "causal":
            o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        elif self.mode == "scale":
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=0.3)
        else:
            o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return o.sum(dim=(1, 3))


@pytest.mark.parametrize("mode,mask", [("causal", None), ("plain", "bool"), ("plain", "float"), ("scale", "bool"),
                                       ("plain", None)])
def test_sdpa_symbolic_fuses_and_matches_eager(mode, mask, tmp_path):
    torch.manual_seed(1)
    ref = SDPA(mode)
    ort = ORTModule(SDPA(mode), DebugOptions(save_onnx=True, onnx_prefix="a", save_path=str(tmp_path)))
    ort.module.load_state_dict(ref.state_dict())
    x = torch.randn(3, 5, 8)
    args = [x]
    if mask == "bool":
        m = torch.rand(3, 1, 5, 5) > 0.3
        m[..., 0] = True
        args.append(m)
    elif mask == "float":
        args.append(torch.randn(3, 1, 5, 5))
    out_ref, out_ort = ref(*args), ort(*args)
    torch.testing.assert_close(out_ort, out_ref, rtol=1e-4, atol=1e-5)
    out_ref.sum().backward()
    out_ort.sum().backward()
    for (n, p), q in zip(ref.named_parameters(), ort.module.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=n)
    ops = [n.op_type for n in onnx.load(str(tmp_path / "a_optimized_training.onnx")).graph.node]
    assert "FusedAttention" in ops and "Softmax" not in ops, ops


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
def test_sdpa_symbolic_keeps_the_query_dtype(dt):
    """torch's own symbolic builds the scale and masks in float32 and its type promotion casts
    the scores (and later layers) to float32; ortmod's stays in the query's dtype."""
    m = SDPA("causal").to(dt)
    x = torch.randn(2, 5, 8, dtype=dt)
    flat = flatten.flatten_inputs((x,), {})
    exported = torchscript.export(m, flat)
    g = onnx.load_from_string(exported.onnx_bytes).graph
    # float32 values: Constants and Casts to float32, and what Sqrt/Div make of them (the
    # 1/sqrt(head dim) computation); none may reach the attention's math
    f32 = set()
    for n in g.node:
        attrs = {a.name: helper.get_attribute_value(a) for a in n.attribute}
        if (n.op_type == "Constant" and attrs["value"].data_type == TensorProto.FLOAT) or \
                (n.op_type == "Cast" and attrs["to"] == TensorProto.FLOAT) or \
                (n.op_type in ("Sqrt", "Div") and any(i in f32 for i in n.input)):
            f32.update(n.output)
        elif n.op_type != "Cast":
            assert not any(i in f32 for i in n.input), f"{n.op_type} {n.name} reads a float32 value"


def test_sdpa_symbolic_is_registered_only_while_ortmod_exports():
    registration = pytest.importorskip("torch.onnx._internal.torchscript_exporter.registration")
    pytest.importorskip("torch.onnx._internal.torchscript_exporter.symbolic_opset14")   # fills the registry
    before = registration.registry.get_function_group("aten::scaled_dot_product_attention").get(20)
    with torchscript._export_symbolics():
        during = registration.registry.get_function_group("aten::scaled_dot_product_attention").get(20)
    after = registration.registry.get_function_group("aten::scaled_dot_product_attention").get(20)
    assert during is torchscript._sdpa_symbolic and after is before and before is not torchscript._sdpa_symbolic


# ---- devices --------------------------------------------------------------------------------------

def test_capture_accepts_cuda_devices():
    assert "cuda" in flatten.SUPPORTED_DEVICE_TYPES and "cpu" in flatten.SUPPORTED_DEVICE_TYPES


def test_mixed_devices_are_refused_naming_both_tensors():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 2)
            self.register_buffer("scale", torch.ones(2, device="meta"))

        def forward(self, x):
            return self.fc(x) * 2

    with pytest.raises(errors.UnsupportedDeviceError, match=r"buffer 'scale' is on meta but .* is on cpu"):
        flatten.check_one_device(M(), flatten.flatten_inputs((torch.randn(3, 4),), {}))


# ---- autocast ------------------------------------------------------------------------------------

def test_autocast_state_is_part_of_the_export_key():
    """A graph traced under autocast records its Casts (bf16 math); one traced outside it is fp32.
    Each state gets its own export: the fp32 graph is never reused under autocast, nor the other
    way round."""
    torch.manual_seed(0)
    m = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    model = ORTModule(m)
    x = torch.randn(3, 8)
    y = model(x)
    assert y.dtype == torch.float32 and model._ortmod_export_count == 1
    with torch.autocast("cpu", dtype=torch.bfloat16):
        yb = model(x)
        want = m(x)
    assert yb.dtype == want.dtype == torch.bfloat16 and model._ortmod_export_count == 2
    torch.testing.assert_close(yb.float(), want.float(), rtol=2 ** -6, atol=2 ** -8)
    torch.testing.assert_close(model(x), y, rtol=0, atol=0)   # outside autocast again: the fp32 graph, cached
    assert model._ortmod_export_count == 2
