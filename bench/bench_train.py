"""Training-step speed on the CPU: eager PyTorch vs torch.compile (inductor) vs ORTModule.

A step is forward + backward + optimizer step + zero_grad. Each side steps with its fastest
optimizer, and those are the goal ratios:
  eager, compile   torch.optim.AdamW(fused=True)
  ortmod           ORTModule + ortmod.optim.FusedAdam (AdamW semantics)
Beside them, what a user switching sees and what the engine alone gains:
  eager-adamw      eager with torch's default AdamW (foreach)
  ortmod-adamw     ORTModule with torch's default AdamW
Every (model, mode) pair runs in its own process (clean peak memory, no cross-talk between
compilers), --rounds times in turns; the thread count is the same for all of them
(torch.set_num_threads, which the engine's pool follows). Reported per cell: median step time
over all rounds' timed steps, steps/s, first-call latency (first step: export or compile
included), peak resident memory of the process. Ratios are in steps/s (> 1: ortmod faster).

Roofline: the eager process counts one step's matrix FLOPs (torch's FlopCounterMode: matmuls,
convolutions, attention, forward and backward); the GEMM time at the machine's peak is that
count over the fastest float32 GEMM rate measured: OpenBLAS's own threads at 2048^3, the
engine's MatMul (its own AVX-512 kernel, ops/gemm_f32.c, where OpenBLAS runs a narrower one)
at 2048^3 and at the models' shapes. "rest" is the share of each mode's step beyond it (issue
18's goal for ortmod: <= 15%). "floor" is the least rest that training with AdamW allows: its
28 bytes of traffic per parameter at the measured memory bandwidth against the GEMMs at peak.

Non-GEMM time (issue 39), a measure that does not depend on the GEMM kernel: the step's median
time less its time inside GEMM calls, each side by its own profiler over a few more steps. eager
and compile: torch.profiler's self time of aten::mm/addmm/bmm/baddbmm/linear/matmul, and of the
convolutions (oneDNN runs each as one kernel) and, where eager runs attention as one kernel
(scaled_dot_product_attention), of that too. ortmod: the engine's profiler (om_engine_set_profiling):
each kernel's time inside om_gemm, the Conv kernels whole, and FusedAttention whole only where
eager's attention is one kernel (else its softmax counts outside GEMMs, as eager's does). Beside
each number: the CPU model, its FMA width, and each side's GEMM rate inside the step (matrix
FLOPs over its GEMM time); AdamW's own traffic floor stays in the roofline.

--gemm blas (the equal-GEMM switch): the engine's float32 products all go to OpenBLAS
(om_gemm_blas_only), pinned (OPENBLAS_CORETYPE, unless already set) to eager's vector width: its
Haswell (AVX2) kernel where eager's MKL runs AVX2 (AMD CPUs, CPUs without AVX-512), SkylakeX
where MKL runs AVX-512 (Intel's). Ratios then compare the steps with GEMMs at about one rate;
the printed rates say how close.

Also: per-step binding overhead (a tiny model whose kernels take ~1 us) and the engine's GEMM
path at the models' shapes against the same peak.

    .venv/bin/python bench/bench_train.py [--models mlp,gpt2,resnet,bert,llama] [--steps 20]
        [--warmup 3] [--threads N] [--modes eager,compile,ortmod,...] [--quick]
        [--gemm auto|blas] [--prof-steps 3]
    (--models all adds the other sizes: mlp-gelu, gpt2-192, resnet-w48, and GPT-2 124M at batch
    4 x 256, which runs min(--steps, 3) steps after one warm-up and one profiled step)

Writes bench/results/train_<timestamp>.json (and train_latest.json) and train_latest.png.
"""
import argparse
import ctypes
import ctypes.util
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
RESULTS = os.path.join(HERE, "results")
MODES = ("eager", "compile", "ortmod", "eager-adamw", "ortmod-adamw")
SHORT = {"eager": "eagr", "compile": "comp", "ortmod": "ortm", "eager-adamw": "e-aw", "ortmod-adamw": "o-aw"}
# (mine, other): the goal ratios first, then what a user switching sees, then the engine with torch's optimizer
RATIOS = (("ortmod", "eager"), ("ortmod", "compile"), ("ortmod", "eager-adamw"), ("ortmod-adamw", "eager-adamw"))


# models whose step takes seconds: (steps, warm-up steps, profiled steps) at most
HEAVY = {"gpt2-124m": (3, 1, 1)}

# GEMM-carrying ops of each side's profiler (module docstring): torch's by self time
TORCH_GEMM_OPS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::linear", "aten::matmul"}
TORCH_CONV_OPS = {"aten::conv2d", "aten::convolution", "aten::_convolution", "aten::mkldnn_convolution",
                  "aten::convolution_backward", "aten::mkldnn_convolution_backward", "aten::_slow_conv2d_forward",
                  "aten::_slow_conv2d_backward", "aten::thnn_conv2d", "aten::_nnpack_spatial_convolution"}
TORCH_SDPA_OPS = {"aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
                  "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
                  "aten::_scaled_dot_product_attention_math", "aten::_scaled_dot_product_efficient_attention"}
ENGINE_CONV_OPS = {"Conv", "ConvGradX", "ConvGradW", "ConvTranspose"}
ENGINE_ATTENTION_OPS = {"FusedAttention", "FusedAttentionGrad"}


def is_ortmod(mode):
    return mode.startswith("ortmod")


