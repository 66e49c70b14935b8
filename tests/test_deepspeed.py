"""DeepSpeed for real: one process over gloo on the CPU, ZeRO 0-3, fp32 / bf16 (and fp16, with
DeepSpeed's CPU accelerator told torch computes it), with and without ORTModule, with and
without ortmod's FP16_Optimizer around the optimizer DeepSpeed returns. 20 SGD steps each;
parity against DeepSpeed over the eager model, and a float64 run of plain torch as referee.

Installed and run by ``make test-deepspeed`` (where a missing DeepSpeed is an error); elsewhere
the module is skipped when DeepSpeed is not installed.
"""
import contextlib
import warnings

import pytest
import torch

import dsutil

deepspeed = dsutil.import_deepspeed()

STEPS = 20


@pytest.fixture(scope="module", autouse=True)
def process_group():
    with dsutil.one_process_group(deepspeed):
        yield
    # ZeRO-3 replaced torch.nn.functional.linear for the whole process; later test modules get
    # torch's back
    from deepspeed.runtime.zero import linear, partition_parameters
    if torch.nn.functional.linear is linear.zero3_linear_wrap:
        torch.nn.functional.linear = partition_parameters.InsertPostInitMethodToModuleSubClasses.linear_bk


def _engine_ran_everything(module):
    """Every graph of the ORTModule ran on the engine alone: no PythonOp (an autograd.Function
    whose math torch would compute), no fallback."""
    entries = list(module._ortmod_cache.values())
    return module._ortmod_fallback is None and entries and all(e.call.functions is None for e in entries)


@pytest.fixture(scope="module")
def referee():
    return dsutil.reference_fp64(STEPS)


def _dtype_context(dtype):
    return dsutil.fp16_on_cpu() if dtype == "fp16" else contextlib.nullcontext()


def _train(stage, dtype, **kw):
    with _dtype_context(dtype), warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)      # torch.distributed deprecations
        return dsutil.train(deepspeed, stage, dtype, steps=STEPS, **kw)


# ---- DeepSpeed over the eager model: the reference the rest is held to ---------------------

@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_deepspeed_over_eager_trains(stage, dtype, referee):
    run = _train(stage, dtype)
    ref_losses, ref_params = referee
    assert run["losses"][-1] < 0.7 * run["losses"][0]
    err = dsutil.rel(run["params"], ref_params)
    # fp32: rounding only; bf16: DeepSpeed's fp32 master weights, bf16 model and gradients
    assert err < (1e-5 if dtype == "fp32" else 2e-2), err


# ---- ORTModule under DeepSpeed ----------------------------------------------------------------

@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_ortmodule_under_deepspeed_fp32(stage, referee):
    eager = _train(stage, "fp32")
    ort = _train(stage, "fp32", ort=True)
    module = ort["engine"].module
    assert _engine_ran_everything(module) and module._ortmod_export_count == 1
    if stage == 3:
        # ZeRO-3 swapped F.linear for its own autograd.Function (memory_efficient_linear, the
        # default); the export traced torch's F.linear instead, so the GEMMs are the engine's
        from deepspeed.runtime.zero import linear
        assert torch.nn.functional.linear is linear.zero3_linear_wrap
    losses_e, losses_o = torch.tensor(eager["losses"]), torch.tensor(ort["losses"])
    torch.testing.assert_close(losses_o, losses_e, rtol=1e-5, atol=0)
    err = dsutil.rel(ort["params"], eager["params"])
    assert err < 1e-5, err
    # the referee: ORTModule is as close to float64 as DeepSpeed over eager is
    _, ref_params = referee
    assert dsutil.rel(ort["params"], ref_params) < max(2 * dsutil.rel(eager["params"], ref_params), 1e-6)


class TwoHeads(torch.nn.Module):
    """An output the loss leaves out: its parameters get no gradient (None), under ZeRO-3 too."""

    def __init__(self):
        super().__init__()
        self.body = dsutil.MLP()
        self.aux = torch.nn.Linear(16, 3)

    def forward(self, x):
        return self.body(x), self.aux(x)


