"""FP16_Optimizer: the loss-scale schedule step by step, overflow skips, fused
check/unscale/clip, fp32 master weights for fp16/bf16 models, checkpoints, and wrapping
optimizers of other kinds."""
import copy
import io
import math
import warnings

import pytest
import torch
import torch.nn as nn

from ortmod.optim import FP16_Optimizer, FusedAdam
from ortmod.optim.fp16_optimizer import FP16_Optimizer as FP16_Optimizer_direct


@pytest.fixture(autouse=True)
def torch_single_thread():
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def tiny(dtype=torch.float32):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).to(dtype)


def set_grads(model, value_fn):
    for p in model.parameters():
        p.grad = value_fn(p)


def test_importable_from_both_places():
    assert FP16_Optimizer is FP16_Optimizer_direct


def test_defaults():
    opt = FP16_Optimizer(torch.optim.SGD(tiny().parameters(), lr=0.1))
    assert opt.loss_scale == 2.0 ** 16
    assert opt.scale_window == 2000 and opt.scale_factor == 2.0 and opt.min_loss_scale == 1.0


def test_backward_scales_the_loss():
    model = tiny()
    x = torch.randn(4, 6)
    model(x).sum().backward()
    plain = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    opt = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), init_loss_scale=1024.0)
    opt.backward(model(x).sum())
    for p, g in zip(model.parameters(), plain):
        torch.testing.assert_close(p.grad, g * 1024.0)


def test_scale_schedule_and_overflow_skips_step_by_step():
    model = tiny()
    opt = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), init_loss_scale=8.0, scale_window=3)
    # step: 1..10; inf gradient on steps 4, 8 and 9 (NaN on 9)
    bad = {4: math.inf, 8: -math.inf, 9: math.nan}
    expected_scale_after = {1: 8, 2: 8, 3: 16, 4: 8, 5: 8, 6: 8, 7: 16, 8: 8, 9: 4, 10: 4}
    for step in range(1, 11):
        before = [p.detach().clone() for p in model.parameters()]
        set_grads(model, lambda p: torch.full_like(p, opt.loss_scale))   # unscaled gradient: 1
        if step in bad:
            next(iter(model.parameters())).grad[0, 0] = bad[step]
        opt.step()
        changed = any(not torch.equal(b, p) for b, p in zip(before, model.parameters()))
        print(f"step {step}: overflow={opt.overflow} loss_scale={opt.loss_scale}")
        assert opt.overflow == (step in bad)
        assert changed == (step not in bad)
        if step not in bad:       # SGD on unscaled grads of 1: p -= 0.1
            for b, p in zip(before, model.parameters()):
                torch.testing.assert_close(p.detach(), b - 0.1)
        assert opt.loss_scale == expected_scale_after[step]
    assert opt.skipped_steps == 3


def test_scale_floor_and_ceiling():
    model = tiny()
    opt = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), init_loss_scale=4.0, scale_window=1,
                         max_loss_scale=16.0)
    for expected in (2.0, 1.0, 1.0, 1.0):
        set_grads(model, lambda p: torch.full_like(p, math.inf))
        opt.step()
        assert opt.loss_scale == expected
    for expected in (2.0, 4.0, 8.0, 16.0, 16.0):
        set_grads(model, torch.ones_like)
        opt.step()
        assert opt.loss_scale == expected


def test_static_loss_scale():
    model = tiny()
    opt = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), init_loss_scale=128.0,
                         dynamic_loss_scale=False, scale_window=1)
    set_grads(model, lambda p: torch.full_like(p, math.inf))
    opt.step()
    set_grads(model, torch.ones_like)
    opt.step()
    assert opt.loss_scale == 128.0


@pytest.mark.parametrize("inner", ["sgd", "fused"])
def test_unscale_and_clip_match_torch(inner):
    ref, model = tiny(), tiny()
    x = torch.randn(16, 6)
    if inner == "sgd":
        ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
        opt = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1), init_loss_scale=256.0, clip_grad_norm=0.5)
    else:
        ref_opt = FusedAdam(ref.parameters(), lr=1e-2, adam_w_mode=2)
        opt = FP16_Optimizer(FusedAdam(model.parameters(), lr=1e-2, adam_w_mode=2), init_loss_scale=256.0,
                             clip_grad_norm=0.5)
    for _ in range(3):
        ref_opt.zero_grad()
        (ref(x) ** 2).sum().backward()
        norm = torch.nn.utils.clip_grad_norm_(ref.parameters(), 0.5)
        ref_opt.step()
        opt.zero_grad()
        opt.backward((model(x) ** 2).sum())
        opt.step()
        assert opt.last_grad_norm == pytest.approx(float(norm), rel=1e-5)
        for a, b in zip(ref.parameters(), model.parameters()):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("inner", ["fused", "adamw"])