def gemm_switch():
    """--gemm blas reaches the children as BENCH_GEMM=blas: every float32 product of the engine
    goes to BLAS (ops/gemm_f32.c's om_gemm_blas_only)."""
    if os.environ.get("BENCH_GEMM") != "blas":
        return
    from ortmod import _C
    ctypes.c_int.in_dll(ctypes.CDLL(_C.__file__), "om_gemm_blas_only").value = 1


def gemm_kernel_name(mode):
    """Whose float32 GEMM kernel this process ran: torch's BLAS for eager and compile; for
    ortmod the engine's AVX-512 kernel when it took products (ops/gemm_f32.c), else OpenBLAS
    with the kernel it loaded."""
    import torch
    if not is_ortmod(mode):
        blas = "MKL" if torch.backends.mkl.is_available() else "torch's BLAS"
        return f"{blas} (ATen {torch.backends.cpu.get_cpu_capability()})"
    from ortmod import _C
    lib = ctypes.CDLL(_C.__file__)
    core = "?"
    if hasattr(lib, "openblas_get_corename"):
        lib.openblas_get_corename.restype = ctypes.c_char_p
        core = lib.openblas_get_corename().decode()
    if _C.gemm_f32_count() > 0:
        return f"engine AVX-512 (OpenBLAS {core} loaded)"
    return f"OpenBLAS {core}"


def timed_steps(step, n):
    """Wall seconds of n steps (the profiled ones: their GEMM time is taken out of this same time,
    so that load that comes and goes between timed and profiled steps cannot skew it)."""
    t = 0.0
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        t += time.perf_counter() - t0
    return t


