"""bf16 and fp16 computed on the CPU (issue 18): `.bfloat16()` / `.half()` models and
`torch.autocast("cpu", dtype=torch.bfloat16)` train through ORTModule on the CPU provider.

The CPU kernels compute in fp32 on widened copies of the half tensors and round each result
once (ops/fold.c), the CUDA kernels' rule. Eager PyTorch rounds at other places (after each op
of what ortmod fuses; its GEMMs and reductions sum in other orders), so the two cannot agree
bit for bit. The referee is an fp64 copy of the same rounded weights on the same inputs: each
of ortmod's gradients must be about as close to the fp64 one as eager's half-precision
gradient is (relative to its own size), and the same after SGD steps for the parameters.
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from ortmod import ORTModule

HALF = [torch.bfloat16, torch.float16]
UNIT = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}   # unit roundoff


def rel(a, ref):
    a, ref = a.detach().double(), ref.detach().double()
    return ((a - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def cast_batch(batch, dt):
    return {k: v.to(dt) if v.is_floating_point() else v for k, v in batch.items()}


def check_close_as_eager(what, got, eager, ref, dt, slack=2.0):
    """got (ortmod, half) is as close to ref (fp64) as eager (half) is, within slack, or within two
    units of roundoff of the value's own size."""
    e_o, e_e = rel(got, ref), rel(eager, ref)
    bound = max(slack * e_e, 2 * UNIT[dt])
    assert e_o <= bound, f"{what}: ortmod's relative error {e_o:.2e} > {bound:.2e} (eager's {e_e:.2e})"
    return e_o, e_e


def half_parity(make_model, batches, loss_of, dt, steps=3, lr=0.05, autocast=False):
    """Eager and ORTModule copies of make_model() in dt (or fp32 under CPU autocast to dt), and the
    fp64 referee from the same weights: first-step gradients, then parameters after SGD steps."""
    torch.manual_seed(0)
    base = make_model()
    if not autocast:
        base = base.to(dt)
    ref = copy.deepcopy(base).double()
    eager = copy.deepcopy(base)
    ort = ORTModule(copy.deepcopy(base))
    models = {"ref": ref, "eager": eager, "ort": ort}
    opts = {k: torch.optim.SGD(m.parameters(), lr=lr) for k, m in models.items()}
    names = [n for n, _ in eager.named_parameters()]
    worst = (0.0, "")
    for step in range(steps):
        batch = batches[step % len(batches)]
        losses = {}
        for k, m in models.items():
            b = cast_batch(batch, torch.float64 if k == "ref" else (torch.float32 if autocast else dt))
            if autocast and k != "ref":
                with torch.autocast("cpu", dtype=dt):
                    losses[k] = loss_of(m, b)
            else:
                losses[k] = loss_of(m, b)
            losses[k].backward()
        check_close_as_eager(f"step {step} loss", losses["ort"], losses["eager"], losses["ref"], dt)
        if step == 0:
            grads = {k: [p.grad for p in m.parameters()] for k, m in models.items()}
            biggest = max(g.double().norm().item() for g in grads["ref"])
            for n, go, ge, gr in zip(names, grads["ort"], grads["eager"], grads["ref"]):
                assert go is not None and go.dtype == ge.dtype, f"{n}: gradient {go} vs eager {ge.dtype}"
                if gr.double().norm().item() < 1e-6 * biggest:
                    continue   # a gradient that is zero in exact arithmetic: only rounding noise on both sides
                e_o, _ = check_close_as_eager(f"step 0 grad of {n}", go, ge, gr, dt)
                worst = max(worst, (e_o, n))
        for o in opts.values():
            o.step()
            o.zero_grad()
    for n, po, pe, pr in zip(names, ort.parameters(), eager.parameters(), ref.parameters()):
        assert po.dtype == pe.dtype
        check_close_as_eager(f"parameter {n} after {steps} steps", po, pe, pr, dt)
    print(f"{dt}: worst first-step gradient relative error {worst[0]:.2e} ({worst[1]})")
    return ort


def test_the_criterion_fails_a_gradient_off_by_two_percent():
    ref = torch.randn(1000, dtype=torch.float64)
    eager = ref.to(torch.bfloat16)
    check_close_as_eager("as eager", eager.clone(), eager, ref, torch.bfloat16)
    with pytest.raises(AssertionError, match="relative error"):
        check_close_as_eager("off", (ref * 1.02).to(torch.bfloat16), eager, ref, torch.bfloat16)


# ---- models ---------------------------------------------------------------------------------------

class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.ln, self.fc2 = nn.Linear(24, 64), nn.LayerNorm(64), nn.Linear(64, 5)

    def forward(self, x, y):
        return F.cross_entropy(self.fc2(self.ln(F.gelu(self.fc1(x)))), y)


def mlp_batches():
    g = torch.Generator().manual_seed(1)
    return [{"x": torch.randn(33, 24, generator=g), "y": torch.randint(0, 5, (33,), generator=g)} for _ in range(3)]


def mlp_loss(m, b):
    return m(b["x"], b["y"])


@pytest.mark.parametrize("dt", HALF)
def test_half_mlp_trains_on_the_cpu_like_eager(dt):
    half_parity(MLP, mlp_batches(), mlp_loss, dt)