def test_half_model_keeps_fp32_master_weights(dtype, inner):
    """The half model trains through fp32 masters: its params are the masters rounded, and
    the masters follow an fp32 run on the same (unscaled) gradients."""
    model = tiny(dtype)
    ref = [p.detach().float().clone().requires_grad_() for p in model.parameters()]
    if inner == "fused":
        opt = FP16_Optimizer(FusedAdam(model.parameters(), lr=1e-3, adam_w_mode=2, weight_decay=0.01),
                             init_loss_scale=64.0)
        ref_opt = FusedAdam(ref, lr=1e-3, adam_w_mode=2, weight_decay=0.01)
    else:
        opt = FP16_Optimizer(torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01),
                             init_loss_scale=64.0)
        ref_opt = torch.optim.AdamW(ref, lr=1e-3, weight_decay=0.01)
    masters = [p for g in opt.param_groups for p in g["params"]]
    assert all(m.dtype == torch.float32 for m in masters)
    g = torch.Generator().manual_seed(3)
    for step in range(200):          # small updates that a half parameter alone would round away
        grads = [torch.randn(p.shape, generator=g) * 1e-2 for p in model.parameters()]
        for p, r, gr in zip(model.parameters(), ref, grads):
            p.grad = (gr * opt.loss_scale).to(dtype)
            r.grad = p.grad.float() / opt.loss_scale
        opt.step()
        ref_opt.step()
    for p, m, r in zip(model.parameters(), masters, ref):
        assert p.dtype == dtype
        torch.testing.assert_close(m, r, rtol=1e-5, atol=1e-6)
        assert torch.equal(p.detach(), m.to(dtype))


def test_state_dict_round_trip():
    shapes_model = tiny(torch.float16)
    opt = FP16_Optimizer(FusedAdam(shapes_model.parameters(), lr=1e-3), init_loss_scale=32.0, scale_window=2)
    g = torch.Generator().manual_seed(5)
    stream = [[torch.randn(p.shape, generator=g) for p in shapes_model.parameters()] for _ in range(8)]
    stream[2][0][0] = math.inf

    def run(model, o, grads_list):
        for grads in grads_list:
            for p, gr in zip(model.parameters(), grads):
                p.grad = (gr * o.loss_scale).half()
            o.step()

    run(shapes_model, opt, stream[:4])
    saved_model = copy.deepcopy(shapes_model.state_dict())
    buf = io.BytesIO()
    torch.save(opt.state_dict(), buf)
    buf.seek(0)
    saved = torch.load(buf)
    assert saved["loss_scaler"]["loss_scale"] == opt.loss_scale
    run(shapes_model, opt, stream[4:])

    model2 = tiny(torch.float16)
    model2.load_state_dict(saved_model)
    opt2 = FP16_Optimizer(FusedAdam(model2.parameters(), lr=1e-3), init_loss_scale=2.0 ** 16)
    opt2.load_state_dict(saved)
    assert opt2.loss_scale == saved["loss_scaler"]["loss_scale"]
    run(model2, opt2, stream[4:])
    assert opt2.loss_scale == opt.loss_scale
    for a, b in zip(shapes_model.parameters(), model2.parameters()):
        assert torch.equal(a, b)


def test_state_dict_of_another_layout_is_refused_by_name_before_anything_loads():
    """A [1, 1] master weight would broadcast into a [16, 12] parameter under copy_: silently
    wrong. Every master weight and inner-optimizer tensor is checked against its parameter
    first; nothing (loss scale, Adam state, weights) is loaded when one differs."""
    def layout(*shapes):
        m = nn.Sequential(*[nn.Linear(i, o) for i, o in shapes]).half()
        o = FP16_Optimizer(FusedAdam(m.parameters(), lr=1e-3), init_loss_scale=8.0)
        set_grads(m, torch.ones_like)
        o.step()
        return m, o
    _, small = layout((1, 1), (1, 1))
    saved = small.state_dict()
    model, opt = layout((12, 16), (16, 1))
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ValueError, match=r"master weight of parameter 0 \(param_groups\[0\]\['params'\]\[0\], "
                       r"\[16, 12\] torch.float16\) is \[1, 1\] in the state dict"):
        opt.load_state_dict(saved)
    assert opt.loss_scale == 8.0
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    # the masters right but Adam's moments of another shape
    saved = opt.state_dict()
    key = saved["optimizer"]["param_groups"][0]["params"][2]
    saved["optimizer"]["state"][key]["exp_avg"] = torch.zeros(3)
    with pytest.raises(ValueError, match=r"optimizer state 'exp_avg' of param_groups\[0\]\['params'\]\[2\] "
                       r"\(\[1, 16\]\) is \[3\]"):
        opt.load_state_dict(saved)
    saved = opt.state_dict()
    saved["fp32_master_params"] = saved["fp32_master_params"][:-1]
    with pytest.raises(ValueError, match="3 master entries for 4 parameters"):
        opt.load_state_dict(saved)


