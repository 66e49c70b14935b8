"""The model fuzzer (tests/modelfuzz/) in make test: a fixed-seed sample of random training
models, the regression cases it found (tests/modelfuzz/regressions/*.json), and checks that
its oracles, worker processes and shrinker do catch what they are there to catch.

Every model runs in a worker process (tests/modelfuzz/runner.py), as in make fuzz-models: a
crash is a crash record there, not the end of this test session. The specs carry their own
capture path (they alternate by seed), whatever ORTMOD_CAPTURE the suite runs with.
"""
import glob
import json
import os

import pytest

from tests.modelfuzz import known
from tests.modelfuzz import oracle as O
from tests.modelfuzz import runner, shrink
from tests.modelfuzz import spec as S

HERE = os.path.dirname(os.path.abspath(__file__))
REGRESSIONS = sorted(glob.glob(os.path.join(HERE, "modelfuzz", "regressions", "*.json")))
SAMPLE_SEEDS = range(0, 30)


@pytest.fixture(scope="module")
def pool():
    p = runner.Pool(jobs=1, timeout=120)
    yield p
    p.close()


def _fmt(rec):
    return f"seed {rec.get('seed')}: {rec['status']}: {runner.one_line(rec)}\n  spec: {json.dumps(rec.get('spec'))}"


def test_fixed_seed_sample(pool):
    """30 generated models (both capture paths, float32 and float64): none silently wrong,
    none crashing, hanging or raising anything but ortmod's own refusals."""
    # a failure that a known bug (tests/modelfuzz/known.py: reported, pinned by an "open"
    # regression case) explains is counted as known only if the model passes without its trigger
    records = [known.attribute(pool, r) if r["status"] in O.FAILURES else r
               for r in pool.run([{"seed": s} for s in SAMPLE_SEEDS])]
    assert len(records) == len(SAMPLE_SEEDS)
    lines = []
    runner.report(records, 1.0, out=lines.append)
    print("\n".join(lines))
    bad = [r for r in records if r["status"] in O.FAILURES + ("harness-error",)]
    assert not bad, "\n".join(_fmt(r) for r in bad)
    # the generator reaches its grammar, not a corner of it
    assert sum(r["status"] == O.OK for r in records) >= len(records) // 2
    assert sum(r["status"] == O.INVALID for r in records) <= len(records) // 10


@pytest.mark.parametrize("path", REGRESSIONS, ids=[os.path.basename(p)[:-5] for p in REGRESSIONS])
def test_regression(pool, path):
    with open(path) as f:
        case = json.load(f)
    rec = pool.run_one({"spec": case["spec"]})
    if case.get("expect", "ok") == "open":
        # a bug reported and not fixed: it must still show (strict: a fix makes this test fail
        # until the case says "ok")
        assert rec["status"] == case["found"]["status"], \
            f"{os.path.basename(path)} no longer fails: set its expect to \"ok\"\n{_fmt(rec)}"
        pytest.xfail(f"open: {case.get('describe')}: {runner.one_line(rec)}")
    # "ok", or "refused" where ortmod now declines by name what it once computed wrong
    assert rec["status"] == case.get("expect", "ok"), _fmt(rec)


# --------------------------------------------------------------------------- the fuzzer's own checks

TINY = {"seed": 5, "dtype": "float32", "capture": "torchscript", "steps": 2, "eval_after": False,
        "input": {"kind": "vec", "shape": [3, 4], "grad": True},
        "layers": [{"op": "linear", "out": 5, "bias": True}, {"op": "act", "fn": "tanh"},
                   {"op": "layernorm", "how": "last", "affine": True, "bias": True, "eps": 1e-5},
                   {"op": "linear", "out": 3, "bias": True}],
        "head": {"op": "ce", "reduction": "mean", "ignore_index": -100, "class_weight": False,
                 "label_smoothing": 0.0}}


def _with_fault(fault, **changes):
    s = json.loads(json.dumps(TINY))
    s.update(changes)
    s["_fault"] = fault
    return s


@pytest.mark.parametrize("fault,status", [(None, O.OK), ("grad64", O.MISMATCH64), ("grad32", O.MISMATCH32),
                                          ("raise", O.ERROR), ("crash", O.CRASH),
                                          ("eager_crash", O.EAGER_CRASH)])
