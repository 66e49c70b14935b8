"""GPT-2 124M training step on one GPU: ortmod vs eager vs torch.compile.

    python tests/gpu/bench_gpt2.py --out results/ [--dtype bf16] [--batch 8] [--seq 1024] [--budget 240]

A step is forward + backward + fused AdamW + zero_grad on the same model and data. When time is
left, ortmod runs with ortmod.optim.FusedAdam instead of torch's fused AdamW (ortmod+fa), and
again with ORTMOD_CUDA_ATTENTION=materialized (attention.cu's cuBLAS path instead
of flash.cu's kernels). For eager and ortmod, two more steps run under torch.profiler and their
kernels by GPU time go to kernels_eager.txt / kernels_ortmod.txt: what to tune next. Reports
ms/step, tokens/s, the ratios (ortmod / eager, ortmod / compile: > 1 means ortmod is faster)
and the CPU<->GPU synchronizations seen inside a timed step: torch's (sync debug mode, which sees
torch's own only) and the engine's (om_cuda_sync_count of libortmod_cuda.so: every cudaMalloc,
cudaFree, blocking cudaMemcpy and cuBLAS handle creation the provider makes; null when the
library cannot be read). That this count misses nothing (no kernel or copy blocks, everything is
enqueued on torch's current stream) is checked on the CPU emulator by tests/test_cuda_emulated.py's
streams group, whose training steps after a warm-up make no blocking call. Each variant is
skipped once the time budget is spent; a variant that fails records its error. Results:
bench_gpt2.json and .txt.
"""
import argparse
import ctypes
import json
import os
import sys
import time
import traceback
import warnings

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)


def make_model(dtype, seq):
    import transformers
    cfg = transformers.GPT2Config(n_positions=max(seq, 1024), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                                  use_cache=False)
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(cfg).to(device="cuda", dtype=dtype)


def engine_syncs():
    """The provider's count of blocking calls so far (the library the engine loads), or None."""
    path = os.environ.get("ORTMOD_CUDA_LIBRARY") or os.path.join(ROOT, "ortmod", "libortmod_cuda.so")
    try:
        lib = ctypes.CDLL(path)
        lib.om_cuda_sync_count.restype = ctypes.c_uint64
        return int(lib.om_cuda_sync_count())
    except (OSError, AttributeError):
        return None


def kernel_table(step, out_path, rows=40):
    """Two steps under torch.profiler (CUPTI sees every kernel of the process, the engine's
    included): the kernels by total GPU time, written to out_path. What to tune next comes from
    here."""
    from torch.profiler import ProfilerActivity, profile
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(2):
            step()
        torch.cuda.synchronize()
    table = prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=90)
    with open(out_path, "w") as f:
        f.write(table + "\n")