def test_zero_grad():
    model = tiny(torch.float16)
    opt = FP16_Optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
    set_grads(model, torch.ones_like)
    opt.step()
    opt.zero_grad()
    assert all(p.grad is None for p in model.parameters())
    assert all(p.grad is None for g in opt.param_groups for p in g["params"])


def test_other_optimizer_is_returned_unchanged_with_a_warning():
    class NotAnOptimizer:
        def step(self):
            pass
    o = NotAnOptimizer()
    with pytest.warns(UserWarning, match="returned unchanged"):
        assert FP16_Optimizer(o) is o


def test_deepspeed_optimizer():
    # One process over gloo is a distributed setup DeepSpeed accepts; the whole matrix (ZeRO 0-3,
    # fp32/bf16/fp16, ORTModule, overflow skips) is tests/test_deepspeed.py. Here: ZeRO-2 in fp16
    # with clipping, the case whose old patch (has_overflow_serial) never ran.
    import dsutil
    deepspeed = dsutil.import_deepspeed()
    with dsutil.one_process_group(deepspeed), dsutil.fp16_on_cpu(), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        plain = dsutil.train(deepspeed, 2, "fp16", clip=0.1, steps=6)
        wrapped = dsutil.train(deepspeed, 2, "fp16", clip=0.1, steps=6, wrap=True)
    counts = wrapped["optimizer"]._ortmod_fused_calls
    assert counts["overflow"] == counts["norm"] == 6 and counts["clip"] > 0, dict(counts)
    assert wrapped["losses"] == plain["losses"] and wrapped["scales"] == plain["scales"]
    assert dsutil.rel(wrapped["params"], plain["params"]) < 1e-6


class AmpNet(nn.Module):
    """fp16 layers (Apex O2 gives them fp32 masters) and an fp32 gain (its own master)."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 4)).half()
        self.gain = nn.Parameter(torch.ones(4))

    def forward(self, x):
        return self.net(x.half()).float() * self.gain


def _apex_run(wrap, fused_kernel, inject_at=None, steps=10, accumulate=2):
    import apexlike
    torch.manual_seed(0)
    model = AmpNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = apexlike.LossScaler(has_fused_kernel=fused_kernel)
    model, opt = apexlike.initialize(model, opt, scaler)
    if wrap:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert FP16_Optimizer(opt) is opt          # patched in place: Apex keeps its scaler
    g = torch.Generator().manual_seed(3)
    scales, losses = [], []
    for step in range(steps):
        opt.zero_grad()
        if wrap:
            assert all(p.grad is None for p in model.parameters())      # set to None, not zeroed
        for micro in range(accumulate):
            x = torch.randn(8, 8, generator=g)
            loss = ((model(x) - torch.tanh(x[:, :4])) ** 2).mean()
            losses.append(float(loss.detach()))
            if step == inject_at and micro == 0:
                loss = loss * math.inf
            with apexlike.scale_loss(loss, opt) as scaled:
                scaled.backward()
        opt.step()
        scales.append(scaler.loss_scale())
    masters = [p.detach().clone() for grp in opt.param_groups for p in grp["params"]]
    return masters, scales, losses, opt


@pytest.mark.parametrize("fused_kernel", [False, True], ids=["python-scaler", "amp_C-scaler"])
@pytest.mark.parametrize("inject_at", [None, 4], ids=["finite", "overflow"])
def test_apex_amp_optimizer(fused_kernel, inject_at):
    # against an object built to Apex amp's O2 interface (tests/apexlike.py), not real Apex
    ref_masters, ref_scales, ref_losses, _ = _apex_run(False, fused_kernel, inject_at)
    masters, scales, losses, opt = _apex_run(True, fused_kernel, inject_at)
    counts = opt._ortmod_fused_calls
    assert counts["overflow"] == counts["unscale"] == 20, dict(counts)
    assert scales == ref_scales
    if inject_at is not None:
        assert scales[inject_at] == scales[inject_at - 1] / 2        # Apex's scaler skipped and halved
    assert losses == pytest.approx(ref_losses, rel=1e-3)
    for a, b in zip(masters, ref_masters):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_apex_amp_without_master_weights_is_left_with_a_warning():
    import apexlike
    model = AmpNet()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    model, opt = apexlike.initialize(model, opt, apexlike.LossScaler())

    def post_backward_no_master_weights(self, scaler):
        pass
    opt._post_amp_backward = post_backward_no_master_weights.__get__(opt)
    with pytest.warns(UserWarning, match=r"_post_amp_backward \(post_backward_no_master_weights: only the "
                                         r"master-weights mode, O2, is fused\) stays as it is"):
        assert FP16_Optimizer(opt) is opt
    assert opt._post_amp_backward.__func__ is post_backward_no_master_weights
    assert getattr(opt.zero_grad, "_ortmod_fused", False)