def test_oracle_classifies_injected_faults(pool, fault, status):
    """A gradient 1e-6 off in float64, one 3e-2 off in float32, a foreign exception and an
    abort() in the ORTModule run are each caught and named, an abort() in eager PyTorch is
    told apart; the untouched model passes."""
    rec = pool.run_one({"spec": _with_fault(fault)})
    assert rec["status"] == status, _fmt(rec)
    if fault == "crash":
        assert "SIGABRT" in rec["note"] and "in ortmod float64" in rec["note"], rec["note"]
    if fault == "eager_crash":      # PyTorch's own crash: reported, not ortmod's failure
        assert "in eager referee" in rec["note"] and O.EAGER_CRASH not in O.FAILURES
    # the worker that crashed is replaced: the next case runs
    assert pool.run_one({"spec": TINY})["status"] == O.OK


def test_hang_is_a_finding():
    p = runner.Pool(jobs=1, timeout=8)
    try:
        rec = p.run_one({"spec": _with_fault("hang")})
    finally:
        p.close()
    assert rec["status"] == O.HANG, _fmt(rec)


def test_refusal_is_counted_not_failed(pool):
    """An ortmod refusal by name is "refused" with its message (BatchNorm(momentum=None) in
    training is refused on both paths)."""
    s = json.loads(json.dumps(TINY))
    s["layers"].insert(1, {"op": "batchnorm", "affine": True, "track": True, "momentum": None, "eps": 1e-5})
    rec = pool.run_one({"spec": s})
    assert rec["status"] == O.REFUSED, _fmt(rec)
    assert "momentum" in " ".join(rec["refused"].values()).lower(), rec["refused"]


def test_shrinker_keeps_the_classification(pool):
    big = _with_fault("grad64", layers=TINY["layers"] + [
        {"op": "residual", "how": "add", "alpha": 1.0, "body": [{"op": "act", "fn": "gelu"}]},
        {"op": "swiglu", "hidden": 6, "out": 4, "bias": True, "act": "silu"}], eval_after=True)
    first = pool.run_one({"spec": big})
    assert first["status"] == O.MISMATCH64
    small = shrink.shrink(pool, first, budget=60)
    assert small["status"] == O.MISMATCH64
    assert len(json.dumps(small["spec"])) < len(json.dumps(big)) / 2, S.describe(small["spec"])


def test_noise_band_rule():
    """The float32 rule in numbers: an error 10x outside eager's own spread and above 1e-4 is a
    mismatch, one inside it (a kink that flips under rounding) is not."""
    import torch
    ref = torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
    eager = ref + torch.tensor([0.0, 3e-2, 0.0], dtype=torch.float64)    # a flipped relu mask
    ortmod_ = ref + torch.tensor([0.0, -2.9e-2, 0.0], dtype=torch.float64)
    band = O.rel_err(eager, ref, 0.0)
    err = O.rel_err(ortmod_, ref, 0.0)
    assert not err > max(O.BAND_FACTOR * band, O.TOL32)
    assert O.rel_err(ref * 1.01, ref, 0.0) > max(O.BAND_FACTOR * O.rel_err(ref * (1 + 1e-7), ref, 0.0), O.TOL32)
    # a missing gradient equals a zero one, not a nonzero one; shapes and inf/nan patterns count
    assert O.rel_err(None, torch.zeros(3), 0.0) == 0.0
    assert O.rel_err(None, ref, 0.0) == float("inf")
    assert O.rel_err(ref[:2], ref, 0.0) == float("inf")
    assert O.rel_err(torch.tensor([float("nan"), 1.0]), torch.tensor([1.0, 1.0]), 0.0) == float("inf")


def test_every_known_bug_has_an_open_case():
    for bug in known.KNOWN:
        with open(os.path.join(HERE, "modelfuzz", "regressions", bug["case"])) as f:
            assert json.load(f)["expect"] == "open", bug["name"]


def test_specs_are_deterministic_and_json():
    for seed in (3, 4, 17):
        a, b = S.generate(seed), S.generate(seed)
        assert a == b and json.loads(S.dumps(a)) == a
        m1, args1 = S.build(a)
        m2, args2 = S.build(a)
        for (n1, p1), (n2, p2) in zip(m1.state_dict().items(), m2.state_dict().items()):
            assert n1 == n2 and bool((p1 == p2).all())
        assert all(bool((x == y).all()) for x, y in zip(args1, args2))


