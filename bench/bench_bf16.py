"""bf16 training steps on the CPU: ORTModule against eager and torch.compile, in one process.

Two ways users train in bf16 on a CPU, each measured for every benchmark model:
- autocast: fp32 parameters, `torch.autocast("cpu", dtype=torch.bfloat16)` around the forward
  (eager, torch.compile and ORTModule, all three under autocast);
- a bf16 model: `model.bfloat16()` (eager and ORTModule; inductor's bf16 CPU backward is left out).
And, for scale, the fp32 step of eager and ORTModule (what bf16 buys, or costs, on this CPU).

Every mode steps with torch's SGD, so the figures compare forward + backward. Modes run interleaved,
one step of each in turn, so a load change slows all alike. Prints the median step time per mode
and ortmod's ratios (> 1: ortmod faster).

    .venv/bin/python bench/bench_bf16.py [--models mlp,gpt2,resnet,bert] [--steps 10] [--threads 2]
"""
import argparse
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.dirname(HERE))

import torch  # noqa: E402

import models  # noqa: E402

MODES = ("eager-ac", "compile-ac", "ortmod-ac", "eager-bf16", "ortmod-bf16", "eager-fp32", "ortmod-fp32")


def build(mode, ctor):
    torch.manual_seed(0)
    model = ctor().train()
    if mode.endswith("bf16"):
        model = model.bfloat16()
    if mode.startswith("compile"):
        model = torch.compile(model)
    elif mode.startswith("ortmod"):
        from ortmod import ORTModule
        model = ORTModule(model)
    return model


def make_step(mode, model, data):
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    if mode.endswith("bf16"):
        data = [d.bfloat16() if d.is_floating_point() else d for d in data]

    def step():
        if mode.endswith("-ac"):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(*data)
        else:
            loss = model(*data)
        loss.float().backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return step


def run(model_name, steps, warmup):
    ctor, batch_fn = models.BENCH_MODELS[model_name]
    data = batch_fn()
    steps_of, times = {}, {}
    for mode in MODES:
        try:
            step = make_step(mode, build(mode, ctor), data)
            for _ in range(1 + warmup):
                step()
            steps_of[mode], times[mode] = step, []
        except Exception as e:  # noqa: BLE001 - a failing mode becomes a cell
            times[mode] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:120] if str(e).strip() else ''}"
    for _ in range(steps):
        for mode, step in steps_of.items():
            t0 = time.perf_counter()
            step()
            times[mode].append(time.perf_counter() - t0)
    return {m: statistics.median(t) * 1e3 if isinstance(t, list) else t for m, t in times.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--models", default="mlp,gpt2,resnet,bert")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    print(f"bf16 training step, median ms over {a.steps} interleaved steps, {a.threads} threads, torch {torch.__version__}")
    print(f"{'model':8s}" + "".join(f"{m:>13s}" for m in MODES) +
          "   ortmod/eager(ac)  ortmod/compile(ac)  ortmod/eager(bf16)  ortmod bf16/fp32")
    for name in a.models.split(","):
        r = run(name, a.steps, a.warmup)
        cells = "".join(f"{r[m]:13.1f}" if isinstance(r[m], float) else f"{'error':>13s}" for m in MODES)

        def ratio(x, y):
            return f"{r[x] / r[y]:.2f}x" if isinstance(r[x], float) and isinstance(r[y], float) else "-"
        print(f"{name:8s}{cells}   {ratio('eager-ac', 'ortmod-ac'):>16s}  {ratio('compile-ac', 'ortmod-ac'):>18s}"
              f"  {ratio('eager-bf16', 'ortmod-bf16'):>18s}  {ratio('ortmod-fp32', 'ortmod-bf16'):>16s}")
        for m in MODES:
            if not isinstance(r[m], float):
                print(f"    {m}: {r[m]}")


if __name__ == "__main__":
    main()
