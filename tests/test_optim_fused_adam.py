"""FusedAdam: parity with torch.optim.AdamW (mode 2) and with plain-torch references of
ORT's modes 0 and 1; half-precision parameters; grads, groups, state and errors.

Tolerances: fp32 parameters rtol 1e-6 / atol 1e-7 after 50 steps (the kernels do torch's
operations in torch's order in fp32, so differences are at rounding level); fp16
parameters rtol 1e-3, bf16 rtol 8e-3 (one unit in the last place of the stored value:
kernel and reference both update in fp32 and round once per step).
"""
import copy
import io
import math

import pytest
import torch
import torch.nn as nn

import ortmod._C as _C
from ortmod.optim import AdamWMode, FusedAdam

STEPS = 50


@pytest.fixture(autouse=True)
def torch_single_thread():
    """The references are many small torch ops; on a busy 2-core machine torch's OpenMP
    threads make each cost milliseconds. FusedAdam keeps its own threads."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)

SHAPES = [(100, 400), (17,), (3, 5, 7), (1,), (33, 65)]   # 40k elements: threaded; odd sizes: scalar tails


def make_params(dtype=torch.float32, shapes=SHAPES):
    return [nn.Parameter((torch.randn(s) * 0.5).to(dtype)) for s in shapes]


def grad_stream(shapes, steps, dtype=torch.float32, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [[(torch.randn(s, generator=g) * 0.1).to(dtype) for s in shapes] for _ in range(steps)]


def ref_step(p, g, m, v, step, lr, b1, b2, eps, wd, mode, bias_correction=True):
    """ORT's three rules in plain torch, fp32, in place on p, m, v."""
    bc1 = 1 - b1 ** step if bias_correction else 1.0
    bc2 = 1 - b2 ** step if bias_correction else 1.0
    if mode == 0:
        g = g + wd * p
    if mode == 2:
        p.mul_(1 - lr * wd)
    m.mul_(b1).add_(g, alpha=1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    if mode == 2:
        p.addcdiv_(m, v.sqrt() / math.sqrt(bc2) + eps, value=-lr / bc1)
    else:
        p.addcdiv_(m, v.sqrt() + eps, value=-lr * math.sqrt(bc2) / bc1)
    if mode == 1:
        p.add_(p, alpha=-lr * wd)


def report(name, a, b):
    d = (a.float() - b.float()).abs().max().item()
    print(f"{name}: max abs diff {d:.3e}")


def test_mode2_matches_torch_adamw_50_steps():
    params = make_params()
    ref = [nn.Parameter(p.detach().clone()) for p in params]
    opt = FusedAdam(params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01,
                    adam_w_mode=AdamWMode.ADAMW_TORCH)
    topt = torch.optim.AdamW(ref, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01, foreach=False)
    for grads in grad_stream(SHAPES, STEPS):
        for p, r, g in zip(params, ref, grads):
            p.grad, r.grad = g.clone(), g.clone()
        opt.step()
        topt.step()
    for i, (p, r) in enumerate(zip(params, ref)):
        report(f"param {i}", p, r)
        torch.testing.assert_close(p, r, rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(opt.state[p]["exp_avg"], topt.state[r]["exp_avg"], rtol=1e-6, atol=1e-8)
        torch.testing.assert_close(opt.state[p]["exp_avg_sq"], topt.state[r]["exp_avg_sq"], rtol=1e-6, atol=1e-10)


@pytest.mark.parametrize("mode", [AdamWMode.ADAM_L2_REGULARIZATION, AdamWMode.ADAMW_TRANSFORMERS, AdamWMode.ADAMW_TORCH])
@pytest.mark.parametrize("bias_correction", [True, False])
def test_modes_match_reference(mode, bias_correction):
    lr, b1, b2, eps, wd = 2e-3, 0.85, 0.99, 1e-6, 0.05
    params = make_params()
    ref = [p.detach().clone() for p in params]
    ms = [torch.zeros_like(p) for p in ref]
    vs = [torch.zeros_like(p) for p in ref]
    opt = FusedAdam(params, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, adam_w_mode=mode,
                    bias_correction=bias_correction)
    for t, grads in enumerate(grad_stream(SHAPES, STEPS), start=1):
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()
        for r, g, m, v in zip(ref, grads, ms, vs):
            ref_step(r, g, m, v, t, lr, b1, b2, eps, wd, int(mode), bias_correction)
    for i, (p, r) in enumerate(zip(params, ref)):
        report(f"mode {int(mode)} param {i}", p, r)
        torch.testing.assert_close(p.detach(), r, rtol=1e-6, atol=1e-7)
    assert opt.param_groups[0]["step"] == STEPS


@pytest.mark.parametrize("dtype,rtol", [(torch.float16, 1e-3), (torch.bfloat16, 8e-3)])
def test_half_params_match_fp32_math_reference(dtype, rtol):
    lr, b1, b2, eps, wd = 1e-2, 0.9, 0.999, 1e-6, 0.01
    params = make_params(dtype)
    ref = [p.detach().clone() for p in params]
    ms = [torch.zeros(p.shape) for p in ref]
    vs = [torch.zeros(p.shape) for p in ref]
    opt = FusedAdam(params, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd, adam_w_mode=AdamWMode.ADAMW_TORCH)
    for t, grads in enumerate(grad_stream(SHAPES, 10, dtype), start=1):
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()
        for r, g, m, v in zip(ref, grads, ms, vs):
            r32 = r.float()
            ref_step(r32, g.float(), m, v, t, lr, b1, b2, eps, wd, 2)
            r.copy_(r32)    # round once per step, as the kernel does
    for i, (p, r, m) in enumerate(zip(params, ref, ms)):
        assert p.dtype == dtype and opt.state[p]["exp_avg"].dtype == torch.float32
        report(f"{dtype} param {i}", p, r)
        torch.testing.assert_close(p.detach(), r, rtol=rtol, atol=1e-5)
        torch.testing.assert_close(opt.state[p]["exp_avg"], m, rtol=1e-5, atol=1e-7)


def test_fp32_params_with_half_grads():
    params = make_params()
    ref = [p.detach().clone() for p in params]
    ms = [torch.zeros_like(p) for p in ref]
    vs = [torch.zeros_like(p) for p in ref]
    opt = FusedAdam(params, lr=1e-3, adam_w_mode=1, weight_decay=0.1)
    grads = grad_stream(SHAPES, 3, torch.float16)
    for t, gs in enumerate(grads, start=1):
        opt.step(grads=[gs], grad_scale=4.0)      # as FP16_Optimizer calls it: fp16 grads, loss scale 4
        for r, g, m, v in zip(ref, gs, ms, vs):
            ref_step(r, g.float() / 4.0, m, v, t, 1e-3, 0.9, 0.999, 1e-6, 0.1, 1)
    for p, r in zip(params, ref):
        torch.testing.assert_close(p.detach(), r, rtol=1e-6, atol=1e-7)


def test_per_group_hyperparameters():
    a, b = make_params(shapes=[(40, 30), (30,)]), make_params(shapes=[(20, 10), (10,)])
    ra, rb = [nn.Parameter(p.detach().clone()) for p in a], [nn.Parameter(p.detach().clone()) for p in b]
    opt = FusedAdam([{"params": a}, {"params": b, "lr": 5e-3, "betas": (0.8, 0.99), "eps": 1e-7,
                                     "weight_decay": 0.2}],
                    lr=1e-3, eps=1e-8, weight_decay=0.01, adam_w_mode=AdamWMode.ADAMW_TORCH)
    topt = torch.optim.AdamW([{"params": ra}, {"params": rb, "lr": 5e-3, "betas": (0.8, 0.99), "eps": 1e-7,
                                                "weight_decay": 0.2}], lr=1e-3, eps=1e-8, weight_decay=0.01,
                             foreach=False)
    shapes = [p.shape for p in a + b]
    for grads in grad_stream(shapes, 20):
        for p, r, g in zip(a + b, ra + rb, grads):
            p.grad, r.grad = g.clone(), g.clone()
        opt.step()
        topt.step()
    for p, r in zip(a + b, ra + rb):
        torch.testing.assert_close(p, r, rtol=1e-6, atol=1e-7)


def test_params_without_grad_are_skipped():
    params = make_params(shapes=[(5, 4), (4,)])
    frozen_before = params[1].detach().clone()
    opt = FusedAdam(params, lr=1e-2)
    params[0].grad = torch.ones(5, 4)
    opt.step()
    assert torch.equal(params[1].detach(), frozen_before)
    assert params[1] not in opt.state and params[0] in opt.state
    assert not torch.equal(params[0].detach(), frozen_before.new_zeros(0))


def test_sparse_gradients_raise():
    emb = nn.Embedding(10, 4, sparse=True)
    emb(torch.tensor([1, 2])).sum().backward()
    opt = FusedAdam(emb.parameters())
    with pytest.raises(RuntimeError, match="sparse gradients"):
        opt.step()


@pytest.mark.parametrize("set_grad_none", [True, False])
def test_zero_grad_honours_set_grad_none(set_grad_none):
    lin = nn.Linear(3, 2)
    opt = FusedAdam(lin.parameters(), set_grad_none=set_grad_none)
    lin(torch.randn(4, 3)).sum().backward()
    opt.step()
    opt.zero_grad()
    for p in lin.parameters():
        if set_grad_none:
            assert p.grad is None
        else:
            assert p.grad is not None and not p.grad.any()


def test_state_dict_round_trip_resumes_identically():
    shapes = [(30, 20), (20,)]
    params = make_params(shapes=shapes)
    opt = FusedAdam(params, lr=1e-3, weight_decay=0.01)
    stream = grad_stream(shapes, 10)
    for grads in stream[:5]:
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()
    saved_params = [p.detach().clone() for p in params]
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    saved = torch.load(buf)                      # weights_only=True by default: plain types only
    for grads in stream[5:]:
        for p, g in zip(params, grads):
            p.grad = g.clone()
        opt.step()
    resumed = [nn.Parameter(s.clone()) for s in saved_params]
    opt2 = FusedAdam(resumed, lr=123.0)          # hyperparameters come back from the state dict
    opt2.load_state_dict(saved)
    assert opt2.param_groups[0]["step"] == 5 and opt2.param_groups[0]["lr"] == 1e-3
    for grads in stream[5:]:
        for p, g in zip(resumed, grads):
            p.grad = g.clone()
        opt2.step()
    for p, r in zip(params, resumed):
        assert torch.equal(p, r)


def test_half_params_state_stays_fp32_after_load():
    p = nn.Parameter(torch.randn(8, dtype=torch.float16))
    opt = FusedAdam([p])
    p.grad = torch.randn(8, dtype=torch.float16)
    opt.step()
    opt2 = FusedAdam([p])
    opt2.load_state_dict(copy.deepcopy(opt.state_dict()))   # torch would cast moments to fp16
    assert opt2.state[p]["exp_avg"].dtype == torch.float32
    p.grad = torch.randn(8, dtype=torch.float16)
    opt2.step()


def test_threads_do_not_change_results():
    shapes = [(300, 300), (7,)]
    outs = []
    for threads in (1, 2):
        torch.manual_seed(0)
        params = make_params(shapes=shapes)
        opt = FusedAdam(params, lr=1e-3, weight_decay=0.1, adam_w_mode=0)
        old = _C.optim_num_threads()
        _C.optim_set_num_threads(threads)
        try:
            for grads in grad_stream(shapes, 3):
                for p, g in zip(params, grads):
                    p.grad = g
                opt.step()
        finally:
            _C.optim_set_num_threads(old)
        outs.append([p.detach().clone() for p in params])
    for a, b in zip(*outs):
        assert torch.equal(a, b)


def test_non_contiguous_param_is_updated_in_place():
    base = torch.randn(6, 4)
    p = nn.Parameter(base.t())                       # a transposed (non-contiguous) parameter
    assert not p.is_contiguous()
    r = p.detach().clone()
    m, v = torch.zeros(4, 6), torch.zeros(4, 6)
    opt = FusedAdam([p], lr=1e-2, adam_w_mode=2)
    g = torch.randn(4, 6)
    p.grad = g.clone()
    opt.step()
    ref_step(r, g, m, v, 1, 1e-2, 0.9, 0.999, 1e-6, 0.0, 2)
    torch.testing.assert_close(p.detach(), r, rtol=1e-6, atol=1e-7)


def test_bad_arguments():
    with pytest.raises(ValueError):
        FusedAdam([nn.Parameter(torch.zeros(2))], betas=(1.0, 0.9))
    with pytest.raises(ValueError):
        FusedAdam([nn.Parameter(torch.zeros(2))], adam_w_mode=7)
    p = nn.Parameter(torch.zeros(2, dtype=torch.float64))
    p.grad = torch.ones(2, dtype=torch.float64)
    with pytest.raises(TypeError, match="float32, float16 or bfloat16"):
        FusedAdam([p]).step()


def test_c_binding_errors_are_python_exceptions():
    p, g, m = torch.zeros(4), torch.zeros(4), torch.zeros(4)
    with pytest.raises(ValueError, match="expected 1"):
        _C.adam_step([p], [], [m], [m], 1e-3, 0.9, 0.999, 1e-6, 0.0, True, 2, 1)
    with pytest.raises(ValueError, match="exp_avg"):
        _C.adam_step([p], [g], [torch.zeros(3)], [m], 1e-3, 0.9, 0.999, 1e-6, 0.0, True, 2, 1)
    with pytest.raises(ValueError, match="mode"):
        _C.adam_step([p], [g], [m], [m.clone()], 1e-3, 0.9, 0.999, 1e-6, 0.0, True, 5, 1)
    with pytest.raises(ValueError, match="step"):
        _C.adam_step([p], [g], [m], [m.clone()], 1e-3, 0.9, 0.999, 1e-6, 0.0, True, 2, 0)
    with pytest.raises(ValueError, match="float32"):
        _C.adam_step([p], [g], [m.half()], [m.clone()], 1e-3, 0.9, 0.999, 1e-6, 0.0, True, 2, 1)
    with pytest.raises(ValueError, match="contiguous"):
        _C.adam_step([torch.zeros(4, 4).t()], [torch.zeros(4, 4)], [torch.zeros(16)], [torch.zeros(16)],
                     1e-3, 0.9, 0.999, 1e-6, 0.0, True, 2, 1)
    with pytest.raises(TypeError):
        _C.adam_step([object()], [g], [m], [m], 1e-3, 0.9, 0.999, 1e-6, 0.0, True, 2, 1)