class HeadsLoss(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.inner = TwoHeads()

    def forward(self, x):
        return self.inner(x)[0]


@pytest.mark.parametrize("persist", [False, True], ids=["partitioned", "persistent"])
def test_ortmodule_under_zero3_gathers_and_releases(persist, monkeypatch):
    # partitioned: every parameter is gathered for each call and released after it (the engine never
    # calls the submodules whose hooks would); persistent: DeepSpeed keeps small parameters gathered
    if persist:
        base = dsutil.config

        def config(*a, **k):
            cfg = base(*a, **k)
            cfg["zero_optimization"].pop("stage3_param_persistence_threshold")   # default: 1e5 elements
            return cfg
        monkeypatch.setattr(dsutil, "config", config)
    eager = _train(3, "fp32", model_fn=HeadsLoss)
    ort = _train(3, "fp32", ort=True, model_fn=HeadsLoss)
    if persist:       # gathered when needed, never released (DeepSpeed's release skips them too)
        assert ort["zero3_after_backward"] == {"AVAILABLE"}
    else:             # released after the forward, and again once each gradient was reduced
        assert ort["zero3_after_backward"] == eager["zero3_after_backward"] == {"NOT_AVAILABLE"}
    assert ort["zero3_status"] == eager["zero3_status"] == ({"AVAILABLE"} if persist else {"NOT_AVAILABLE"})
    assert ort["engine"].module._ortmod_export_count == 1 and _engine_ran_everything(ort["engine"].module)
    torch.testing.assert_close(torch.tensor(ort["losses"]), torch.tensor(eager["losses"]), rtol=1e-5, atol=0)
    assert dsutil.rel(ort["params"], eager["params"]) < 1e-5
    aux = [p for n, p in ort["engine"].module.named_parameters() if n.startswith("inner.aux")]
    assert aux and all(p.grad is None for p in aux)
    # a forward without grad (the inference graph) gathers and releases too
    x = dsutil.batches(1, seed=99)[0][0]
    with torch.no_grad():
        torch.testing.assert_close(ort["engine"](x), eager["engine"](x), rtol=1e-5, atol=1e-6)
    statuses = {p.ds_status.name for p in ort["engine"].module.parameters()}
    assert statuses == ({"AVAILABLE"} if persist else {"NOT_AVAILABLE"})


@pytest.mark.parametrize("stage", [2, 3])
def test_ortmodule_under_deepspeed_accumulates_gradients(stage):
    # two micro-batches per step: the second backward adds onto DeepSpeed's partitioned gradients
    eager = _train(stage, "fp32", accumulate=2)
    ort = _train(stage, "fp32", accumulate=2, ort=True)
    assert ort["engine"].global_steps == STEPS // 2 and _engine_ran_everything(ort["engine"].module)
    torch.testing.assert_close(torch.tensor(ort["losses"]), torch.tensor(eager["losses"]), rtol=1e-5, atol=0)
    assert dsutil.rel(ort["params"], eager["params"]) < 1e-5


@pytest.mark.parametrize("stage", [2, 3])
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_ortmodule_with_fp16_optimizer_under_deepspeed(stage, dtype):
    # the whole user recipe: initialize(model=ORTModule(model)), then FP16_Optimizer(optimizer)
    eager = _train(stage, dtype, clip=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)       # nothing left unpatched
        ort = _train(stage, dtype, clip=0.1, ort=True, wrap=True)
    counts = ort["optimizer"]._ortmod_fused_calls
    assert counts["norm"] == STEPS and counts["clip"] > 0, dict(counts)
    assert _engine_ran_everything(ort["engine"].module)
    tol = 1e-5 if dtype == "fp32" else 2e-2      # bf16: eager and the engine round at other places
    torch.testing.assert_close(torch.tensor(ort["losses"]), torch.tensor(eager["losses"]), rtol=tol, atol=0)
    assert dsutil.rel(ort["params"], eager["params"]) < tol


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_ortmodule_under_deepspeed_half(stage, dtype, referee):
    # DeepSpeed's half model (fp32 master weights in its optimizer; fp16 with its loss scaler)
    # computed by the CPU engine in half (fp32 math, rounded once per op: issue 18). Eager and
    # ortmod round at different places, so the referee decides: ORTModule ends as close to
    # float64 as DeepSpeed over eager does
    eager = _train(stage, dtype)
    ort = _train(stage, dtype, ort=True)
    module = ort["engine"].module
    assert _engine_ran_everything(module) and module._ortmod_export_count == 1
    assert all(p.dtype == {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype] for p in module.parameters())
    assert ort["skipped"] == eager["skipped"]
    ref_losses, ref_params = referee
    assert ort["losses"][-1] < (0.7 if dtype == "bf16" else 0.9) * ort["losses"][0]   # fp16: skips while scaling
    torch.testing.assert_close(torch.tensor(ort["losses"]), torch.tensor(eager["losses"]), rtol=2e-2, atol=0)
    err_o, err_e = dsutil.rel(ort["params"], ref_params), dsutil.rel(eager["params"], ref_params)
    assert err_o < max(2 * err_e, 2 ** -8), (err_o, err_e)


# ---- FP16_Optimizer around the optimizer DeepSpeed returns --------------------------------------

# (stage, dtype) -> what the step of the optimizer DeepSpeed builds calls, and so which fused
# passes must have run: ZeRO 1/2 compute the norm every step (and check overflow in fp16),
# ZeRO-3 likewise; FP16_UnfusedOptimizer (no ZeRO, bf16/fp16) checks overflow every step.
WRAPPED = [(0, "bf16"), (0, "fp16")] + [(s, d) for s in (1, 2, 3) for d in ("fp32", "bf16", "fp16")]


def _expected_kinds(stage, dtype):
    kinds = {"clip"}
    if stage > 0:
        kinds.add("norm")
    if dtype == "fp16" or stage == 0:
        kinds.add("overflow")
    return kinds


@pytest.mark.parametrize("stage,dtype", WRAPPED)
def test_fp16_optimizer_fuses_what_deepspeed_step_calls(stage, dtype):
    from ortmod.optim import _deepspeed
    plain = _train(stage, dtype, clip=0.1)
    _deepspeed._warned.clear()       # each case hears its own once-per-process warning
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        wrapped = _train(stage, dtype, clip=0.1, wrap=True)
    opt = wrapped["optimizer"]
    assert opt is wrapped["engine"].optimizer          # patched in place, not replaced
    counts = opt._ortmod_fused_calls
    for kind in _expected_kinds(stage, dtype):
        assert counts[kind] > 0, (kind, dict(counts))
    notes = [str(w.message) for w in caught if "FP16_Optimizer" in str(w.message)]
    if stage > 0:
        assert not notes, notes                       # everything the ZeRO step calls is fused
    else:
        assert len(notes) == 1 and "get_weight_norm" in notes[0], notes
    # DeepSpeed's own loss scaling and semantics: the same losses, scales, norms and weights
    assert wrapped["losses"] == plain["losses"]
    assert wrapped["scales"] == plain["scales"]
    assert wrapped["skipped"] == plain["skipped"]
    for a, b in zip(wrapped["norms"], plain["norms"]):
        assert (a is None) == (b is None) and (a is None or abs(a - b) <= 1e-6 * abs(b)), (a, b)
    assert dsutil.rel(wrapped["params"], plain["params"]) < 1e-6


OVERFLOWS = [(s, "fp16") for s in (0, 1, 2, 3)] + [(s, "fp32") for s in (1, 2, 3)] + [(1, "bf16"), (2, "bf16")]


@pytest.mark.parametrize("stage,dtype", OVERFLOWS)
def test_overflow_is_skipped_as_deepspeed_skips_it(stage, dtype):
    at = 7
    kw = dict(inject_inf_at=at, check_grad_overflow=(dtype == "bf16"))
    plain = _train(stage, dtype, **kw)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        wrapped = _train(stage, dtype, wrap=True, **kw)
    for run in (plain, wrapped):
        before, after = run["params_around_inject"]
        assert all(torch.equal(a, b) for a, b in zip(before, after))     # the step was skipped
    assert wrapped["skipped"] == plain["skipped"] >= 1
    assert wrapped["scales"] == plain["scales"]
    if dtype == "fp16":
        assert plain["scales"][at] == plain["scales"][at - 1] / 2        # DeepSpeed halved its scale
    assert wrapped["losses"] == plain["losses"]
    assert dsutil.rel(wrapped["params"], plain["params"]) == 0.0
    counts = wrapped["optimizer"]._ortmod_fused_calls
    assert counts["overflow" if dtype != "fp32" or stage == 0 else "norm"] > 0


def test_fp16_optimizer_leaves_a_plain_torch_optimizer_of_a_deepspeed_engine_alone():
    # fp32 without ZeRO: deepspeed.initialize returns the client's torch optimizer, which the engine
    # steps itself; ortmod's loss scaler around it would never run
    from ortmod.optim import FP16_Optimizer
    torch.manual_seed(0)
    model = dsutil.MLP()
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                   config=dsutil.config(0, "fp32"))
    assert isinstance(optimizer, torch.optim.SGD)
    with pytest.warns(UserWarning, match=r"stepped by a DeepSpeed engine .* returned unchanged"):
        assert FP16_Optimizer(optimizer) is optimizer


def test_fp16_optimizer_warns_once_where_it_cannot_patch():
    from ortmod.optim import FP16_Optimizer
    torch.manual_seed(0)
    model = dsutil.MLP()
    engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                                   config=dsutil.config(1, "fp32"))
    original = optimizer.get_grad_norm_direct

    def get_grad_norm_direct(gradients, params, norm_type=2, extra=None):   # another version's shape
        return original(gradients, params, norm_type)

    optimizer.get_grad_norm_direct = get_grad_norm_direct
    with pytest.warns(UserWarning, match=r"get_grad_norm_direct \(parameters .*extra.*\) stay as they are"):
        assert FP16_Optimizer(optimizer) is optimizer
    assert optimizer.get_grad_norm_direct is get_grad_norm_direct      # left as it was
    assert getattr(optimizer.unscale_and_clip_grads, "_ortmod_fused", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        FP16_Optimizer(optimizer)          # once: the second wrap says nothing more
