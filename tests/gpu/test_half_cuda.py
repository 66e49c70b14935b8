"""fp16 and bf16 on the CUDA provider (issue 8).

- Op parity: each op runs on CUDA in bf16 / fp16 and on the CPU in fp32 from the same values
  (the inputs and output gradients rounded to the half format first), so the difference is
  what half storage costs: the CUDA kernels load to fp32, compute and accumulate in fp32 and
  round once on store. Tolerances: a few units of the format's rounding (bf16 2^-8, fp16 2^-11).
- A tiny GPT-2 in bf16 through ORTModule against eager CUDA bf16 (loss and gradients).
- model.half() training a few steps with ortmod.optim.FP16_Optimizer, against eager fp16 with the
  same optimizer.
"""
import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

import ortmod
from ortmod import ORTModule, _C
from ortmod.optim import FP16_Optimizer

R = np.random.default_rng(5)
HALF = [torch.bfloat16, torch.float16]
ONNX_HALF = {torch.bfloat16: TensorProto.BFLOAT16, torch.float16: TensorProto.FLOAT16}
# (rtol, atol) for outputs and gradients of O(1) values
TOL = {torch.bfloat16: (2e-2, 2e-2), torch.float16: (4e-3, 4e-3)}
INT_TYPES = {np.dtype("int64"): TensorProto.INT64, np.dtype("int32"): TensorProto.INT32, np.dtype("bool"): TensorProto.BOOL}


def f32(*shape):
    return np.asarray(R.standard_normal(shape), dtype=np.float32)


def pos(*shape):
    return (np.abs(R.standard_normal(shape)) + 0.5).astype(np.float32)


def float_initializer(a, name, ftype):
    """A float constant stored in ftype, the graph's float type (fp32, fp16 or bf16)."""
    a = np.ascontiguousarray(a, np.float32)
    if ftype == TensorProto.FLOAT16:
        return numpy_helper.from_array(a.astype(np.float16), name)
    if ftype == TensorProto.BFLOAT16:   # numpy has no bf16: torch rounds, the bits go raw
        bits = torch.from_numpy(a).to(torch.bfloat16).view(torch.int16).numpy()
        return helper.make_tensor(name, TensorProto.BFLOAT16, a.shape, bits.tobytes(), raw=True)
    return numpy_helper.from_array(a, name)


def typed_model(op, inputs, attrs, domain, ftype, const, n_outputs):
    """One node; float inputs typed ftype, the names in const become initializers (float ones in
    ftype too); None is an absent optional input."""
    graph_inputs, inits, names = [], [], []
    for name, a in inputs.items():
        if a is None:
            names.append("")
            continue
        names.append(name)
        if name in const:
            a = np.asarray(a)
            inits.append(float_initializer(a, name, ftype) if a.dtype.kind == "f" else numpy_helper.from_array(a, name))
        else:
            t = ftype if a.dtype.kind == "f" else INT_TYPES[a.dtype]
            graph_inputs.append(helper.make_tensor_value_info(name, t, None))
    outs = [f"out{i}" for i in range(n_outputs)]
    node = helper.make_node(op, names, outs, domain=domain, **(attrs or {}))
    g = helper.make_graph([node], "one_op", graph_inputs,
                          [helper.make_tensor_value_info(o, TensorProto.UNDEFINED, None) for o in outs],
                          initializer=inits)
    opsets = [helper.make_opsetid("", 20)] + ([helper.make_opsetid(domain, 1)] if domain else [])
    return helper.make_model(g, opset_imports=opsets).SerializeToString()


def rounded(a, dt):
    return torch.from_numpy(a).to(dt).float().numpy() if a.dtype.kind == "f" else a


