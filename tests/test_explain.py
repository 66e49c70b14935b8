"""ortmod.explain and the INFO summary at the first call."""
import logging

import torch
import torch.nn as nn
import torch.nn.functional as F

import ortmod
from ortmod import DebugOptions, LogLevel, ORTModule


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x, y):
        return F.cross_entropy(self.b(F.gelu(self.a(x))), y)


def test_explain_reports_passes_kernels_and_memory(capsys):
    torch.manual_seed(0)
    report = ortmod.explain(Net(), torch.randn(4, 8), torch.randint(0, 4, (4,)))
    printed = capsys.readouterr().out
    assert len(report) == 1
    r = report[0]
    assert r["exported_nodes"] >= r["optimized_nodes"] > 0
    assert r["backward_nodes"] > 0
    assert {p["pass"] for p in r["passes"]} >= {"constant_folding", "cse", "dce"}
    plan = r["plans"][0]
    assert plan["forward_kernels"] > 0 and plan["backward_kernels"] > 0
    assert plan["peak_bytes"] >= plan["stash_bytes"] > 0
    assert plan["largest_buffers"] and plan["largest_buffers"][0]["bytes"] > 0
    assert "nodes:" in printed and "plan for inputs" in printed and "largest buffers" in printed


def test_info_level_logs_the_summary_once(caplog):
    torch.manual_seed(0)
    model = ORTModule(Net(), DebugOptions(log_level=LogLevel.INFO))
    x, y = torch.randn(4, 8), torch.randint(0, 4, (4,))
    with caplog.at_level(logging.INFO, logger="ortmod"):
        model(x, y).backward()
        model(x, y).backward()
    summaries = [r for r in caplog.records if "compiled training graph" in r.getMessage()]
    assert len(summaries) == 1
    assert "forward ops:" in summaries[0].getMessage()


def test_profiler_times_every_kernel_by_op_and_phase(ortmod_env):
    """ORTMOD_PROFILE=1 (or Engine.set_profiling): the report's "profile" holds per-op CPU
    kernel time for forward and backward, and explain prints it."""
    from ortmod._report import engine_reports, summarize
    ortmod_env.setenv("ORTMOD_PROFILE", "1")
    torch.manual_seed(0)
    model = ORTModule(Net())
    x, y = torch.randn(64, 8), torch.randint(0, 4, (64,))
    for _ in range(3):
        model(x, y).backward()
    (r,) = engine_reports(model)
    prof = r["profile"]
    phases = {o["phase"] for o in prof["ops"]}
    assert phases == {"forward", "backward"}
    assert prof["forward_ms"] > 0 and prof["backward_ms"] > 0
    assert abs(sum(o["ms"] for o in prof["ops"]) - prof["forward_ms"] - prof["backward_ms"]) < 1e-2
    # every forward kernel of a plan ran once per call: calls are multiples of 3
    assert all(o["calls"] % 3 == 0 for o in prof["ops"] if o["phase"] == "forward")
    assert "profile (ORTMOD_PROFILE" in summarize(r)
    # turning it on again resets the counters; off drops the section
    (entry,) = model._ortmod_cache.values()
    entry.engine.set_profiling(True)
    model(x, y).backward()
    (r,) = engine_reports(model)
    before = {(o["op"], o["phase"]): o["calls"] for o in prof["ops"]}
    after = {(o["op"], o["phase"]): o["calls"] for o in r["profile"]["ops"]}
    assert after == {k: v // 3 for k, v in before.items()}
    entry.engine.set_profiling(False)
    (r,) = engine_reports(model)
    assert "profile" not in r


def test_profiler_splits_each_kernels_time_inside_and_outside_gemms(ortmod_env):
    """Each op's profile entry says how much of its time went to om_gemm (gemm_ms): the products
    of MatMul-family ops and attention, nothing of an elementwise op. make bench's non-GEMM time
    for ortmod is the step's time less these."""
    from ortmod._explain import engine_reports

    class Wide(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(256, 512), nn.Linear(512, 8)

        def forward(self, x, y):
            return F.cross_entropy(self.b(torch.tanh(self.a(x))), y)
    ortmod_env.setenv("ORTMOD_PROFILE", "1")
    torch.manual_seed(0)
    model = ORTModule(Wide())
    x, y = torch.randn(256, 256), torch.randint(0, 8, (256,))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # no wake-up of a pool thread that a loaded machine has descheduled
    try:
        for _ in range(3):
            model(x, y).backward()
    finally:
        torch.set_num_threads(threads)
    (r,) = engine_reports(model)
    prof = r["profile"]
    for o in prof["ops"]:
        assert 0 <= o["gemm_ms"] <= o["ms"] + 1e-6, o
    by_op = {}
    for o in prof["ops"]:
        by_op[o["op"]] = by_op.get(o["op"], 0.0) + o["gemm_ms"]
    assert by_op.get("Tanh", 0.0) == 0.0 and by_op.get("SoftmaxCrossEntropyLoss", 0.0) == 0.0, prof["ops"]
    # the products (256x512x256 and its gradients, 67M multiply-adds a step) are most of a MatMul's time
    gemm_ops = [o for o in prof["ops"] if o["gemm_ms"] > 0]
    assert gemm_ops and all("MatMul" in o["op"] or "Gemm" in o["op"] for o in gemm_ops), gemm_ops
    assert sum(o["gemm_ms"] for o in gemm_ops) > 0.5 * sum(o["ms"] for o in gemm_ops), gemm_ops
    for phase in ("forward", "backward"):
        total = sum(o["gemm_ms"] for o in prof["ops"] if o["phase"] == phase)
        assert abs(prof[f"{phase}_gemm_ms"] - total) < 1e-2