def torch_gemm_seconds(step, n):
    """Per step: the profiled step's wall time, and torch.profiler's self time of the
    GEMM-carrying ops over n steps, split as (matmuls, convolutions, scaled_dot_product_attention)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        wall = timed_steps(step, n)
    mm = conv = sdpa = 0.0
    for ev in prof.key_averages():
        us = ev.self_cpu_time_total
        if ev.key in TORCH_GEMM_OPS:
            mm += us
        elif ev.key in TORCH_CONV_OPS:
            conv += us
        elif ev.key in TORCH_SDPA_OPS:
            sdpa += us
    return wall / n, mm / n / 1e6, conv / n / 1e6, sdpa / n / 1e6


def engine_gemm_seconds(model, step, n):
    """Per step: the profiled step's wall time, and the engine profiler's time inside om_gemm
    over n steps, split as (products outside conv and attention kernels, Conv kernels whole,
    FusedAttention's products, its kernels whole)."""
    from ortmod._explain import engine_reports
    for entry in model._ortmod_cache.values():
        entry.engine.set_profiling(True)     # resets the counters
    wall = timed_steps(step, n)
    mm = conv = att_gemm = att_whole = 0.0
    for r in engine_reports(model):
        for o in r.get("profile", {}).get("ops", []):
            if o["op"] in ENGINE_CONV_OPS:
                conv += o["ms"]
            elif o["op"] in ENGINE_ATTENTION_OPS:
                att_gemm += o["gemm_ms"]
                att_whole += o["ms"]
            else:
                mm += o["gemm_ms"]
    for entry in model._ortmod_cache.values():
        entry.engine.set_profiling(False)
    return (wall / n,) + tuple(x / n / 1e3 for x in (mm, conv, att_gemm, att_whole))


def make_optimizer(mode, model):
    """The same AdamW hyperparameters everywhere (torch's defaults, lr 1e-4)."""
    import torch
    if mode == "ortmod":
        from ortmod.optim import AdamWMode, FusedAdam
        return FusedAdam(model.parameters(), lr=1e-4, eps=1e-8, weight_decay=0.01, adam_w_mode=AdamWMode.ADAMW_TORCH)
    fused = mode in ("eager", "compile")
    return torch.optim.AdamW(model.parameters(), lr=1e-4, fused=fused)


def matrix_flops(model, data):
    """One forward + backward's matmul/conv/attention FLOPs, as torch counts them."""
    from torch.utils.flop_counter import FlopCounterMode
    counter = FlopCounterMode(display=False)
    with counter:
        model(*data).backward()
    model.zero_grad(set_to_none=True)
    return counter.get_total_flops()


# ---------------------------------------------------------------------------------------
# child: one (model, mode)
# ---------------------------------------------------------------------------------------
def run_child(model_name, mode, steps, warmup, threads, prof_steps=3):
    sys.path.insert(0, HERE)
    sys.path.insert(0, ROOT)
    import torch

    import models
    torch.manual_seed(0)
    torch.set_num_threads(threads)
    gemm_switch()
    ctor, batch_fn = models.BENCH_MODELS[model_name]
    model = ctor()
    model.train()
    data = batch_fn()
    out = {"model": model_name, "mode": mode, "threads": torch.get_num_threads(),
           "params": sum(p.numel() for p in model.parameters())}
    try:
        if mode == "eager":
            out["matrix_flops"] = matrix_flops(model, data)
        if mode == "compile":
            model = torch.compile(model)
        elif is_ortmod(mode):
            from ortmod import ORTModule
            model = ORTModule(model)
        opt = make_optimizer(mode, model)

        def step():
            loss = model(*data)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            return loss

        t0 = time.perf_counter()
        loss = step()
        out["first_call_s"] = time.perf_counter() - t0
        out["first_loss"] = float(loss)
        for _ in range(warmup):
            step()
        times = []
        for _ in range(steps):
            t0 = time.perf_counter()
            step()
            times.append(time.perf_counter() - t0)
        out["median_s"] = statistics.median(times)
        out["min_s"] = min(times)
        out["steps_per_s"] = 1.0 / out["median_s"]
        out["times_s"] = times
        if prof_steps > 0:   # after the timed steps: the profilers cost time of their own
            if is_ortmod(mode):
                out["gemm_s"] = dict(zip(("step", "matmul", "conv", "attention_products", "attention_whole"),
                                         engine_gemm_seconds(model, step, prof_steps)))
            else:
                out["gemm_s"] = dict(zip(("step", "matmul", "conv", "sdpa"), torch_gemm_seconds(step, prof_steps)))
        out["gemm_kernel"] = gemm_kernel_name(mode)
        if is_ortmod(mode):
            try:
                from ortmod import _C
                out["engine_threads"] = _C.get_num_threads() if hasattr(_C, "get_num_threads") else \
                    ctypes.CDLL(_C.__file__).om_get_num_threads()
            except Exception:  # noqa: BLE001 - informative only
                pass
    except Exception as e:  # noqa: BLE001 - every failure becomes a cell, the run goes on
        kind = type(e).__name__
        msg = str(e).strip().splitlines()[0][:300] if str(e).strip() else kind
        if is_ortmod(mode) and ("Unsupported" in kind or "unsupported" in msg.lower()):
            out["error"] = "unsupported: " + msg
        else:
            out["error"] = f"{kind}: {msg}"
        out["traceback"] = traceback.format_exc()[-2000:]
    out["peak_rss_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
    return out


def run_interleaved(model_name, modes, steps, warmup, threads):
    """All modes in one process, one step of each in turn: a machine whose load changes
    during the run (other jobs) slows every mode alike, so the ratios stay meaningful."""
    sys.path.insert(0, HERE)
    sys.path.insert(0, ROOT)
    import torch

    import models
    torch.set_num_threads(threads)
    ctor, batch_fn = models.BENCH_MODELS[model_name]
    data = batch_fn()
    runners, out = {}, {}
    for mode in modes:
        torch.manual_seed(0)
        model = ctor()
        model.train()
        try:
            if mode == "compile":
                model = torch.compile(model)
            elif is_ortmod(mode):
                from ortmod import ORTModule
                model = ORTModule(model)
            opt = make_optimizer(mode, model)

            def step(model=model, opt=opt):
                loss = model(*data)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            for _ in range(1 + warmup):
                step()
            runners[mode] = step
            out[mode] = []
        except Exception as e:  # noqa: BLE001
            out[mode] = {"error": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:300] if str(e).strip() else ''}"}
    for _ in range(steps):
        for mode, step in runners.items():
            t0 = time.perf_counter()
            step()
            out[mode].append(time.perf_counter() - t0)
    res = {}
    for mode in modes:
        if isinstance(out[mode], dict):
            res[mode] = out[mode]
        else:
            res[mode] = {"median_s": statistics.median(out[mode]), "min_s": min(out[mode]),
                         "steps_per_s": 1.0 / statistics.median(out[mode]), "times_s": out[mode]}
    return res


def binding_overhead(threads, iters=2000):
    """ORTModule forward+backward on a model whose kernels take about a microsecond: what is
    left is the Python wrapper, the binding, DLPack and the engine's per-call work."""
    sys.path.insert(0, ROOT)
    import torch
    import torch.nn as nn
    torch.set_num_threads(threads)
    from ortmod import ORTModule

    class Tiny(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(8, 8)

        def forward(self, x):
            return self.l(x).sum()

    res = {}
    x = torch.randn(4, 8)
    for name, m in (("eager", Tiny()), ("ortmod", ORTModule(Tiny()))):
        for _ in range(50):
            m(x).backward()
        t0 = time.perf_counter()
        for _ in range(iters):
            m(x).backward()
        res[name + "_fwd_bwd_us"] = (time.perf_counter() - t0) / iters * 1e6
    # the engine alone: forward + backward straight through _C would need the binding's
    # internals; the tiny model's kernels (a 4x8x8 GEMM, a sum, their gradients) take ~1 µs
    res["kernel_us_estimate"] = 1.0
    res["overhead_us"] = res["ortmod_fwd_bwd_us"] - res["kernel_us_estimate"]
    return res


# ---------------------------------------------------------------------------------------
# GEMM roofline: the engine's GEMM path against the BLAS's own peak
# ---------------------------------------------------------------------------------------
GEMM_SHAPES = {
    # (M, N, K) of forward, dX and dW products: tokens x in -> out
    "mlp": [(256, 1024, 1024), (256, 1024, 1024), (1024, 1024, 256)],
    "gpt2": [(1024, 768, 256), (1024, 256, 768), (256, 768, 1024),       # qkv
             (1024, 1024, 256), (1024, 256, 1024), (256, 1024, 1024),    # fc, out
             (1024, 4096, 256), (1024, 256, 4096), (256, 4096, 1024),    # lm head
             (128, 128, 64), (128, 64, 128)],                            # attention, per head
}


def gemm_roofline(threads):
    import numpy as np
    sys.path.insert(0, ROOT)
    path = None
    try:
        import ortmod._C as C  # the OpenBLAS the engine is linked with is already loaded
        with open("/proc/self/maps") as f:
            for line in f:
                if "/libopenblas" in line:
                    path = line.split()[-1]
                    break
    except Exception:  # noqa: BLE001
        pass
    lib = ctypes.CDLL(path or ctypes.util.find_library("openblas") or "libopenblas.so.0")
    lib.openblas_set_num_threads(threads)
    sg = lib.cblas_sgemm
    fp = ctypes.POINTER(ctypes.c_float)
    sg.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, fp, ctypes.c_int, fp, ctypes.c_int, ctypes.c_float, fp,
                                        ctypes.c_int]

    def gflops(M, N, K, reps=None):
        a = np.random.rand(M, K).astype(np.float32)
        b = np.random.rand(K, N).astype(np.float32)
        c = np.zeros((M, N), np.float32)
        args = (101, 111, 111, M, N, K, 1.0, a.ctypes.data_as(fp), K, b.ctypes.data_as(fp), N, 0.0,
                c.ctypes.data_as(fp), N)
        sg(*args)
        flop = 2.0 * M * N * K
        reps = reps or max(3, int(2e9 / flop))
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(reps):
                sg(*args)
            best = min(best, (time.perf_counter() - t0) / reps)
        return flop / best / 1e9

    peak = gflops(2048, 2048, 2048, reps=3)   # OpenBLAS with its own threads: the machine's practical peak
    core = None
    if hasattr(lib, "openblas_get_corename"):
        lib.openblas_get_corename.restype = ctypes.c_char_p
        core = lib.openblas_get_corename().decode()
    engine_gflops = engine_matmul_gflops(threads)
    # the engine's own float32 kernel (ops/gemm_f32.c) can outrun a BLAS pinned to AVX2 kernels:
    # the peak is the faster of the two, so that "rest" never counts GEMM time as other work
    # (the models' shapes can run faster than 2048^3, whose rows 8 KiB apart share L1 sets: the
    # peak is the fastest rate measured at all)
    engine_peak = engine_gflops(2048, 2048, 2048)
    rows = {"blas_peak_gflops": peak, "engine_peak_gflops": engine_peak, "blas": path, "blas_core": core,
            "threads": threads, "shapes": {}}
    for model, shapes in GEMM_SHAPES.items():
        for (M, N, K) in shapes:
            rows["shapes"][f"{model} {M}x{N}x{K}"] = {"gflops": engine_gflops(M, N, K)}
    rows["stream_gbs"] = stream_bandwidth(threads)
    rows["peak_gflops"] = peak = max([peak, engine_peak] + [v["gflops"] for v in rows["shapes"].values()])
    for v in rows["shapes"].values():
        v["of_peak"] = v["gflops"] / peak
    return rows


def engine_matmul_gflops(threads):
    """GFLOP/s of a one-node MatMul model run by the engine: om_gemm (BLAS single-threaded in
    blocks, or its AVX-512 kernel where OpenBLAS runs a narrower one, on the engine's pool), plus
    the engine's per-call work."""
    import numpy as np
    import onnx
    import torch
    from onnx import TensorProto, helper
    from ortmod import _C
    _C.set_num_threads(threads)

    def measure(M, N, K):
        g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "mm",
                              [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["m", "k"]),
                               helper.make_tensor_value_info("b", TensorProto.FLOAT, ["k", "n"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", "n"])])
        model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)])
        eng = _C.Engine(model.SerializeToString(), [False, False])
        a, b = torch.rand(M, K), torch.rand(K, N)
        eng.forward([a, b], False)
        flop = 2.0 * M * N * K
        reps = max(3, int(2e9 / flop))
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(reps):
                eng.forward([a, b], False)
            best = min(best, (time.perf_counter() - t0) / reps)
        return flop / best / 1e9
    return measure