def run_pair(op, inputs, dt, attrs=None, domain="", grad=(), const=(), n_outputs=1):
    """(CPU fp32 outputs, CUDA half outputs as fp32, CPU grads, CUDA grads) from the same rounded values."""
    inputs = {n: None if a is None else np.ascontiguousarray(a) for n, a in inputs.items()}
    feed_names = [n for n, a in inputs.items() if a is not None and n not in const]
    flags = [n in grad for n in feed_names]
    rin = {n: None if a is None else rounded(a, dt) for n, a in inputs.items()}
    # CPU, fp32
    ecpu = _C.Engine(typed_model(op, rin, attrs, domain, TensorProto.FLOAT, const, n_outputs),
                     flags if any(flags) else None, seed=3)
    caps, stash = ecpu.forward([rin[n] for n in feed_names], True)
    outs_cpu = [torch.from_dlpack(c).clone() for c in caps]
    dys = [torch.from_numpy(f32(*o.shape)).to(dt) if o.is_floating_point() and diff else None
           for o, diff in zip(outs_cpu, ecpu.output_differentiable)]
    grads_cpu = None
    if stash is not None:
        g = ecpu.backward(stash, [None if d is None else d.float().numpy() for d in dys])
        grads_cpu = [None if c is None else torch.from_dlpack(c).clone() for c in g]
    # CUDA, half
    egpu = _C.Engine(typed_model(op, rin, attrs, domain, ONNX_HALF[dt], const, n_outputs),
                     flags if any(flags) else None, seed=3)
    stream = torch.cuda.current_stream().cuda_stream
    feeds = [torch.from_numpy(rin[n]).to(dt).cuda() if rin[n].dtype.kind == "f" else torch.from_numpy(rin[n]).cuda()
             for n in feed_names]
    caps, stash = egpu.forward(feeds, True, stream)
    outs_gpu = [torch.from_dlpack(c) for c in caps]
    for o, c in zip(outs_gpu, outs_cpu):
        if c.is_floating_point():
            assert o.dtype == dt, f"{op}: CUDA output dtype {o.dtype}, expected {dt}"
    outs_gpu = [o.float().cpu() if o.is_floating_point() else o.cpu() for o in outs_gpu]
    grads_gpu = None
    if stash is not None:
        g = egpu.backward(stash, [None if d is None else d.cuda() for d in dys], stream)
        grads_gpu = [None if c is None else torch.from_dlpack(c) for c in g]
        for t in grads_gpu:
            assert t is None or t.dtype == dt, f"{op}: CUDA gradient dtype {t.dtype}, expected {dt}"
        grads_gpu = [None if t is None else t.float().cpu() for t in grads_gpu]
    return outs_cpu, outs_gpu, grads_cpu, grads_gpu


def check(op, inputs, dt, attrs=None, domain="", grad=(), const=(), n_outputs=1, scale=1.0, equal_nan=False):
    rtol, atol = TOL[dt]
    oc, og, gc, gg = run_pair(op, inputs, dt, attrs, domain, grad, const, n_outputs)
    for i, (a, b) in enumerate(zip(oc, og)):
        assert a.shape == b.shape, f"{op} output {i}: {tuple(a.shape)} vs {tuple(b.shape)}"
        if a.is_floating_point():
            torch.testing.assert_close(b, a, rtol=rtol * scale, atol=atol * scale, equal_nan=equal_nan,
                                       msg=f"{op} {dt} output {i}")
        else:
            assert torch.equal(a, b), f"{op} {dt} output {i}"
    if gc is not None:
        for i, (a, b) in enumerate(zip(gc, gg)):
            assert (a is None) == (b is None), f"{op} grad {i} presence"
            if a is not None:
                torch.testing.assert_close(b, a, rtol=rtol * scale, atol=atol * scale, msg=f"{op} {dt} grad {i}")


_R14 = np.random.default_rng(14)   # the norms' own draws: the other cases' stay as they were