def test_autocast_bf16_mlp_trains_on_the_cpu_like_eager():
    ort = half_parity(MLP, mlp_batches(), mlp_loss, torch.bfloat16, autocast=True)
    assert all(p.dtype == torch.float32 for p in ort.parameters())


def test_half_cnn_trains_on_the_cpu_like_eager():
    from test_models_cnn import TinyResNet, make_batches

    batches = [{"x": x, "y": y} for x, y in make_batches()]
    ort = half_parity(TinyResNet, batches, lambda m, b: m(b["x"], b["y"]), torch.bfloat16)
    stats = {n: b for n, b in ort.module.named_buffers() if n.endswith("running_var")}
    assert stats and all(b.dtype == torch.bfloat16 and not torch.equal(b, torch.ones_like(b)) for b in stats.values())


def test_half_gpt2_trains_on_the_cpu_like_eager():
    from test_models_gpt2 import make_batches, make_gpt2, lm_loss

    half_parity(make_gpt2, make_batches(), lm_loss, torch.bfloat16)


def test_half_bert_trains_on_the_cpu_like_eager():
    from test_models_bert import cls_loss, make_batches, make_bert

    half_parity(make_bert, make_batches(), cls_loss, torch.bfloat16)


def test_half_llama_trains_on_the_cpu_like_eager():
    from test_models_rotary import FAMILIES, lm_loss, make_batches

    half_parity(FAMILIES["llama"], make_batches(), lm_loss, torch.bfloat16)


def test_autocast_bf16_gpt2_trains_on_the_cpu_like_eager():
    from test_models_gpt2 import make_batches, make_gpt2, lm_loss

    half_parity(make_gpt2, make_batches(), lm_loss, torch.bfloat16, autocast=True)


# ---- the bf16 GEMM kernel (ops/gemm_bf16.c) ---------------------------------------------------------

def gemm_engine(ta, tb, alpha, beta):
    from onnx import TensorProto, helper

    from ortmod import _C
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], transA=ta, transB=tb, alpha=alpha, beta=beta)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(x, TensorProto.FLOAT, None) for x in "abc"],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return _C.Engine(helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)]).SerializeToString(), None)


def bf16_avx512():
    with open("/proc/cpuinfo") as f:
        return " avx512_bf16" in f.read()


@pytest.mark.parametrize("M,N,K", [(33, 47, 701), (257, 129, 64), (1, 1000, 1999), (100, 3, 4001), (64, 64, 257)])
@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_float32_gemm_of_bf16_values_takes_the_bf16_kernel_exactly(M, N, K, ta, tb):
    """float32 operands whose values are all bf16 values (what a bf16 node's widened copies are):
    the bf16 kernel computes the same products, summed in fp32 — fp32-level agreement with fp64;
    one value bf16 cannot hold, or a bf16 subnormal, sends the product to sgemm instead."""
    from ortmod import _C
    torch.manual_seed(M * N + K + ta + 2 * tb)
    a = (torch.randn(K, M) if ta else torch.randn(M, K)).bfloat16().float()
    b = (torch.randn(N, K) if tb else torch.randn(K, N)).bfloat16().float()
    c = torch.randn(M, N)
    eng = gemm_engine(ta, tb, 0.75, 0.5)
    A, B = (a.T if ta else a).double(), (b.T if tb else b).double()
    want = 0.75 * A @ B + 0.5 * c.double()
    scale = (0.75 * A.abs() @ B.abs() + 0.5 * c.double().abs()).clamp_min(1e-30)
    for case in ("bf16", "inexact", "subnormal"):
        x = a.clone()
        if case == "inexact":
            x.view(-1)[-1] += 2.0 ** -20 * x.view(-1)[-1].abs().clamp_min(1)   # low bits set, last element
        if case == "subnormal":
            x.view(-1)[x.numel() // 2] = 2.0 ** -130                           # a bf16 subnormal
        Aw = (x.T if ta else x).double()
        want = 0.75 * Aw @ B + 0.5 * c.double()
        before = _C.gemm_bf16_count()
        caps, _ = eng.forward([x, b, c], False)
        y = torch.from_dlpack(caps[0]).double()
        used = _C.gemm_bf16_count() - before
        assert used == (1 if case == "bf16" and bf16_avx512() else 0), (case, used)
        err = ((y - want).abs() / scale).max().item()
        assert err < 2e-6 * max(1, K ** 0.5 / 8), (case, err)


def test_autocast_bf16_cnn_trains_on_the_cpu_like_eager():
    """CPU autocast runs conv in bf16 and keeps batch_norm mixed (bf16 input, fp32 parameters and
    running statistics): the engine takes that form, and the fp32 buffers are updated in place."""
    from test_models_cnn import TinyResNet, make_batches

    batches = [{"x": x, "y": y} for x, y in make_batches()]
    ort = half_parity(TinyResNet, batches, lambda m, b: m(b["x"], b["y"]), torch.bfloat16, autocast=True)
    stats = {n: b for n, b in ort.module.named_buffers() if n.endswith("running_var")}
    assert stats and all(b.dtype == torch.float32 and not torch.equal(b, torch.ones_like(b)) for b in stats.values())
