"""Step time of data-dependent models (issue 37): ORTModule beside eager, SGD steps, on fresh data
(the counts change every step: a graph with m NonZero nodes plans a segment per new tuple of
counts so far) and on one batch repeated (every count seen before: plan cache hits). Prints
ms/step, the ratio, and the engine's plan cache. Both run on --threads threads (default 1: on a
small shared machine eager's own threads otherwise contend and its times mean little).

    .venv/bin/python bench/bench_data_dependent.py [--steps N] [--threads T]
"""
import argparse
import copy
import os
import sys
import time

import torch


def _threads():
    for i, a in enumerate(sys.argv):
        if a == "--threads" and i + 1 < len(sys.argv):
            return sys.argv[i + 1]
    return "1"


os.environ.setdefault("ORTMOD_NUM_THREADS", _threads())   # read once, when ortmod loads
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from test_data_dependent import TinyGCN, Top2MoE  # noqa: E402

from ortmod import ORTModule  # noqa: E402
from ortmod._explain import engine_reports  # noqa: E402


def steps_ms(model, batches, warm=5):
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    for i, args in enumerate(batches):
        if i == warm:
            t = time.perf_counter()
        model(*args).backward()
        opt.step()
        opt.zero_grad()
    return (time.perf_counter() - t) / (len(batches) - warm) * 1e3


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    cases = [("top-2 MoE, 4 experts, 256 tokens x 64", lambda: Top2MoE(64, 4), lambda: (torch.randn(256, 64),)),
             ("GCN over nonzero(adj), 200 nodes", lambda: TinyGCN(6), lambda: (torch.randn(200, 6), torch.rand(200, 200)))]
    print(f"{'model':40} {'data':9} {'eager ms':>9} {'ortmod ms':>10} {'ratio':>6}  plan cache")
    for name, make, data in cases:
        for kind in ("fresh", "repeated"):
            model = make()
            eager = copy.deepcopy(model)
            batches = [data() for _ in range(a.steps)] if kind == "fresh" else [data()] * a.steps
            ort = ORTModule(model)
            t_ort = steps_ms(ort, batches)
            t_eager = steps_ms(eager, batches)
            cache = engine_reports(ort)[0]["plan_cache"]
            print(f"{name:40} {kind:9} {t_eager:9.2f} {t_ort:10.2f} {t_eager / t_ort:6.2f}  "
                  f"planned {cache['planned']}, evicted {cache['evicted']}, exports {ort._ortmod_export_count}")


if __name__ == "__main__":
    main()