def test_oracle_rounding_rules():
    """oracle.scales: a category that is all exact zeros takes the outputs' size (seed 40490);
    oracle.rounding_explains: an error is rounding when it is within what the other
    precision's error predicts scaled by the epsilons' ratio (2**29), and a fault is not."""
    import torch
    from tests.modelfuzz import oracle as O
    ref = {"s0 out0": torch.tensor([0.9], dtype=torch.float64), "s0 grad a": torch.zeros(3), "param a": torch.ones(3)}
    sc = O.scales(ref)
    assert sc["grad"] == sc["out"] == 0.9 and sc["param"] == 1.0
    # every output and gradient rounding residue (seed 81907): the parameters' size
    noise = {"s0 out0": torch.tensor([3e-15], dtype=torch.float64), "s0 grad a": torch.tensor([3e-14, 0, 0]),
             "param a": torch.full((3,), 0.5)}
    assert O.scales(noise)["grad"] == O.scales(noise)["out"] == 0.5
    assert O.rel_err(torch.full((3,), 1.4e-17), ref["s0 grad a"], O.FLOOR64 * sc["grad"]) < O.TOL64
    assert O.rel_err(torch.full((3,), 1e-3), ref["s0 grad a"], O.FLOOR64 * sc["grad"]) > O.TOL64
    # LayerNorm over a size-1 dim: eager float64 leaves 2e-14, eager float32 1.3e-5, ortmod 0
    assert O.rounding_explains(2.2e-14, 1.3e-5, 1 / O.EPS_RATIO)
    # a float32 constant in a float64 computation: 1e-8 relative against eager float32's 1e-7
    assert not O.rounding_explains(1e-8, 1e-7, 1 / O.EPS_RATIO)
    # float32 noise 2**29 times ortmod float64's; the injected 3e-2 fault is not
    assert O.rounding_explains(5e-7, 1.9e-15, O.EPS_RATIO)
    assert not O.rounding_explains(3e-2, 1e-16, O.EPS_RATIO)
    assert O.abs_err(None, torch.tensor([0.0, -2.0])) == 2.0
    assert O.abs_err(torch.tensor([float("inf")]), torch.tensor([1.0])) == float("inf")


def test_decomposed_norms_are_the_same_math():
    """oracle._decompose_norms (the eager variant "decomposed-norms"): BatchNorm (training and
    eval, running statistics), InstanceNorm and LayerNorm written as plain ops agree with the
    modules in float64: outputs, input and parameter gradients, buffers."""
    import copy
    import torch
    import torch.nn as nn
    from tests.modelfuzz import oracle as O
    gen = torch.Generator().manual_seed(0)
    cases = [(nn.BatchNorm1d(3, momentum=0.3), (4, 3, 5)), (nn.BatchNorm2d(3, affine=False), (2, 3, 4, 5)),
             (nn.BatchNorm2d(3, track_running_stats=False), (2, 3, 4, 5)), (nn.InstanceNorm2d(3, affine=True), (2, 3, 4, 5)),
             (nn.InstanceNorm1d(3), (2, 3, 5)), (nn.LayerNorm([4, 5]), (2, 3, 4, 5)), (nn.LayerNorm(5, bias=False), (2, 5)),
             (nn.LayerNorm(5, elementwise_affine=False), (2, 5))]
    for mod, shape in cases:
        mod = mod.double()
        with torch.no_grad():
            for p in mod.parameters():
                p.copy_(torch.randn(p.shape, dtype=p.dtype, generator=gen))
        for train in (True, False):
            a, b = copy.deepcopy(mod).train(train), O._decompose_norms(copy.deepcopy(mod).train(train))
            x, g = (torch.randn(shape, dtype=torch.float64, generator=gen) for _ in range(2))
            xa, xb = x.clone().requires_grad_(), x.clone().requires_grad_()
            ya, yb = a(xa), b(xb)
            ya.backward(g)
            yb.backward(g)
            pairs = [(ya, yb), (xa.grad, xb.grad)] + [(p.grad, q.grad) for p, q in zip(a.parameters(), b.parameters())] \
                + [(u.double(), v.double()) for u, v in zip(a.buffers(), b.buffers())]
            for u, v in pairs:
                assert (u - v).abs().max().item() <= 1e-13, (type(mod).__name__, shape, train)


def test_torch_instancenorm_layout_bug_still_needs_the_workaround():
    """torch 2.13's CPU instance_norm backward with batch 1 and a channels-last output gradient
    is wrong (O(1) in float64) whatever its input's layout: seed 40589's referee was, after
    oracle._same_layout_grads handed the gradient its (channels-last) input's layout. When a
    torch release fixes it, this fails."""
    import torch
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 3, 4, 5, dtype=torch.float64, generator=g)
    dy = torch.randn(1, 3, 4, 5, dtype=torch.float64, generator=g)

    def dx(grad):
        leaf = x.clone().requires_grad_()
        torch.nn.InstanceNorm2d(3).double()(leaf).backward(grad)
        return leaf.grad
    assert (dx(dy.contiguous(memory_format=torch.channels_last)) - dx(dy)).abs().max().item() > 1e-3