CASES = [
    # GEMMs (fp32 accumulation), the batch-reduced gradient of a broadcast operand included
    ("MatMul", {"a": f32(3, 4, 16), "b": f32(16, 6)}, None, "", ("a", "b"), (), 2),
    ("MatMul", {"a": f32(2, 3, 4, 16), "b": f32(3, 16, 6)}, None, "", ("a", "b"), (), 2),
    ("Gemm", {"a": f32(4, 16), "b": f32(6, 16), "c": f32(6)}, {"transB": 1}, "", ("a", "b", "c"), (), 2),
    ("FusedMatMul", {"a": f32(2, 16, 4), "b": f32(2, 6, 16)}, {"transA": 1, "transB": 1, "alpha": 0.5}, "ortmod",
     ("a", "b"), (), 2),
    ("MatMulBias", {"x": f32(2, 3, 16), "w": f32(16, 8), "b": f32(8)}, None, "ortmod", ("x", "w", "b"), (), 2),
    ("MatMulBiasGelu", {"x": f32(2, 3, 16), "w": f32(16, 8), "b": f32(8)}, {"approximate": "tanh"}, "ortmod",
     ("x", "w", "b"), (), 2),
    ("MatMulBiasGelu", {"x": f32(2, 3, 16), "w": f32(16, 8), "b": f32(8)}, None, "ortmod", ("x", "w", "b"), (), 2),
    # elementwise and broadcast (SumToShape in the gradients)
    ("Add", {"a": f32(3, 4, 5), "b": f32(4, 1)}, None, "", ("a", "b"), (), 1),
    ("Mul", {"a": f32(3, 4, 5), "b": f32(5)}, None, "", ("a", "b"), (), 1),
    ("Div", {"a": f32(3, 4), "b": pos(3, 4)}, None, "", ("a", "b"), (), 1),
    ("Pow", {"a": pos(3, 4), "b": f32(3, 4)}, None, "", ("a", "b"), (), 2),
    ("Where", {"c": R.random((3, 4)) > 0.5, "x": f32(3, 4), "y": f32(4)}, None, "", ("x", "y"), (), 1),
    ("Gelu", {"x": f32(4, 5)}, {"approximate": "tanh"}, "", ("x",), (), 1),
    ("Tanh", {"x": f32(4, 5)}, None, "", ("x",), (), 1),
    ("Sigmoid", {"x": f32(4, 5)}, None, "", ("x",), (), 1),
    ("Exp", {"x": f32(4, 5)}, None, "", ("x",), (), 2),
    ("Sqrt", {"x": pos(4, 5)}, None, "", ("x",), (), 1),
    ("BiasGelu", {"x": f32(6, 8), "b": f32(8)}, None, "ortmod", ("x", "b"), (), 1),
    # normalizations and reductions (fp32 statistics)
    ("Softmax", {"x": f32(3, 37)}, None, "", ("x",), (), 1),
    ("LogSoftmax", {"x": f32(3, 300)}, None, "", ("x",), (), 1),
    ("LayerNormalization", {"x": f32(6, 64), "s": f32(64), "b": f32(64)}, {"epsilon": 1e-5}, "", ("x", "s", "b"), (), 2),
    ("SimplifiedLayerNormalization", {"x": f32(6, 64), "s": f32(64)}, None, "ortmod", ("x", "s"), (), 2),
    ("ReduceSum", {"x": f32(3, 40, 5), "axes": np.array([1], np.int64)}, None, "", ("x",), ("axes",), 2),
    ("ReduceMean", {"x": f32(3, 4, 50), "axes": np.array([0, 2], np.int64)}, {"keepdims": 0}, "", ("x",), ("axes",), 1),
    ("ReduceL2", {"x": _R14.standard_normal((3, 40, 5)).astype(np.float32), "axes": np.array([1], np.int64)}, None,
     "", ("x",), ("axes",), 2),
    ("ReduceL1", {"x": _R14.standard_normal((3, 200)).astype(np.float32), "axes": np.array([1], np.int64)}, None,
     "", ("x",), ("axes",), 2),
    ("ReduceLogSumExp", {"x": _R14.standard_normal((3, 300)).astype(np.float32) * 4, "axes": np.array([1], np.int64)},
     {"keepdims": 0}, "", ("x",), ("axes",), 2),
    ("ReduceLogSumExp", {"x": _R14.standard_normal((3, 4, 5)).astype(np.float32), "axes": np.array([0], np.int64)},
     None, "", ("x",), ("axes",), 1),
    # data movement
    ("Transpose", {"x": f32(2, 3, 4)}, {"perm": [2, 0, 1]}, "", ("x",), (), 1),
    ("Concat", {"a": f32(2, 3), "b": f32(2, 5)}, {"axis": 1}, "", ("a", "b"), (), 1),
    ("Slice", {"x": f32(6, 8), "s": np.array([1, 7], np.int64), "e": np.array([5, 0], np.int64),
               "ax": np.array([0, 1], np.int64), "st": np.array([2, -2], np.int64)}, None, "", ("x",),
     ("s", "e", "ax", "st"), 1),
    ("Expand", {"x": f32(3, 1), "sh": np.array([2, 3, 4], np.int64)}, None, "", ("x",), ("sh",), 1),
    ("Gather", {"x": f32(10, 4), "i": np.array([[1, 9], [-1, 1]], np.int64)}, {"axis": 0}, "", ("x",), (), 1),
]