def bench(name, model, ids, warmup, steps, deadline, log, profile_to=None):
    if name.endswith("+fa"):   # ortmod.optim.FusedAdam (AdamW, torch's update rule) on the CUDA provider
        from ortmod.optim import AdamWMode, FusedAdam
        opt = FusedAdam(model.parameters(), lr=1e-4, eps=1e-8, weight_decay=0.01, adam_w_mode=AdamWMode.ADAMW_TORCH)
    else:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

    def step():
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    t0 = time.time()
    for _ in range(warmup):
        loss = step()
    torch.cuda.synchronize()
    first = time.time() - t0
    log(f"{name}: warmup {warmup} steps in {first:.1f}s, loss {loss.item():.4f}")
    if time.time() > deadline:
        raise TimeoutError("time budget spent during warmup")
    # synchronizations inside one step
    e0 = engine_syncs()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode(0)
    torch_syncs = sum("synchroniz" in str(x.message) for x in w)
    e1 = engine_syncs()
    eng_syncs = None if e0 is None or e1 is None else e1 - e0
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    n = 0
    for _ in range(steps):
        step()
        n += 1
        if time.time() > deadline:
            break
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / n
    if profile_to and time.time() + 4 * ms / 1e3 + 10 < deadline:
        try:
            kernel_table(step, profile_to)
            log(f"{name}: kernel table in {os.path.basename(profile_to)}")
        except Exception as e:   # the timing stands without it
            log(f"{name}: no kernel table ({type(e).__name__}: {str(e)[:200]})")
    return {"ms_per_step": ms, "steps": n, "warmup_s": first, "torch_syncs_in_step": torch_syncs,
            "engine_syncs_in_step": eng_syncs, "final_loss": float(loss.item())}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench_out")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq", type=int, default=1024)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--budget", type=float, default=240.0, help="seconds for the whole benchmark")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    t_start = time.time()
    deadline = t_start + a.budget
    lines = []

    def log(s):
        print(s, flush=True)
        lines.append(s)

    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[a.dtype]
    log(f"GPT-2 124M, {a.dtype}, batch {a.batch} x {a.seq}, device {torch.cuda.get_device_name()}, torch {torch.__version__}")
    ids = torch.randint(0, 50257, (a.batch, a.seq), device="cuda")
    results = {"config": vars(a), "device": torch.cuda.get_device_name(), "torch": torch.__version__}
    import ortmod
    from ortmod import ORTModule

    # last, when time is left: ortmod with attention.cu's cuBLAS path (scores materialized in fp32)
    # instead of flash.cu's kernels, to measure what the flash kernels are worth
    variants = [("eager", lambda m: m), ("ortmod", ORTModule), ("compile", torch.compile), ("ortmod+fa", ORTModule),
                ("ortmod-materialized", ORTModule)]
    for name, wrap in variants:
        if name == "ortmod-materialized":
            ortmod.options.cuda_attention = "materialized"
        if time.time() > deadline - 20:
            results[name] = {"error": "skipped: time budget spent"}
            log(f"{name}: skipped (time budget)")
            continue
        try:
            model = wrap(make_model(dtype, a.seq))
            prof = os.path.join(a.out, f"kernels_{name}.txt") if name in ("eager", "ortmod") else None
            r = bench(name, model, ids, a.warmup, a.steps, deadline, log, prof)
            if name == "ortmod":
                r["export_count"] = getattr(model, "_ortmod_export_count", None)
            results[name] = r
            log(f"{name}: {r['ms_per_step']:.1f} ms/step, {a.batch * a.seq / r['ms_per_step'] * 1e3:.0f} tok/s, "
                f"syncs in a step: torch {r['torch_syncs_in_step']}, engine {r['engine_syncs_in_step']}")
        except Exception as e:   # record and go on: the other variants still measure
            results[name] = {"error": f"{type(e).__name__}: {e}"[:2000]}
            log(f"{name}: FAILED {type(e).__name__}: {str(e)[:500]}")
            traceback.print_exc()
        finally:
            model = None
            ortmod.options.cuda_attention = "flash"
            torch.cuda.empty_cache()

    def ms(n):
        return results.get(n, {}).get("ms_per_step")
    # (key, faster variant, slower baseline, what the line says)
    for key, fast, base, what in (
            ("ortmod_vs_eager", "ortmod", "eager", "ortmod vs eager (goal >= 1.2x)"),
            ("ortmod_vs_compile", "ortmod", "compile", "ortmod vs torch.compile (goal >= 1.0x)"),
            ("ortmod_fa_vs_eager", "ortmod+fa", "eager", "ortmod + FusedAdam vs eager (torch's fused AdamW)"),
            ("flash_vs_materialized", "ortmod", "ortmod-materialized",
             "ortmod's flash attention vs its materialized scores")):
        if ms(fast) and ms(base):
            results[key] = ms(base) / ms(fast)
            log(f"{what}: {results[key]:.2f}x")
    results["wall_s"] = time.time() - t_start
    with open(os.path.join(a.out, "bench_gpt2.json"), "w") as f:
        json.dump(results, f, indent=2)
    with open(os.path.join(a.out, "bench_gpt2.txt"), "w") as f:
        f.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