def test_norm_backward_is_right_with_a_contiguous_gradient():
    """What oracle._same_layout_grads relies on: eager's BatchNorm2d/InstanceNorm2d backward,
    handed a contiguous output gradient, matches the same norm written in elementwise ops, for
    every input layout and every layout the gradient came in (batch 1 and 2, sizes 1..3)."""
    import itertools
    import torch
    from tests.modelfuzz import oracle as O
    cl = torch.channels_last
    gen = torch.Generator().manual_seed(0)
    for (N, C, H, W), kind in itertools.product(itertools.product([1, 2], [1, 2], [1, 3], [2, 3]), ("bn", "in")):
        x = torch.randn(N, C, H, W, dtype=torch.float64, generator=gen)
        dims = (0, 2, 3) if kind == "bn" else (2, 3)

        def plain(t):
            m = t.mean(dims, keepdim=True)
            return (t - m) / ((t - m).pow(2).mean(dims, keepdim=True) + 1e-5).sqrt()
        weird = torch.randn(N, H * W, C, dtype=torch.float64, generator=gen).transpose(1, 2).reshape(N, C, H, W)
        for dy, x_fmt in itertools.product((weird, weird.contiguous(memory_format=cl)), (torch.contiguous_format, cl)):
            ref = x.clone().requires_grad_()
            plain(ref).backward(dy)
            mod = (torch.nn.BatchNorm2d(C, affine=False) if kind == "bn" else torch.nn.InstanceNorm2d(C)).double()
            O._same_layout_grads(mod)
            leaf = x.clone().requires_grad_()
            mod(leaf.contiguous(memory_format=x_fmt)).backward(dy)
            assert (leaf.grad - ref.grad).abs().max().item() <= 1e-9 * ref.grad.abs().max().item() + 1e-12, \
                (kind, (N, C, H, W), x_fmt, dy.stride())


def test_norm_backward_is_right_for_a_transposed_sequence_input():
    """Seed 81907's referee: a (1, 9, 8) sequence turned into a (1, 8, 9, 1) image by
    transpose(1, 2).unflatten(2, (9, 1)) (strides (8, 1, 8, 8)) into a training BatchNorm2d:
    torch's CPU backward (2.13.0, 2.14.1) gives weight, bias and input gradients O(1) off in
    float64. oracle._same_layout_grads hands the norm a contiguous input: then eager is right
    (it equals the same input made contiguous by hand, and finite differences agree with ortmod)."""
    import torch
    from tests.modelfuzz import oracle as O
    gen = torch.Generator().manual_seed(0)
    x0 = torch.randn(1, 9, 8, dtype=torch.float64, generator=gen)
    g = torch.randn(1, 8, 9, 1, dtype=torch.float64, generator=gen)

    def grads(hooked, contiguous):
        bn = torch.nn.BatchNorm2d(8).double()
        if hooked:
            O._same_layout_grads(bn)
        x = x0.clone().requires_grad_()
        h = x.transpose(1, 2).unflatten(2, (9, 1))
        (bn(h.contiguous() if contiguous else h) * g).sum().backward()
        return torch.cat([x.grad.flatten(), bn.weight.grad, bn.bias.grad])
    right = grads(False, True)
    assert (grads(False, False) - right).abs().max().item() > 1e-3   # torch's bug: when fixed, the hook can go
    assert (grads(True, False) - right).abs().max().item() <= 1e-12 * right.abs().max().item()


def test_torch_batchnorm_layout_bug_still_needs_the_workaround():
    """oracle._same_layout_grads works around torch's CPU batch_norm backward given an output
    gradient of another layout than its input (batch 1 behind flatten(2).transpose(1, 2)).
    When a torch release fixes it, this fails: the workaround can go."""
    import torch
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, 3, 3, dtype=torch.float64, generator=g)
    dy = torch.randn(1, 9, 2, dtype=torch.float64, generator=g).transpose(1, 2).reshape(1, 2, 3, 3)

    def dx(grad):
        leaf = x.clone().requires_grad_()
        torch.nn.BatchNorm2d(2, affine=False).double()(leaf).backward(grad)
        return leaf.grad
    assert (dx(dy) - dx(dy.contiguous())).abs().max().item() > 1e-3
