"""Peak memory of one training step: eager PyTorch vs ortmod at recompute levels 0/1/2.

Each configuration runs in its own process. Large buffers are forced to mmap so that freed
memory leaves the resident set (MALLOC_MMAP_THRESHOLD_), the kernel's high-water mark is
reset after two warm-up steps (/proc/self/clear_refs), one more step runs, and the peak
resident memory of that step above the process's baseline (model, optimizer state and
everything loaded before the first step) is reported.

    .venv/bin/python bench/bench_memory.py [--model gpt|mlp] [--batch N]
"""
import argparse
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def rss_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field)


def child(config, model_name, batch):
    sys.path.insert(0, HERE)
    sys.path.insert(0, os.path.dirname(HERE))
    import ctypes

    import torch

    import models
    torch.manual_seed(0)
    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", "2")))
    if model_name == "gpt":
        model, data = models.GPT(), models.gpt_batch(batch=batch)
    else:
        model, data = models.MLP(), models.mlp_batch(batch=batch)
    if config != "eager":
        os.environ["ORTMODULE_MEMORY_OPT_LEVEL"] = config[-1]
        from ortmod import ORTModule
        # the capture paths' modules (torch.onnx; torch.export's torch._dynamo and the ONNX
        # translator with onnxscript) are loaded before the baseline, like torch itself: code
        # loaded once per process, not memory of a step; what an export leaves behind is counted
        import torch.onnx  # noqa: F401
        import torch.export._trace  # noqa: F401
        from torch.onnx._internal.exporter import _core  # noqa: F401
        import onnxscript.function_libs.torch_lib.ops  # noqa: F401
        model = ORTModule(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    libc = ctypes.CDLL("libc.so.6")

    def step():
        loss = model(*data)
        loss.backward()
        opt.step()
        opt.zero_grad()   # the default: set_to_none=True

    libc.malloc_trim(0)
    base = rss_kib("VmRSS")
    for _ in range(2):
        step()
    libc.malloc_trim(0)
    steady = rss_kib("VmRSS")
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")   # resets VmHWM to the current resident size
    step()
    peak = rss_kib("VmHWM")
    print(json.dumps({"config": config, "peak_above_baseline_mib": (peak - base) / 1024,
                      "held_between_steps_mib": (steady - base) / 1024}))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="gpt", choices=["gpt", "mlp"])
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--child", default=None)
    a = ap.parse_args()
    if a.child:
        return child(a.child, a.model, a.batch)
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    results, held = {}, {}
    for config in ("eager", "ortmod-level0", "ortmod-level1", "ortmod-level2"):
        out = subprocess.run([sys.executable, __file__, "--child", config, "--model", a.model, "--batch", str(a.batch)],
                             env=env, capture_output=True, text=True)
        if out.returncode != 0:
            print(f"{config}: failed\n{out.stderr[-2000:]}")
            continue
        r = json.loads(out.stdout.strip().splitlines()[-1])
        results[config] = r["peak_above_baseline_mib"]
        held[config] = r["held_between_steps_mib"]
    print(f"\npeak memory of a training step above the baseline ({a.model}, batch {a.batch})")
    print(f"{'config':<16}{'peak MiB':>10}{'vs eager':>10}{'held between steps':>20}")
    for k, v in results.items():
        ratio = v / results["eager"] if "eager" in results and results["eager"] else float("nan")
        print(f"{k:<16}{v:>10.1f}{ratio:>10.2f}{held[k]:>20.1f}")
    os.makedirs(os.path.join(HERE, "results"), exist_ok=True)
    with open(os.path.join(HERE, "results", f"memory_{a.model}.json"), "w") as f:
        json.dump({"model": a.model, "batch": a.batch, "peak_above_baseline_mib": results,
                   "held_between_steps_mib": held}, f, indent=1)


if __name__ == "__main__":
    main()
