"""DeepSpeed in one process: gloo, the CPU accelerator, no ops built (DS_BUILD_OPS=0).

``make test-deepspeed`` installs DeepSpeed and runs the tests that use this with
ORTMOD_REQUIRE_DEEPSPEED=1, where a missing DeepSpeed is an error, not a skip.
"""
import contextlib
import os
import socket

import pytest
import torch
import torch.nn as nn


def import_deepspeed():
    """deepspeed, set up for a one-process CPU run; pytest.skip when it is not installed (an
    error under ORTMOD_REQUIRE_DEEPSPEED=1)."""
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if os.environ.get("ORTMOD_REQUIRE_DEEPSPEED") == "1":
        import deepspeed
    else:
        deepspeed = pytest.importorskip("deepspeed", reason="DeepSpeed is not installed: `make test-deepspeed`")
    import deepspeed.ops
    from deepspeed.ops.op_builder.all_ops import ALL_OPS
    # Installed with DS_BUILD_OPS=0, no op is built. Left to itself, the CPU accelerator would
    # JIT-compile its shared-memory all-reduce (minutes) on the first init_distributed; one process
    # over gloo needs no op, so none is declared compatible.
    deepspeed.ops.__compatible_ops__ = dict.fromkeys(ALL_OPS, False)
    return deepspeed


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_group_ready = False


@contextlib.contextmanager
def one_process_group(deepspeed):
    """A world of one (gloo), set up once per process and kept: DeepSpeed caches its groups
    globally, so a second init after a destroy would find stale ones."""
    global _group_ready
    if not _group_ready:
        os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "RANK": "0",
                           "WORLD_SIZE": "1", "LOCAL_RANK": "0"})
        deepspeed.init_distributed(dist_backend="gloo")
        _group_ready = True
    yield


@contextlib.contextmanager
def fp16_on_cpu():
    """DeepSpeed's CPU accelerator declines fp16 unless oneDNN has fp16 kernels; torch's CPU
    kernels compute this model in fp16 anyway. Declaring it supported runs DeepSpeed's fp16 code
    (dynamic loss scaling, overflow skips) unchanged."""
    from deepspeed.accelerator import get_accelerator
    cls = type(get_accelerator())
    saved = cls.is_fp16_supported
    cls.is_fp16_supported = lambda self: True
    try:
        yield
    finally:
        cls.is_fp16_supported = saved


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))

    def forward(self, x):
        return self.net(x)


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def batches(steps, seed=1234):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(steps):      # a fixed target function plus noise: the loss falls
        x = torch.randn(8, 16, generator=g)
        y = torch.tanh(x[:, :4] + 0.5 * x[:, 4:8]) + 0.05 * torch.randn(8, 4, generator=g)
        out.append((x, y))
    return out


def config(stage, dtype, lr=0.05, clip=0.0, check_grad_overflow=False, accumulate=1):
    cfg = {"train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": accumulate,
           "optimizer": {"type": "SGD", "params": {"lr": lr}},
           "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True,
           "gradient_clipping": clip, "steps_per_print": 10 ** 9}
    if stage == 3:
        # every parameter partitioned (the default keeps small ones gathered for good)
        cfg["zero_optimization"].update({"stage3_param_persistence_threshold": 0,
                                         "stage3_prefetch_bucket_size": 0})
    if dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
        if check_grad_overflow:
            cfg["bf16"]["check_grad_overflow"] = True
    if dtype == "fp16":
        cfg["fp16"] = {"enabled": True, "initial_scale_power": 12, "loss_scale_window": 4, "hysteresis": 1}
    return cfg


def full_params(deepspeed, engine):
    """Every parameter at full size, float64 copies (ZeRO-3: gathered)."""
    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
        return [p.detach().double().clone() for p in params]


def loss_scale(optimizer):
    for name in ("loss_scale", "cur_scale"):
        v = getattr(optimizer, name, None)
        if v is not None:
            return float(v)
    return None


def train(deepspeed, stage, dtype, *, ort=False, wrap=False, steps=20, inject_inf_at=None, clip=0.0,
          check_grad_overflow=False, seed=0, model_fn=MLP, accumulate=1):
    """Trains model_fn() under deepspeed.initialize for ``steps`` SGD steps. ort: the model is
    ORTModule(model); wrap: the optimizer DeepSpeed returns goes through FP16_Optimizer.
    inject_inf_at: at that step the loss is multiplied by inf (every gradient inf/NaN).
    accumulate: micro-batches per optimizer step (engine.step() after each, as DeepSpeed wants).
    Returns a dict: losses, params (final, float64), scales, skipped, norms, optimizer."""
    torch.manual_seed(seed)
    model = model_fn()
    if ort:
        from ortmod import ORTModule
        model = ORTModule(model)
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                   config=config(stage, dtype, clip=clip,
                                                                 check_grad_overflow=check_grad_overflow,
                                                                 accumulate=accumulate))
    if wrap:
        from ortmod.optim import FP16_Optimizer
        optimizer = FP16_Optimizer(optimizer)
    out = {"losses": [], "scales": [], "norms": [], "optimizer": optimizer, "engine": engine,
           "params_around_inject": None}
    pdtype = DTYPES[dtype]
    for i, (x, y) in enumerate(batches(steps)):
        out_t = engine(x.to(pdtype))
        loss = ((out_t.float() - y) ** 2).mean()
        out["losses"].append(float(loss.detach()))
        if i == inject_inf_at:
            loss = loss * float("inf")
            before = full_params(deepspeed, engine)
        engine.backward(loss)
        out.setdefault("zero3_after_backward", set()).update(
            p.ds_status.name for p in engine.module.parameters() if hasattr(p, "ds_status"))
        engine.step()
        if i == inject_inf_at:
            out["params_around_inject"] = (before, full_params(deepspeed, engine))
        out["scales"].append(loss_scale(engine.optimizer))
        n = engine.get_global_grad_norm()
        out["norms"].append(None if n is None else float(n))
    out["zero3_status"] = {p.ds_status.name for p in engine.module.parameters() if hasattr(p, "ds_status")}
    out["params"] = full_params(deepspeed, engine)
    out["skipped"] = engine.skipped_steps
    return out


def rel(a, b):
    """||a - b|| / ||b|| over lists of tensors."""
    num = sum(float(((x.double() - y.double()) ** 2).sum()) for x, y in zip(a, b)) ** 0.5
    den = sum(float((y.double() ** 2).sum()) for y in b) ** 0.5
    return num / max(den, 1e-30)


def reference_fp64(steps=20, lr=0.05, seed=0, model_fn=MLP):
    """The referee: the same model and data, plain torch SGD in float64, no DeepSpeed."""
    torch.manual_seed(seed)
    model = model_fn().double()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x, y in batches(steps):
        loss = ((model(x.double()) - y.double()) ** 2).mean()
        losses.append(float(loss.detach()))
        opt.zero_grad()
        loss.backward()
        opt.step()
    return losses, [p.detach().clone() for p in model.parameters()]
