"""float32 GEMM rates at the benchmark models' shapes: the engine's MatMul (om_gemm: its AVX-512
kernel, ops/gemm_f32.c, where the CPU has AVX-512 and OpenBLAS a narrower kernel; else BLAS),
OpenBLAS as this environment loads it (a machine
may pin its kernel with OPENBLAS_CORETYPE), OpenBLAS with its own choice of kernel (a child
process without OPENBLAS_CORETYPE and OPENBLAS_L2_SIZE), and torch.mm (eager's BLAS).

    .venv/bin/python bench/gemm_kernels.py [--threads 1]
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

# (M, N, K), row-major operands: forward, dX and dW products of the models; conv: im2col products of the CNN
SHAPES = {
    "gpt2 qkv": (1024, 768, 256), "gpt2 qkv dX": (1024, 256, 768), "gpt2 qkv dW": (256, 768, 1024),
    "gpt2 head": (1024, 4096, 256), "mlp": (256, 1024, 1024), "mlp dW": (1024, 1024, 256),
    "conv 3x3 64ch": (64, 4096, 576), "conv dcol": (576, 4096, 64), "conv dW": (64, 576, 4096),
}


def best_rate(fn, flop):
    fn()
    reps = max(3, int(1e9 / flop))
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        best = min(best, (time.perf_counter() - t0) / reps)
    return flop / best / 1e9


def openblas_rates(threads):
    import numpy as np
    import ortmod._C  # noqa: F401  (loads the OpenBLAS the engine links)
    lib = ctypes.CDLL("libopenblas.so.0")
    lib.openblas_set_num_threads(threads)
    lib.openblas_get_corename.restype = ctypes.c_char_p
    fp = ctypes.POINTER(ctypes.c_float)
    sg = lib.cblas_sgemm
    sg.argtypes = [ctypes.c_int] * 6 + [ctypes.c_float, fp, ctypes.c_int, fp, ctypes.c_int, ctypes.c_float, fp,
                                        ctypes.c_int]
    out = {"core": lib.openblas_get_corename().decode()}
    for name, (M, N, K) in SHAPES.items():
        a, b, c = (np.random.rand(M, K).astype(np.float32), np.random.rand(K, N).astype(np.float32),
                   np.zeros((M, N), np.float32))
        args = (101, 111, 111, M, N, K, 1.0, a.ctypes.data_as(fp), K, b.ctypes.data_as(fp), N, 0.0,
                c.ctypes.data_as(fp), N)
        out[name] = best_rate(lambda: sg(*args), 2.0 * M * N * K)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--openblas-child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.openblas_child:
        print(json.dumps(openblas_rates(a.threads)))
        return
    import torch
    from bench_train import engine_matmul_gflops
    torch.set_num_threads(a.threads)
    engine = engine_matmul_gflops(a.threads)

    def child(env):
        p = subprocess.run([sys.executable, __file__, "--openblas-child", "--threads", str(a.threads)],
                           capture_output=True, text=True, env=env)
        return json.loads(p.stdout.strip().splitlines()[-1])
    pinned = child(dict(os.environ))
    free = child({k: v for k, v in os.environ.items() if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")})
    print(f"{a.threads} thread(s); GFLOP/s. OpenBLAS as loaded here: {pinned['core']} kernels "
          f"(OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')}); its own choice: {free['core']}")
    print(f"{'shape':16} {'M x N x K':>18} {'engine':>8} {'OpenBLAS':>9} {'OB own':>8} {'torch.mm':>9}")
    for name, (M, N, K) in SHAPES.items():
        x, y = torch.rand(M, K), torch.rand(K, N)
        tm = best_rate(lambda: torch.mm(x, y), 2.0 * M * N * K)
        print(f"{name:16} {f'{M}x{N}x{K}':>18} {engine(M, N, K):8.1f} {pinned[name]:9.1f} {free[name]:8.1f} {tm:9.1f}")


if __name__ == "__main__":
    main()
