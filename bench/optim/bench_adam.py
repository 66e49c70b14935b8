"""Optimizer step time on a GPT-2-124M-sized parameter set (148 tensors, 124.4M values, fp32,
CPU): torch.optim.AdamW (for-loop, foreach, fused) vs ortmod's FusedAdam.

    .venv/bin/python bench/optim/bench_adam.py [--steps 7] [--warmup 2] [--scale 1.0] [--threads N]

Prints the median step time of each and its ratio to torch's fastest. Each optimizer gets
fresh zero state on the same parameters and gradients; gradients are fixed (the work per
step does not depend on their values). --scale shrinks every tensor (for a quick run).
A benchmark, not a test: `make test` does not run it.
"""
import argparse
import gc
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
import ortmod._C as _C  # noqa: E402
from ortmod.optim import AdamWMode, FusedAdam  # noqa: E402


def gpt2_small_shapes(scale=1.0):
    """GPT-2 small (124M): wte, wpe, 12 blocks x 12 tensors, ln_f — 148 tensors."""
    v, n_ctx, d = 50257, 1024, 768

    def s(*dims):
        return tuple(max(1, int(x * scale)) if i == 0 else x for i, x in enumerate(dims))

    shapes = [s(v, d), s(n_ctx, d)]
    for _ in range(12):
        shapes += [s(d), s(d),                 # ln_1
                   s(d, 3 * d), s(3 * d),      # attn.c_attn
                   s(d, d), s(d),              # attn.c_proj
                   s(d), s(d),                 # ln_2
                   s(d, 4 * d), s(4 * d),      # mlp.c_fc
                   s(4 * d, d), s(d)]          # mlp.c_proj
    shapes += [s(d), s(d)]                     # ln_f
    return shapes


def time_steps(opt, steps, warmup):
    for _ in range(warmup):
        opt.step()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        opt.step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--scale", type=float, default=1.0)
    ap.add_argument("--threads", type=int, default=0, help="torch's and ortmod's thread count (0: defaults)")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
        _C.optim_set_num_threads(args.threads)

    shapes = gpt2_small_shapes(args.scale)
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(s) * 0.02) for s in shapes]
    for p in params:
        p.grad = torch.randn(p.shape) * 1e-3
    numel = sum(p.numel() for p in params)
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"parameter set: {len(params)} tensors, {numel / 1e6:.1f}M fp32 values; "
          f"torch threads {torch.get_num_threads()}, ortmod optimizer threads {_C.optim_num_threads()}; "
          f"{args.warmup} warm-up + median of {args.steps} steps")

    kw = dict(lr=1e-4, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    variants = [
        ("torch AdamW (for-loop)", lambda: torch.optim.AdamW(params, foreach=False, **kw)),
        ("torch AdamW (foreach)", lambda: torch.optim.AdamW(params, foreach=True, **kw)),
        ("torch AdamW (fused)", lambda: torch.optim.AdamW(params, fused=True, **kw)),
        ("ortmod FusedAdam (mode 2)", lambda: FusedAdam(params, adam_w_mode=AdamWMode.ADAMW_TORCH, **kw)),
        ("ortmod FusedAdam (mode 1)", lambda: FusedAdam(params, adam_w_mode=AdamWMode.ADAMW_TRANSFORMERS, **kw)),
    ]
    results = {}
    for name, make in variants:
        try:
            opt = make()
        except (RuntimeError, ValueError) as e:       # e.g. fused=True unsupported on this build
            print(f"{name:28s} unavailable: {e}")
            continue
        med, best = time_steps(opt, args.steps, args.warmup)
        results[name] = med
        gbps = numel * 28 / med / 1e9                 # reads p, g, m, v; writes p, m, v (fp32)
        print(f"{name:28s} median {med * 1e3:8.1f} ms  (best {best * 1e3:7.1f} ms, {gbps:5.1f} GB/s effective)")
        del opt
        gc.collect()

    torch_times = {k: v for k, v in results.items() if k.startswith("torch")}
    if not torch_times:
        return
    fastest = min(torch_times, key=torch_times.get)
    print(f"\nratios (torch's fastest = {fastest}, {torch_times[fastest] * 1e3:.1f} ms; > 1 means faster than it):")
    for name, t in results.items():
        print(f"  {name:28s} {torch_times[fastest] / t:5.2f}x")
    fa = results.get("ortmod FusedAdam (mode 2)")
    if fa:
        print(f"FusedAdam (mode 2) vs torch fused: {results.get('torch AdamW (fused)', float('nan')) / fa:.2f}x, "
              f"vs foreach: {results.get('torch AdamW (foreach)', float('nan')) / fa:.2f}x, "
              f"vs for-loop: {results.get('torch AdamW (for-loop)', float('nan')) / fa:.2f}x")


if __name__ == "__main__":
    main()
