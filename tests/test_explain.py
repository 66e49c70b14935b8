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
