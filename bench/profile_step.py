"""Where an ORTModule training step spends its time, per op, for one of the benchmark models.

    .venv/bin/python bench/profile_step.py gpt2 [--steps 10] [--threads N]

Runs the model's training step (forward, backward, AdamW) with the engine's profiler on
(ORTMOD_PROFILE=1) and prints: the step time, the time inside engine kernels (forward and
backward) and inside their GEMM calls, the rest (Python, binding, loss, optimizer), and the
slowest ops with each one's time inside and outside GEMMs. Kernel times are
wall times of CPU kernels, so they are comparable between ops on the same run only."""
import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))
os.environ["ORTMOD_PROFILE"] = "1"

import torch  # noqa: E402

import models  # noqa: E402
from ortmod import ORTModule  # noqa: E402
from ortmod._explain import engine_reports  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", choices=sorted(models.BENCH_MODELS))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--threads", type=int, default=0, help="0: torch's default")
    ap.add_argument("--top", type=int, default=20)
    ap.add_argument("--bf16", action="store_true", help="a bf16 model (model.bfloat16()) and bf16 inputs")
    ap.add_argument("--sgd", action="store_true", help="step with torch SGD instead of AdamW")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    ctor, batch_fn = models.BENCH_MODELS[a.model]
    model = ORTModule(ctor().bfloat16() if a.bf16 else ctor())
    data = [d.bfloat16() if a.bf16 and d.is_floating_point() else d for d in batch_fn()]
    opt = torch.optim.SGD(model.parameters(), lr=1e-4) if a.sgd else torch.optim.AdamW(model.parameters(), lr=1e-4)

    def step():
        loss = model(*data)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    for _ in range(3):
        step()
    for entry in model._ortmod_cache.values():   # count the measured steps only
        entry.engine.set_profiling(True)
    times = []
    for _ in range(a.steps):
        t0 = time.perf_counter()
        step()
        times.append(time.perf_counter() - t0)
    prof = [r["profile"] for r in engine_reports(model) if r.get("profile")]
    fwd = sum(p["forward_ms"] for p in prof) / a.steps
    bwd = sum(p["backward_ms"] for p in prof) / a.steps
    med = statistics.median(times) * 1e3
    print(f"{a.model}{' (bf16)' if a.bf16 else ''}: {torch.get_num_threads()} threads, {a.steps} steps, median step {med:.1f} ms "
          f"(mean {statistics.mean(times) * 1e3:.1f})")
    gemm = sum(p.get("forward_gemm_ms", 0) + p.get("backward_gemm_ms", 0) for p in prof) / a.steps
    print(f"  engine kernels per step: forward {fwd:.1f} ms, backward {bwd:.1f} ms, of which inside GEMMs "
          f"{gemm:.1f} ms; everything else {statistics.mean(times) * 1e3 - fwd - bwd:.1f} ms; non-GEMM time "
          f"(the mean step less its GEMMs) {statistics.mean(times) * 1e3 - gemm:.1f} ms")
    ops = sorted((o for p in prof for o in p["ops"]), key=lambda o: -o["ms"])
    print(f"  {'op':<28} {'phase':<9} {'calls/step':>10} {'ms/step':>9} {'share':>6} {'in GEMMs':>9} {'outside':>8}")
    for o in ops[:a.top]:
        ms = o["ms"] / a.steps
        g = o.get("gemm_ms", 0) / a.steps
        print(f"  {o['op']:<28} {o['phase']:<9} {o['calls'] / a.steps:>10.0f} {ms:>9.2f} "
              f"{100 * ms / max(fwd + bwd, 1e-9):>5.0f}% {g:>9.2f} {ms - g:>8.2f}")
    outside = sorted(ops, key=lambda o: -(o["ms"] - o.get("gemm_ms", 0)))
    print(f"  largest kernel time outside GEMMs: " + ", ".join(
        f"{o['op']} ({o['phase'][:3]}) {(o['ms'] - o.get('gemm_ms', 0)) / a.steps:.2f} ms" for o in outside[:6]))
    if "--json" in sys.argv:
        print(json.dumps(prof))


if __name__ == "__main__":
    main()
