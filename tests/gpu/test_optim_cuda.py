"""ortmod.optim on CUDA parameters (cuda/optim.cu through the engine's optimizer calls):
FusedAdam against torch.optim.AdamW and against itself on the CPU, FP16_Optimizer's unscale,
check and step on CUDA against the same on the CPU, and no synchronization in FusedAdam.step."""
import pytest
import torch

from ortmod.optim import AdamWMode, FP16_Optimizer, FusedAdam

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOL = {torch.float32: (1e-5, 1e-6), torch.float16: (2e-3, 1e-4), torch.bfloat16: (1e-2, 1e-3)}


def shapes():
    return [(7,), (64, 33), (8192,), (8193,), (0,), (3, 5, 7)] + [(11 * (k + 1),) for k in range(26)]


def params_on(device, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).to(device=device, dtype=dtype).requires_grad_() for s in shapes()]


def grads_like(ps, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(p.shape, generator=g).to(device=p.device, dtype=p.dtype) for p in ps]


def test_fused_adam_matches_torch_adamw_on_cuda():
    ps, ref = params_on("cuda", torch.float32), params_on("cuda", torch.float32)
    opt = FusedAdam(ps, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1, adam_w_mode=AdamWMode.ADAMW_TORCH)
    topt = torch.optim.AdamW(ref, lr=1e-2, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.1)
    for step in range(5):
        for p, q, g in zip(ps, ref, grads_like(ps, step)):
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        topt.step()
    for p, q in zip(ps, ref):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mode", list(AdamWMode))
def test_fused_adam_cuda_matches_cpu(dtype, mode):
    cu, cpu = params_on("cuda", dtype), params_on("cpu", dtype)
    kw = dict(lr=1e-2, eps=1e-8, weight_decay=0.05, adam_w_mode=mode)
    ocu, ocpu = FusedAdam(cu, **kw), FusedAdam(cpu, **kw)
    for step in range(3):
        for p, q, g in zip(cu, cpu, grads_like(cpu, step)):
            p.grad, q.grad = g.cuda(), g
        ocu.step(grad_scale=2.0)
        ocpu.step(grad_scale=2.0)
    for p, q in zip(cu, cpu):
        torch.testing.assert_close(p.cpu(), q, rtol=TOL[dtype][0], atol=TOL[dtype][1])


def test_fused_adam_step_does_not_synchronize():
    ps = params_on("cuda", torch.bfloat16)
    opt = FusedAdam(ps, lr=1e-3)
    for p, g in zip(ps, grads_like(ps, 0)):
        p.grad = g
    opt.step()   # state allocation
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        opt.step()
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp16_optimizer_on_cuda_matches_cpu(dtype):
    """Half parameters with fp32 master weights: the same steps (one with an overflow, skipped) on
    CUDA and on the CPU."""
    runs = []
    for device in ("cuda", "cpu"):
        ps = params_on(device, dtype)
        opt = FP16_Optimizer(FusedAdam(ps, lr=1e-2, weight_decay=0.01), init_loss_scale=2.0 ** 8)
        for step in range(4):
            gs = grads_like(ps, step)
            if step == 2:
                gs[3][0] = float("inf")
            for p, g in zip(ps, gs):
                p.grad = g * opt.loss_scale
            opt.step()
        runs.append(([p.detach().cpu() for p in ps], opt.loss_scale))
    (cu, scale_cu), (cpu, scale_cpu) = runs
    assert scale_cu == scale_cpu
    for a, b in zip(cu, cpu):
        torch.testing.assert_close(a, b, rtol=TOL[dtype][0], atol=TOL[dtype][1])
