"""Per-step overhead of ORTModule on a model too small to cost anything itself.

nn.Linear(4, 4) on a (2, 4) batch, forward + backward of out.sum() per step, measured three ways:

    eager    the module in PyTorch
    ortmod   ORTModule(module): the whole per-step path (input keys, cache, autograd.Function,
             DLPack both ways, the engine)
    engine   Engine.forward + Engine.backward called directly on the same capsules: the binding
             and the engine alone, without ORTModule's Python around them

The runs are interleaved (eager, ortmod, engine, eager, ...) so that a noisy neighbour costs
all three alike; each figure is the median over rounds of the mean µs/step of one round.

    .venv/bin/python bench/binding_overhead.py                # 15 rounds x 2000 steps
    .venv/bin/python bench/binding_overhead.py --rounds 31 --steps 5000 --json out.json
"""
import argparse
import json
import os
import statistics
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import torch  # noqa: E402
from torch.utils.dlpack import to_dlpack  # noqa: E402

import ortmod  # noqa: E402
from ortmod import _pipeline  # noqa: E402


def eager_step(model, x):
    model.weight.grad = model.bias.grad = None
    model(x).sum().backward()


def make_engine_step(ort, x):
    """One direct Engine.forward + Engine.backward on the tensors ORTModule passes it."""
    seen = {}
    run_training = _pipeline.run_training

    def record(call, tensors, zero3=None):
        seen["call"], seen["tensors"] = call, list(tensors)
        return run_training(call, tensors, zero3)

    _pipeline.run_training = record
    try:
        ort(x).sum().backward()
    finally:
        _pipeline.run_training = run_training
    engine, tensors = seen["call"].engine, seen["tensors"]
    n_out = len(engine.output_names)

    def step():
        outs, stash = engine.forward([to_dlpack(t) for t in tensors], True, None)
        outs = [torch.from_dlpack(c) for c in outs]
        grads = engine.backward(stash, [to_dlpack(torch.ones_like(o)) for o in outs[:n_out]], None)
        return [None if g is None else torch.from_dlpack(g) for g in grads]

    return step


def time_steps(step, steps):
    t = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - t) / steps * 1e6


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--steps", type=int, default=2000, help="steps per round and way")
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (1: least noise)")
    ap.add_argument("--json", help="also write the figures here")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    twin = torch.nn.Linear(4, 4)
    twin.load_state_dict(model.state_dict())
    ort = ortmod.ORTModule(twin).train()
    x = torch.randn(2, 4)

    def ortmod_step():
        twin.weight.grad = twin.bias.grad = None
        ort(x).sum().backward()

    engine_step = make_engine_step(ort, x)
    ways = {"eager": lambda: eager_step(model, x), "ortmod": ortmod_step, "engine": engine_step}
    for step in ways.values():              # warm-up: plans, caches, allocator
        time_steps(step, max(a.steps // 10, 10))
    samples = {name: [] for name in ways}
    for _ in range(a.rounds):
        for name, step in ways.items():
            samples[name].append(time_steps(step, a.steps))
    med = {name: statistics.median(v) for name, v in samples.items()}
    print(f"nn.Linear(4, 4), batch 2, forward + backward, {a.threads} thread(s); "
          f"median of {a.rounds} interleaved rounds x {a.steps} steps")
    for name in ways:
        lo, hi = min(samples[name]), max(samples[name])
        print(f"  {name:>7}: {med[name]:8.1f} µs/step   (rounds {lo:.1f} .. {hi:.1f})")
    print(f"  ortmod / eager: {med['ortmod'] / med['eager']:.2f}x   "
          f"ortmod - engine (ORTModule's Python per step): {med['ortmod'] - med['engine']:.1f} µs")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"median_us": med, "samples_us": samples, "rounds": a.rounds, "steps": a.steps,
                       "threads": a.threads}, f, indent=1)


if __name__ == "__main__":
    main()
