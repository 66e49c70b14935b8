"""FP16_Optimizer's fused checks vs DeepSpeed's own, on a DeepSpeed ZeRO-1 optimizer holding the
gradients of a 124M-value model (GPT-2 small's parameter shapes), one process over gloo on the CPU.

What is timed is what DeepSpeedZeroOptimizer.step() calls before the update:
``has_overflow_partitioned_grads_serial()`` (the inf/NaN check; fp16, or bf16 with
``check_grad_overflow``) and ``get_grad_norm_direct(averaged_gradients, params_in_partition)``
(the L2 norm, every step), then ``unscale_and_clip_grads`` on the fp32 partition (clipping just
under the norm).
First DeepSpeed's own methods, then the same optimizer after ``FP16_Optimizer(optimizer)``.
Median of --repeat calls each. Prints a table and the ratios; nothing is asserted.

    .venv/bin/python bench/bench_deepspeed_check.py [--dtype bf16|fp16|fp32] [--repeat 7]
"""
import argparse
import contextlib
import os
import statistics
import sys
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

import dsutil  # noqa: E402


def gpt2_small_shapes():
    shapes = [(50257, 768), (1024, 768)]
    for _ in range(12):
        shapes += [(768,), (768,), (768, 2304), (2304,), (768, 768), (768,), (768,), (768,), (768, 3072), (3072,),
                   (3072, 768), (768,)]
    return shapes + [(768,), (768,)]


class Params(nn.Module):
    """GPT-2 small's parameter tensors; the loss touches each once (the gradients are what count)."""

    def __init__(self):
        super().__init__()
        self.ps = nn.ParameterList([nn.Parameter(torch.randn(s) * 0.02) for s in gpt2_small_shapes()])

    def forward(self, x):
        return sum((p.float() * x).square().sum() for p in self.ps)


def median_time(fn, repeat):
    fn()
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    deepspeed = dsutil.import_deepspeed()
    warnings.simplefilter("ignore")
    from ortmod.optim import FP16_Optimizer
    with dsutil.one_process_group(deepspeed), (dsutil.fp16_on_cpu() if args.dtype == "fp16"
                                               else contextlib.nullcontext()):
        torch.manual_seed(0)
        model = Params()
        n = sum(p.numel() for p in model.parameters())
        cfg = dsutil.config(1, args.dtype, clip=1.0, check_grad_overflow=True)
        engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=cfg)
        engine.backward(engine(torch.tensor(1.0)))
        grads = opt.averaged_gradients[0]
        params = opt.params_in_partition[0]
        flat = opt.single_partition_of_fp32_groups[0]
        flat.grad = torch.ones_like(flat)
        norm = opt.get_grad_norm_direct(grads, params)
        # clip to just under the norm: each unscale/clip call multiplies by 1/1.1 (a real pass on both
        # sides; a factor of exactly 1 the fused pass would skip), 8 calls shrink the values 2x
        opt.clip_grad = float(norm) / 1.1

        def measure():
            row = {}
            if args.dtype != "fp32":
                row["overflow check"] = median_time(opt.has_overflow_partitioned_grads_serial, args.repeat)
            row["grad norm"] = median_time(lambda: opt.get_grad_norm_direct(grads, params), args.repeat)
            row["unscale/clip"] = median_time(lambda: opt.unscale_and_clip_grads([flat.grad], norm), args.repeat)
            return row

        ds = measure()
        FP16_Optimizer(opt)
        fused = measure()
        counts = dict(opt._ortmod_fused_calls)
    print(f"DeepSpeed {deepspeed.__version__}, ZeRO-1, {args.dtype} gradients, {n / 1e6:.1f}M values, "
          f"{torch.get_num_threads()} threads; median of {args.repeat}")
    print("| step part | DeepSpeed | FP16_Optimizer (fused) | ratio |")
    print("|---|---|---|---|")
    for k in ds:
        print(f"| {k} | {ds[k] * 1e3:.1f} ms | {fused[k] * 1e3:.1f} ms | {ds[k] / fused[k]:.2f}x |")
    t_ds, t_f = sum(ds.values()), sum(fused.values())
    print(f"| total | {t_ds * 1e3:.1f} ms | {t_f * 1e3:.1f} ms | {t_ds / t_f:.2f}x |")
    print(f"fused calls counted: {counts}")


if __name__ == "__main__":
    main()