# ---------------------------------------------------------------------------------------
# parent
# ---------------------------------------------------------------------------------------
def spawn(args_list, timeout):
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    try:
        p = subprocess.run([sys.executable, os.path.abspath(__file__)] + args_list, capture_output=True, text=True,
                           timeout=timeout, env=env, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout} s"}
    for line in reversed(p.stdout.splitlines()):
        if line.startswith("@@RESULT "):
            return json.loads(line[len("@@RESULT "):])
    tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["no output"]
    return {"error": f"process failed (rc {p.returncode}): {tail[0][:300]}"}


def fmt_cell(r):
    if "error" in r:
        return r["error"][:60]
    return f"{r['median_s'] * 1e3:8.1f} ms {r['steps_per_s']:6.2f}/s"


def cpuinfo():
    """The first processor's fields of /proc/cpuinfo (empty where there is none)."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if not line.strip():
                    break
                k, _, v = line.partition(":")
                info[k.strip()] = v.strip()
    except OSError:
        pass
    return info


def fma_width(info):
    """(text, bits): the width at which the cores execute FMAs. AVX-512 is not always 512 bits
    wide: Zen 4 (AMD family 25) and Zen 5's mobile parts run each 512-bit FMA as two 256-bit
    halves, so a 512-bit kernel gains little there over a 256-bit one."""
    flags = set(info.get("flags", "").split())
    vendor, name = info.get("vendor_id", ""), info.get("model name", "")
    try:
        family = int(info.get("cpu family", "0"))
    except ValueError:
        family = 0
    if "avx512f" in flags:
        if vendor == "AuthenticAMD" and family == 25:
            return "AVX-512 on 256-bit datapaths (Zen 4: each 512-bit FMA double-pumped)", 256
        if vendor == "AuthenticAMD" and family >= 26 and "Ryzen AI" in name:
            return "AVX-512 on 256-bit datapaths (Zen 5 mobile)", 256
        if vendor == "AuthenticAMD" and family >= 26:
            return "AVX-512 on 512-bit datapaths (Zen 5)", 512
        return "AVX-512 on 512-bit datapaths", 512
    if "avx2" in flags and "fma" in flags:
        return "AVX2 with FMA, 256-bit", 256
    return "no FMA (SSE, 128-bit)", 128


def eager_blas_core(info):
    """The OpenBLAS kernel of eager's vector width: MKL runs AVX-512 on Intel's AVX-512 CPUs and
    AVX2 elsewhere (AMD's included)."""
    flags = set(info.get("flags", "").split())
    if "avx512f" in flags and info.get("vendor_id") == "GenuineIntel":
        return "SkylakeX"
    return "Haswell"


def machine():
    info = cpuinfo()
    fl = info.get("flags", "").split()
    flags = " ".join(x for x in ("avx2", "fma", "avx512f") if x in fl)
    width, bits = fma_width(info)
    return {"cpu": info.get("model name", "unknown"), "vendor": info.get("vendor_id", ""),
            "family_model": f"{info.get('cpu family', '?')}/{info.get('model', '?')}", "isa": flags,
            "fma_width": width, "fma_bits": bits, "online_cpus": os.cpu_count(), "python": platform.python_version(),
            "load_avg": os.getloadavg()}


def stream_bandwidth(threads):
    """GB/s of torch.add over 64M float32 (two arrays read, one written: 768 MiB a pass), best of
    five, at the benchmark's thread count: what a memory-bound pass such as an optimizer's can move."""
    import torch
    torch.set_num_threads(threads)
    a, b = torch.rand(1 << 26), torch.rand(1 << 26)
    c = torch.empty_like(a)
    torch.add(a, b, out=c)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        torch.add(a, b, out=c)
        best = min(best, time.perf_counter() - t0)
    return 3 * a.numel() * 4 / best / 1e9


# AdamW's least traffic per float32 parameter: reads parameter, gradient and both moments, writes
# parameter and both moments (a fused one-pass optimizer moves exactly this)
ADAM_BYTES_PER_PARAM = 7 * 4


def roofline(results, models_, modes, peak_gflops, stream_gbs=None):
    """Per model: the step's matrix FLOPs, their time at the measured sgemm peak, and each mode's
    rest (the step beyond that time) as a share of its step. With the measured stream bandwidth,
    also the floor of the rest: the optimizer's own traffic at that bandwidth against the GEMMs at
    peak, the least rest any mode training with Adam can have, whatever else it fuses."""
    print(f"\nroofline: matrix FLOPs per step (FlopCounterMode on the eager model) at {peak_gflops:.1f} GFLOP/s; "
          "rest = share of the step beyond that (goal for ortmod: <= 15%)"
          + (f"; floor = AdamW's {ADAM_BYTES_PER_PARAM} bytes per parameter at {stream_gbs:.1f} GB/s (torch.add) "
             "alone" if stream_gbs else ""))
    print(f"  {'model':11s}{'GFLOP/step':>11s}{'GEMM ms':>9s}{'Adam ms':>9s}{'floor':>7s}"
          + "".join(f"{'rest ' + SHORT[md]:>11s}" for md in modes))
    out = {}
    for m in models_:
        flops = results[m].get("eager", {}).get("matrix_flops")
        if not flops:
            continue
        gemm_s = flops / (peak_gflops * 1e9)
        params = results[m]["eager"].get("params")
        adam_s = params * ADAM_BYTES_PER_PARAM / (stream_gbs * 1e9) if stream_gbs and params else None
        floor = adam_s / (gemm_s + adam_s) if adam_s else None
        rest = {md: 1.0 - gemm_s / results[m][md]["median_s"] for md in modes if "median_s" in results[m][md]}
        out[m] = {"matrix_gflop": flops / 1e9, "gemm_ms_at_peak": gemm_s * 1e3, "rest_share": rest,
                  "adam_ms_at_stream": adam_s * 1e3 if adam_s else None, "rest_floor": floor}
        print(f"  {m:11s}{flops / 1e9:11.2f}{gemm_s * 1e3:9.1f}"
              + (f"{adam_s * 1e3:9.1f}{100 * floor:6.0f}%" if adam_s else f"{'-':>9s}{'-':>7s}")
              + "".join(f"{(f'{100 * rest[md]:.0f}%' if md in rest else '-'):>11s}" for md in modes))
    return out


def step_gemm_seconds(results_m, mode):
    """(profiled step, its time inside GEMM-carrying calls) in seconds, the median of each over
    the rounds, by the mode's own profiler (the module docstring says which calls); the
    non-GEMM time is the median over the rounds of their difference. None when not profiled."""
    rounds = results_m.get(mode, {}).get("gemm_rounds_s")
    if not rounds:
        return None
    # FusedAttention counts whole where eager's attention is one kernel too, else its products only
    torch_side = [g for md in ("eager", "eager-adamw", "compile") for g in results_m.get(md, {}).get("gemm_rounds_s", [])]
    whole = any(g["sdpa"] > 0 for g in torch_side)

    def gemm(g):
        if not is_ortmod(mode):
            return g["matmul"] + g["conv"] + g["sdpa"]
        return g["matmul"] + g["conv"] + (g["attention_whole"] if whole else g["attention_products"])
    return (statistics.median(g["step"] for g in rounds), statistics.median(gemm(g) for g in rounds),
            statistics.median(g["step"] - gemm(g) for g in rounds))


def non_gemm_table(results, models_, modes, mach, roof):
    """Per model and mode: the step's median time less its GEMM time, with the GEMM rate that
    time gives the step's matrix FLOPs; ortmod's non-GEMM time over eager's and compile's (issue
    39's goals: <= 0.5 and <= 0.7); AdamW's traffic floor from the roofline."""
    print(f"\nnon-GEMM time per step (ms): a profiled step less its time inside GEMM calls, each side by its own "
          f"profiler (median over rounds); [GFLOP/s] = the step's matrix FLOPs over that side's GEMM time.\n  CPU: {mach['cpu']} "
          f"({mach['vendor']} {mach['family_model']}), FMAs: {mach['fma_width']}; --gemm {mach['gemm_switch']}, "
          f"OPENBLAS_CORETYPE={mach['openblas_coretype'] or 'unset'}")
    head = f"  {'model':11s}" + "".join(f"{SHORT[md] + ' ms [GF/s]':>20s}" for md in modes) + \
        f"{'ortm/eagr':>10s}{'ortm/comp':>10s}{'AdamW floor':>12s}"
    print(head)
    out = {}
    kernels = {}
    for m in models_:
        flops = results[m].get("eager", {}).get("matrix_flops")
        row, cells = f"  {m:11s}", {}
        for md in modes:
            r = results[m].get(md, {})
            sg = step_gemm_seconds(results[m], md)
            if "median_s" not in r or sg is None:
                row += f"{'-':>20s}"
                continue
            step, g, non_gemm = sg
            rate = flops / g / 1e9 if flops and g > 0 else None
            cells[md] = {"non_gemm_ms": non_gemm * 1e3, "gemm_ms": g * 1e3, "gemm_gflops": rate,
                         "profiled_step_ms": step * 1e3, "gemm_kernel": r.get("gemm_kernel")}
            kernels.setdefault(md, set()).add(r.get("gemm_kernel"))
            row += f"{cells[md]['non_gemm_ms']:>10.1f}" + (f" [{rate:5.0f}]" if rate else f" {'[-]':>7s}") + "  "
        for other in ("eager", "compile"):
            if "ortmod" in cells and other in cells and cells[other]["non_gemm_ms"] > 0:
                cells[f"ortmod/{other}"] = cells["ortmod"]["non_gemm_ms"] / cells[other]["non_gemm_ms"]
                row += f"{cells[f'ortmod/{other}']:>9.2f}x"
            else:
                row += f"{'-':>10s}"
        adam = roof.get(m, {}).get("adam_ms_at_stream")
        row += f"{(f'{adam:.1f} ms' if adam else '-'):>12s}"
        cells["adamw_floor_ms"] = adam
        out[m] = cells
        print(row)
    for md, ks in kernels.items():
        print(f"  {SHORT[md]}: GEMMs on {', '.join(sorted(k or '?' for k in ks))}")
    print("  goals (issue 39): ortmod's non-GEMM time <= 0.5x eager's and <= 0.7x torch.compile's")
    return out


def write_png(path, results, models_, modes):
    """Bar chart of steps/s per model and mode; matplotlib when installed, else a plain PNG
    drawn by hand (bars only, colours: eager grey, compile blue, ortmod orange)."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(8, 4))
        w = 0.8 / len(modes)
        for j, mode in enumerate(modes):
            ys = [results[m][mode].get("steps_per_s", 0) for m in models_]
            ax.bar([i + j * w for i in range(len(models_))], ys, w, label=mode)
        ax.set_xticks([i + w * (len(modes) - 1) / 2 for i in range(len(models_))])
        ax.set_xticklabels(models_)
        ax.set_ylabel("training steps / s (higher is better)")
        ax.set_yscale("log")
        ax.legend()
        ax.set_title("CPU training step: eager vs torch.compile vs ORTModule")
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        return "matplotlib"
    except ImportError:
        pass
    import struct
    import zlib
    W, H = 640, 320
    px = [[(255, 255, 255)] * W for _ in range(H)]
    colors = {"eager": (128, 128, 128), "compile": (31, 119, 180), "ortmod": (255, 127, 14),
              "eager-adamw": (190, 190, 190), "ortmod-adamw": (214, 39, 40)}
    vals = [results[m][md].get("steps_per_s", 0) for m in models_ for md in modes]
    top = max(vals + [1e-9])
    group = W // max(1, len(models_))
    bw = max(2, (group - 20) // max(1, len(modes)))
    for i, m in enumerate(models_):
        for j, md in enumerate(modes):
            h = int((H - 20) * results[m][md].get("steps_per_s", 0) / top)
            x0 = i * group + 10 + j * bw
            for y in range(H - 1 - h, H - 1):
                for x in range(x0, min(W, x0 + bw - 2)):
                    px[y][x] = colors.get(md, (0, 0, 0))
    raw = b"".join(b"\x00" + bytes(c for p in row for c in p) for row in px)

    def chunk(t, d):
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d) & 0xFFFFFFFF)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", W, H, 8, 2, 0, 0, 0)) +
                chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))
    return "hand-written PNG (bars: grey eager, blue compile, orange ortmod)"


def main():
    sys.path.insert(0, HERE)
    from models import BENCH_MODELS, DEFAULT_MODELS
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=",".join(DEFAULT_MODELS), help="'all': every model in bench/models.py")
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--threads", type=int, default=0, help="0: torch's default")
    ap.add_argument("--timeout", type=int, default=1200, help="seconds per (model, mode) process")
    ap.add_argument("--quick", action="store_true", help="5 steps, 1 warm-up (a smoke run)")
    ap.add_argument("--no-extras", action="store_true", help="skip the binding overhead and GEMM roofline")
    ap.add_argument("--child", nargs=2, metavar=("MODEL", "MODE"), help=argparse.SUPPRESS)
    ap.add_argument("--overhead-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--interleave-child", metavar="MODEL", help=argparse.SUPPRESS)
    ap.add_argument("--rounds", type=int, default=2,
                    help="processes per (model, mode), run in turns (eager, compile, ortmod, eager, ...) so that "
                         "load from other jobs that comes and goes hits every mode; the reported step time is the "
                         "median over all rounds' steps")
    ap.add_argument("--interleave", action="store_true",
                    help="time the modes step by step in one process instead (their thread pools then disturb "
                         "each other: OpenBLAS's spinning threads slow torch's OpenMP team)")
    ap.add_argument("--gemm-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--gemm", default="auto", choices=("auto", "blas"),
                    help="blas: the engine's float32 products on OpenBLAS pinned to eager's vector width (equal "
                         "GEMM rates; see the module docstring)")
    ap.add_argument("--prof-steps", type=int, default=3,
                    help="profiled steps per process after the timed ones, for the non-GEMM time (0: none)")
    a = ap.parse_args()
    if a.quick:
        a.steps, a.warmup = 5, 1
    if a.threads <= 0:
        import torch
        a.threads = torch.get_num_threads()

    if a.child:
        print("@@RESULT " + json.dumps(run_child(a.child[0], a.child[1], a.steps, a.warmup, a.threads,
                                                 a.prof_steps)))
        return
    if a.interleave_child:
        print("@@RESULT " + json.dumps(run_interleaved(a.interleave_child, a.modes.split(","), a.steps, a.warmup,
                                                       a.threads)))
        return
    if a.overhead_child:
        print("@@RESULT " + json.dumps(binding_overhead(a.threads)))
        return
    if a.gemm_child:
        gemm_switch()
        print("@@RESULT " + json.dumps(gemm_roofline(a.threads)))
        return

    models_ = list(BENCH_MODELS) if a.models == "all" else [m for m in a.models.split(",") if m]
    modes = [m for m in a.modes.split(",") if m]
    mach = machine()
    if a.gemm == "blas":   # the children inherit both
        os.environ["BENCH_GEMM"] = "blas"
        os.environ.setdefault("OPENBLAS_CORETYPE", eager_blas_core(cpuinfo()))
    else:
        os.environ.pop("BENCH_GEMM", None)
    mach["gemm_switch"] = a.gemm
    mach["openblas_coretype"] = os.environ.get("OPENBLAS_CORETYPE")
    print(f"machine: {mach['cpu']} ({mach['vendor']} family/model {mach['family_model']}; {mach['isa']}; FMAs: "
          f"{mach['fma_width']}), {mach['online_cpus']} online CPUs, load average {mach['load_avg'][0]:.1f}")
    print(f"GEMMs: --gemm {a.gemm}" + (" (the engine's float32 products on OpenBLAS)" if a.gemm == "blas" else "")
          + f"; OPENBLAS_CORETYPE={mach['openblas_coretype'] or 'unset'}; each cell's kernel and GEMM rate are "
          "printed with the non-GEMM table")
    print(f"threads: {a.threads} for torch, torch.compile and the ortmod pool (BLAS single-threaded inside it); "
          f"{a.steps} timed steps after {a.warmup} warm-up; step = fwd + bwd + optimizer + zero_grad; eager and "
          f"compile step with AdamW(fused=True), ortmod with FusedAdam, *-adamw with torch's default AdamW")
    print("step times: " + ("the modes take turns step by step in one process" if a.interleave else
                            f"one process per (model, mode), {a.rounds} rounds taken in turns; median over all steps")
          + "; first call = the first step (export/compile included), min over rounds; peak RSS of the process\n")
    results = {}
    for m in models_:
        results[m] = {}
        rounds = 1 if a.interleave else max(1, a.rounds)
        runs = {mode: [] for mode in modes}
        steps, warmup, prof_steps = a.steps, a.warmup, a.prof_steps
        if m in HEAVY:
            steps, warmup, prof_steps = (min(x, cap) for x, cap in zip((steps, warmup, prof_steps), HEAVY[m]))
        for _ in range(rounds):
            for mode in modes:
                runs[mode].append(spawn(["--child", m, mode, "--steps", str(steps if not a.interleave else 3),
                                         "--warmup", str(warmup if not a.interleave else 1),
                                         "--prof-steps", str(prof_steps), "--threads", str(a.threads)], a.timeout))
        for mode in modes:
            ok = [r for r in runs[mode] if "error" not in r]
            if not ok:
                results[m][mode] = runs[mode][0]
                continue
            r = dict(ok[0])
            times = [t for x in ok for t in x["times_s"]]
            r.update(median_s=statistics.median(times), min_s=min(times), steps_per_s=1.0 / statistics.median(times),
                     times_s=times, round_medians_s=[x["median_s"] for x in ok],
                     first_call_s=min(x["first_call_s"] for x in ok), peak_rss_mib=max(x["peak_rss_mib"] for x in ok))
            r["gemm_rounds_s"] = [x["gemm_s"] for x in ok if "gemm_s" in x]
            results[m][mode] = r
        if a.interleave:
            inter = spawn(["--interleave-child", m, "--modes", ",".join(modes), "--steps", str(a.steps),
                           "--warmup", str(a.warmup), "--threads", str(a.threads)], a.timeout * len(modes))
            for mode in modes:
                r, got = results[m][mode], inter.get(mode, inter)
                if "error" in r:
                    continue
                if "error" in got:
                    r["error"] = got["error"]
                else:
                    r.update({k: got[k] for k in ("median_s", "min_s", "steps_per_s", "times_s")})
        for mode in modes:
            print(f"  {m:7s} {mode:8s} {fmt_cell(results[m][mode])}", flush=True)

    def ratio(m, other, mine="ortmod"):
        o, x = results[m].get(mine, {}), results[m].get(other, {})
        if "steps_per_s" in o and "steps_per_s" in x:
            return o["steps_per_s"] / x["steps_per_s"]
        return None

    ratio_names = [f"{SHORT[mine]}/{SHORT[other]}" for mine, other in RATIOS]
    head = f"\n{'model':11s}" + "".join(f"{md + ' (median)':>22s}" for md in modes) + \
        "".join(f"{n:>11s}" for n in ratio_names) + f"{'1st ort s':>10s}{'1st comp s':>11s}" + \
        "".join(f"{'RSS ' + SHORT.get(md, md[:4]) + ' MiB':>14s}" for md in modes)
    print(head)
    print("-" * len(head))
    for m in models_:
        row = f"{m:11s}"
        for md in modes:
            row += f"{fmt_cell(results[m][md]):>22s}"
        for mine, other in RATIOS:
            r = ratio(m, other, mine)
            row += f"{(f'{r:.2f}x' if r else '-'):>11s}"
        fo = results[m].get("ortmod", {}).get("first_call_s")
        fc = results[m].get("compile", {}).get("first_call_s")
        row += f"{(f'{fo:.2f}' if fo else '-'):>10s}{(f'{fc:.2f}' if fc else '-'):>11s}"
        for md in modes:
            rss = results[m][md].get("peak_rss_mib")
            row += f"{(f'{rss:.0f}' if rss else '-'):>14s}"
        print(row)
    print("  (" + "; ".join(f"{SHORT[k]} = {k}" for k in modes) + ")")
    for m in models_:
        for md in modes:
            if "error" in results[m][md]:
                print(f"  note: {m}/{md}: {results[m][md]['error']}")

    extras = {}
    if not a.no_extras and "ortmod" in modes:
        ov = spawn(["--overhead-child", "--threads", str(a.threads)], 600)
        extras["binding_overhead"] = ov
        if "error" in ov:
            print(f"\nbinding overhead: {ov['error']}")
        else:
            print(f"\nbinding overhead (Linear 8->8, batch 4, fwd+bwd): ortmod {ov['ortmod_fwd_bwd_us']:.1f} µs, "
                  f"eager {ov['eager_fwd_bwd_us']:.1f} µs; kernels ~{ov['kernel_us_estimate']:.0f} µs -> "
                  f"~{ov['overhead_us']:.0f} µs per step beyond kernels (goal < 30)")
    if not a.no_extras:
        gm = spawn(["--gemm-child", "--threads", str(a.threads)], 600)
        extras["gemm_roofline"] = gm
        if "error" in gm:
            print(f"GEMM roofline: {gm['error']}")
        else:
            print(f"\nGEMM roofline: the engine's MatMul (om_gemm on the pool, {gm['threads']} threads) against "
                  f"{gm['blas']}'s own threaded sgemm, kernels for {gm.get('blas_core')}: 2048^3 "
                  f"{gm.get('blas_peak_gflops', gm['peak_gflops']):.1f} GFLOP/s, the engine's "
                  f"{gm.get('engine_peak_gflops', float('nan')):.1f}; peak = the fastest rate measured, "
                  f"{gm['peak_gflops']:.1f}")
            if gm.get("blas_core", "").lower() in ("haswell", "zen") and "avx512f" in mach["isa"]:
                print("  note: this CPU has AVX-512 but OpenBLAS picked AVX2 kernels (OPENBLAS_CORETYPE); the "
                      "engine's float32 products run on its own AVX-512 kernel")
            for k, v in gm["shapes"].items():
                print(f"  {k:24s} {v['gflops']:7.1f} GFLOP/s  {100 * v['of_peak']:5.1f}% of peak")
            if gm.get("stream_gbs"):
                print(f"  memory bandwidth: {gm['stream_gbs']:.1f} GB/s (torch.add of 64M float32, {gm['threads']} "
                      "threads)")
            extras["roofline"] = roofline(results, models_, modes, gm["peak_gflops"], gm.get("stream_gbs"))

    extras["non_gemm"] = non_gemm_table(results, models_, modes, mach, extras.get("roofline", {}))

    os.makedirs(RESULTS, exist_ok=True)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    mach["load_avg_end"] = os.getloadavg()
    busy = max(mach["load_avg"][0], mach["load_avg_end"][0]) > 0.5 * (mach["online_cpus"] or 1)
    print(f"load average at the end: {mach['load_avg_end'][0]:.1f}" +
          (" — other work shared the CPUs during the run: compare ratios, not absolute times" if busy else ""))
    doc = {"machine": mach, "threads": a.threads, "steps": a.steps, "warmup": a.warmup,
           "command": " ".join([".venv/bin/python", "bench/bench_train.py"] + sys.argv[1:]),
           "results": results, "ratios": {m: {f"{mine}/{other}": ratio(m, other, mine) for mine, other in RATIOS}
                                          for m in models_}, **extras}
    for name in (f"train_{stamp}.json", "train_latest.json"):
        with open(os.path.join(RESULTS, name), "w") as f:
            json.dump(doc, f, indent=1)
    how = write_png(os.path.join(RESULTS, "train_latest.png"), results, models_, modes)
    print(f"\nwrote bench/results/train_{stamp}.json, train_latest.json, train_latest.png ({how})")


if __name__ == "__main__":
    main()