@pytest.mark.parametrize("dt", HALF, ids=["bf16", "fp16"])
@pytest.mark.parametrize("op,inputs,attrs,domain,grad,const,scale", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_op_half_matches_cpu_fp32(op, inputs, attrs, domain, grad, const, scale, dt):
    check(op, inputs, dt, attrs, domain, grad, const, scale=scale)


@pytest.mark.parametrize("dt", HALF, ids=["bf16", "fp16"])
def test_cast_half_on_cuda_matches_cpu_bit_for_bit(dt):
    x = f32(1000) * np.exp(R.uniform(-20, 20, 1000)).astype(np.float32)
    for to in (ONNX_HALF[dt], TensorProto.FLOAT):
        src = x if to != TensorProto.FLOAT else rounded(x, dt)
        ftype = TensorProto.FLOAT if to != TensorProto.FLOAT else ONNX_HALF[dt]
        m = typed_model("Cast", {"x": src}, {"to": to}, "", ftype, (), 1)
        feed_gpu = torch.from_numpy(src).cuda() if ftype == TensorProto.FLOAT else torch.from_numpy(src).to(dt).cuda()
        feed_cpu = src if ftype == TensorProto.FLOAT else torch.from_numpy(src).to(dt)
        (c,), _ = _C.Engine(m, None).forward([feed_cpu], False)
        (g,), _ = _C.Engine(m, None).forward([feed_gpu], False, torch.cuda.current_stream().cuda_stream)
        a, b = torch.from_dlpack(c), torch.from_dlpack(g).cpu()
        assert a.dtype == b.dtype and torch.equal(a, b)


@pytest.mark.parametrize("dt", HALF, ids=["bf16", "fp16"])
def test_softmax_cross_entropy_half_logits(dt):
    x, y = f32(16, 50), R.integers(0, 50, 16).astype(np.int64)
    y[3] = -100
    check("SoftmaxCrossEntropyLoss", {"x": x, "y": y}, dt, {"reduction": "mean", "ignore_index": -100}, "", ("x",))


@pytest.mark.parametrize("dt", HALF, ids=["bf16", "fp16"])
def test_fused_attention_half(dt):
    q, k, v = f32(2, 3, 17, 16), f32(2, 3, 19, 16), f32(2, 3, 19, 8)
    check("FusedAttention", {"q": q, "k": k, "v": v}, dt, {"scale": 0.25}, "ortmod", ("q", "k", "v"), scale=2)


@pytest.mark.parametrize("dt", HALF, ids=["bf16", "fp16"])
def test_gather_gradient_accumulates_in_fp32(dt):
    """2000 lookups of 3 rows: each gradient row sums ~700 values. Accumulated in fp32 and
    rounded once it stays within one rounding of the fp32 sum; half additions would drift."""
    idx = R.integers(0, 3, 2000).astype(np.int64)
    oc, og, gc, gg = run_pair("Gather", {"x": f32(3, 8), "i": idx}, dt, {"axis": 0}, "", ("x",))
    ref = gc[0]
    torch.testing.assert_close(gg[0], ref, rtol=2 ** -7 if dt == torch.bfloat16 else 2 ** -10, atol=1e-3)


def spike(n, at):
    x = f32(1, 1, n)
    x[..., at] = 100.0   # the maximum of every window that holds it
    return x


# Each case sends ~1000 additions into some elements (outputs, or the gradient of input 0).
SCATTER_SUMS = [
    ("GatherElements", {"x": f32(3, 8), "i": R.integers(0, 3, (2000, 8)).astype(np.int64)}, {"axis": 0}, ("x",), ("i",)),
    ("ScatterElements", {"x": f32(3, 8), "i": R.integers(0, 3, (2000, 8)).astype(np.int64), "u": f32(2000, 8)},
     {"axis": 0, "reduction": "add"}, (), ("i",)),
    ("MaxPool", {"x": spike(2000, 1000)}, {"kernel_shape": [999], "strides": [1]}, ("x",), ()),
    ("Pad", {"x": f32(2, 2), "p": np.array([0, 1000, 0, 1000], np.int64)}, {"mode": "edge"}, ("x",), ("p",)),
]


@pytest.mark.parametrize("dt", HALF)
@pytest.mark.parametrize("case", SCATTER_SUMS, ids=[c[0] for c in SCATTER_SUMS])
def test_scatter_adds_accumulate_in_fp32(case, dt):
    """Summed in fp32 and rounded once, a result many additions reach stays within one rounding
    of the fp32 sum; added in fp16/bf16 (half atomics) it drifts far past that."""
    op, inputs, attrs, grad, const = case
    oc, og, gc, gg = run_pair(op, inputs, dt, attrs, "", grad, const)
    tol = dict(rtol=2 ** -7 if dt == torch.bfloat16 else 2 ** -10, atol=1e-3)
    for a, b in zip(oc, og):
        torch.testing.assert_close(b, a, **tol)
    for a, b in zip(gc or [], gg or []):
        if a is not None:
            torch.testing.assert_close(b, a, **tol)


def attention_inputs(b, L, S, D, Dv, mask=None, kt=False, shared_kv=False, dropout=None):
    """FusedAttention's inputs (Q, K or K^T, V, mask?, f0-f2 absent, ratio?, training_mode?)."""
    kv_b = (1, 1) if shared_kv else b
    k = f32(*kv_b, D, S) if kt else f32(*kv_b, S, D)
    inputs = {"q": f32(*b, L, D), "k": k, "v": f32(*kv_b, S, Dv), "m": mask, "f0": None, "f1": None, "f2": None}
    if dropout is not None:
        inputs.update(ratio=np.float32(dropout), tm=np.array(True))
    return inputs


def fully_masked_rows(L, S, rows):
    m = np.where(R.random((L, S)) < 0.3, -np.inf, 0.0).astype(np.float32)
    m[rows] = -np.inf
    return m


# (id, inputs, attrs, gradients wanted, constant inputs): the flash kernels' edges — rows and key
# tiles cut short, head dims padded to 64 and to 128, causal, additive masks (broadcast and per
# batch), K given transposed, K/V shared over the batch, dropout, fully masked rows.
FLASH_CASES = [
    ("causal-70", attention_inputs((2, 2), 70, 70, 64, 64), {"scale": 0.125, "causal": 1}, ("q", "k", "v"), ()),
    ("mask-2d-wide-heads", attention_inputs((2,), 33, 45, 80, 72, mask=f32(33, 45)), {"scale": 0.1},
     ("q", "k", "v"), ()),
    ("mask-per-batch-causal", attention_inputs((2, 3), 40, 40, 32, 16, mask=f32(2, 1, 40, 40)),
     {"scale": 0.2, "causal": 1}, ("q", "k", "v"), ()),
    ("heads-128-causal", attention_inputs((2,), 20, 40, 128, 128), {"scale": 0.09, "causal": 1}, ("q", "k", "v"), ()),
    ("k-transposed", attention_inputs((3,), 17, 50, 24, 40, kt=True), {"scale": 0.2, "k_transposed": 1},
     ("q", "k", "v"), ()),
    ("shared-kv", attention_inputs((2, 2), 20, 36, 16, 16, shared_kv=True), {"scale": 0.25}, ("q",), ()),
    ("dropout", attention_inputs((2, 2), 48, 40, 64, 64, dropout=0.3), {"scale": 0.125, "causal": 1},
     ("q", "k", "v"), ("ratio", "tm")),
    ("no-queries", attention_inputs((2,), 0, 9, 16, 16), {"scale": 0.25}, ("q", "k", "v"), ()),
    ("nan-to-zero", attention_inputs((2,), 24, 30, 64, 32, mask=fully_masked_rows(24, 30, [0, 5])),
     {"scale": 0.125, "nan_to_zero": 1}, ("q", "k", "v"), ()),
]


@pytest.mark.parametrize("dt", HALF)
@pytest.mark.parametrize("case", FLASH_CASES, ids=[c[0] for c in FLASH_CASES])
def test_flash_attention_half(case, dt):
    """fp16/bf16 FusedAttention runs on cuda/flash.cu's tensor-core kernels; against the CPU in fp32."""
    _, inputs, attrs, grad, const = case
    check("FusedAttention", inputs, dt, attrs, "ortmod", grad, const, n_outputs=1, scale=2)


@pytest.mark.parametrize("dt", HALF)
def test_flash_attention_matches_the_materialized_path(dt):
    """The same call through flash.cu and through attention.cu's cuBLAS path (forced with
    ortmod.options.cuda_attention, ORTMOD_CUDA_ATTENTION=materialized): the two agree to the half format's rounding."""
    inputs = attention_inputs((2, 2), 50, 50, 64, 64, dropout=0.2)
    attrs = {"scale": 0.125, "causal": 1}
    state = R.bit_generator.state   # run_pair draws the output gradient: the same one for both
    with ortmod.options.overridden(cuda_attention="materialized"):
        _, om, _, gm = run_pair("FusedAttention", inputs, dt, attrs, "ortmod", ("q", "k", "v"), ("ratio", "tm"))
    R.bit_generator.state = state
    _, of, _, gf = run_pair("FusedAttention", inputs, dt, attrs, "ortmod", ("q", "k", "v"), ("ratio", "tm"))
    rtol, atol = TOL[dt]
    for a, b in zip(om + gm, of + gf):
        torch.testing.assert_close(b, a, rtol=2 * rtol, atol=2 * atol)


# ---- whole models -----------------------------------------------------------------------------------

def tiny_gpt2(dt):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=256, n_positions=64, resid_pdrop=0.0,
                                  embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    return transformers.GPT2LMHeadModel(cfg).to(device="cuda", dtype=dt)


def assert_grads_close(ref, ort, min_cos=0.99, max_rel=5e-2):
    for (n, p), q in zip(ref.named_parameters(), ort.parameters()):
        assert q.grad is not None and q.grad.dtype == p.grad.dtype, n
        a, b = p.grad.double().flatten(), q.grad.double().flatten()
        if a.norm() == 0:
            assert b.norm() == 0, n
            continue
        cos = float(a @ b / (a.norm() * b.norm()))
        rel = float((a - b).norm() / a.norm())
        assert cos > min_cos and rel < max_rel, f"{n}: cosine {cos:.4f}, relative error {rel:.3g}"


def test_gpt2_tiny_bf16_matches_eager_bf16():
    torch.manual_seed(0)
    ref = tiny_gpt2(torch.bfloat16)
    ort_model = tiny_gpt2(torch.bfloat16)
    ort_model.load_state_dict(ref.state_dict())
    ort = ORTModule(ort_model)
    ids = torch.randint(0, 256, (4, 32), device="cuda")
    l_ref = ref(input_ids=ids, labels=ids).loss
    l_ort = ort(input_ids=ids, labels=ids).loss
    assert l_ort.dtype == l_ref.dtype
    torch.testing.assert_close(l_ort.float(), l_ref.float(), rtol=2e-2, atol=2e-2)
    l_ref.backward()
    l_ort.backward()
    assert_grads_close(ref, ort)
    assert ort._ortmod_export_count == 1


def test_model_half_trains_with_fp16_optimizer_like_eager():
    """model.half() + FP16_Optimizer (fp32 masters, dynamic loss scale) around torch's AdamW:
    the same steps through ORTModule and eager, from the same weights on the same batch."""
    torch.manual_seed(0)
    ref = tiny_gpt2(torch.float16)
    ort_model = tiny_gpt2(torch.float16)
    ort_model.load_state_dict(ref.state_dict())
    ort = ORTModule(ort_model)
    ids = torch.randint(0, 256, (4, 32), device="cuda")

    def make_opt(m):
        return FP16_Optimizer(torch.optim.AdamW(m.parameters(), lr=3e-3), init_loss_scale=2.0 ** 10)

    runs = []
    for model, opt in ((ref, make_opt(ref)), (ort, make_opt(ort))):
        losses, scales = [], []
        for _ in range(5):
            loss = model(input_ids=ids, labels=ids).loss
            opt.backward(loss)
            opt.step()
            opt.zero_grad()
            losses.append(float(loss))
            scales.append(opt.loss_scale)
        runs.append((losses, scales))
    (l_ref, s_ref), (l_ort, s_ort) = runs
    assert all(np.isfinite(l_ort)), l_ort
    assert s_ort == s_ref, (s_ref, s_ort)
    assert l_ort[-1] < l_ort[0] - 0.05, l_ort          # it learns the batch
    np.testing.assert_allclose(l_ort, l_ref, rtol=2e-2, atol=2e-2)
    for p in ort.parameters():
        assert p.dtype == torch.float16 and p.is_cuda


def test_autocast_bf16_mlp_matches_eager_autocast():
    """torch.autocast on CUDA: the export records autocast's Casts, the engine runs the bf16 GEMMs
    and GELU, and the fp32 parameters get fp32 gradients, as eager autocast gives them."""
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 32)).cuda()
    ort = ORTModule(copy_module(ref))
    x = torch.randn(16, 64, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y_ref, y = ref(x), ort(x)
    assert y.dtype == y_ref.dtype == torch.bfloat16
    torch.testing.assert_close(y.float(), y_ref.float(), rtol=2e-2, atol=2e-2)
    y_ref.float().square().mean().backward()
    y.float().square().mean().backward()
    assert_grads_close(ref, ort)


def copy_module(m):
    import copy
    return copy.deepcopy(m)


# The Llama fusions (fused_llama.cu) from their own draws, run after every other case (in the
# emulator's half group too), so that no other case's inputs or output gradients moved.
_R18 = np.random.default_rng(18)
LLAMA_CASES = [
    ("SwiGLU", {"g": _R18.standard_normal((6, 8)).astype(np.float32) * 3,
                "u": _R18.standard_normal((6, 8)).astype(np.float32)}, None, "ortmod", ("g", "u"), (), 1),
    ("FusedRotary", {"x": _R18.standard_normal((2, 3, 5, 8)).astype(np.float32),
                     "cs": _R18.standard_normal((2, 1, 5, 8)).astype(np.float32),
                     "sn": _R18.standard_normal((2, 1, 5, 8)).astype(np.float32),
                     "split": np.array([4], np.int64), "end": np.array([8], np.int64)}, None, "ortmod",
     ("x", "cs", "sn"), ("split", "end"), 1),
]


@pytest.mark.parametrize("dt", HALF, ids=["bf16", "fp16"])
@pytest.mark.parametrize("op,inputs,attrs,domain,grad,const,scale", LLAMA_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(LLAMA_CASES)])
def test_llama_op_half_matches_cpu_fp32(op, inputs, attrs, domain, grad, const, scale, dt):
    check(op, inputs, dt, attrs, domain, grad, const, scale=scale)
