"""The ResNet benchmark's convolutions and pooling, one op at a time, on the engine and in torch.

    .venv/bin/python bench/conv_ops.py [--reps 7] [--threads 2] [--only stem,b1c1,...] [--no-torch]

Each of bench/models.py ResNet's Conv nodes (batch 64, width 32, 3x32x32 images) and its MaxPool
runs as a one-node model: forward and backward (ConvGradX, ConvGradW; MaxPoolGrad) with the
engine's profiler on. Printed per op: the median kernel time over --reps runs, its GFLOP/s, and
torch's eager time for the same op at the same thread count (oneDNN or its own kernels: what
torch.compile calls for a convolution on the CPU). Medians, because the machine is shared."""
import argparse
import json
import os
import statistics
import sys
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
sys.path.insert(0, os.path.dirname(HERE))

from oputil import make_model  # noqa: E402
from ortmod import _C  # noqa: E402

B = 64
# name: (Cin, H, Cout, kernel, stride, pad, want dX)
CONVS = {
    "stem": (3, 32, 32, 3, 1, 1, False),
    "b1c1": (32, 16, 32, 3, 1, 1, True),     # b1c2 is the same shape
    "b2c1": (32, 16, 64, 3, 2, 1, True),
    "b2c2": (64, 8, 64, 3, 1, 1, True),
    "b2sk": (32, 16, 64, 1, 2, 0, True),
    "b3c1": (64, 8, 128, 3, 2, 1, True),
    "b3c2": (128, 4, 128, 3, 1, 1, True),
    "b3sk": (64, 8, 128, 1, 2, 0, True),
}
COUNT = {"b1c1": 2}   # how many times a shape occurs in the model


def engine_times(model, feeds, grad, reps):
    """Median ms per op name over reps forward+backward runs."""
    eng = _C.Engine(model, grad)
    feeds = [np.require(f, requirements="C") for f in feeds]
    caps, stash = eng.forward(feeds, True)
    out = np.from_dlpack(_Cap(caps[0]))
    dy = [np.random.default_rng(0).standard_normal(out.shape).astype(np.float32)]
    eng.backward(stash, dy)
    eng.set_profiling(True)
    per = {}
    for _ in range(reps):
        before = {o["op"]: o["ms"] for o in json.loads(eng.report())["profile"]["ops"]} \
            if json.loads(eng.report()).get("profile") else {}
        caps, stash = eng.forward(feeds, True)
        eng.backward(stash, dy)
        for o in json.loads(eng.report())["profile"]["ops"]:
            per.setdefault(o["op"], []).append(o["ms"] - before.get(o["op"], 0.0))
    return {k: statistics.median(v) for k, v in per.items()}


class _Cap:
    def __init__(self, cap):
        self.cap = cap

    def __dlpack__(self, **kwargs):
        return self.cap

    def __dlpack_device__(self):
        return (1, 0)


def torch_times(fn, reps):
    fn()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(ts)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default="")
    ap.add_argument("--no-torch", action="store_true")
    a = ap.parse_args()
    _C.set_num_threads(a.threads)
    if not a.no_torch:
        import torch
        import torch.nn.functional as F
        torch.set_num_threads(a.threads)
    rng = np.random.default_rng(0)
    only = set(a.only.split(",")) if a.only else None
    total = {"eng": 0.0, "torch": 0.0}
    print(f"{'op':<18} {'engine ms':>9} {'GFLOP/s':>8} {'torch ms':>9}")
    for name, (cin, h, cout, k, s, p, want_dx) in CONVS.items():
        if only and name not in only:
            continue
        x = rng.standard_normal((B, cin, h, h)).astype(np.float32)
        w = (rng.standard_normal((cout, cin, k, k)) * 0.1).astype(np.float32)
        attrs = {"kernel_shape": [k, k], "strides": [s, s], "pads": [p] * 4}
        model = make_model("Conv", {"X": x, "W": w}, attrs)
        t = engine_times(model, [x, w], [want_dx, True], a.reps)
        oh = (h + 2 * p - k) // s + 1
        flops = 2 * B * cout * oh * oh * cin * k * k
        tt = {}
        if not a.no_torch:
            xt, wt = torch.from_numpy(x), torch.from_numpy(w)
            yt = F.conv2d(xt, wt, stride=s, padding=p)
            gy = torch.randn_like(yt)
            tt["Conv"] = torch_times(lambda: F.conv2d(xt, wt, stride=s, padding=p), a.reps)
            bw = torch.ops.aten.convolution_backward
            tt["ConvGradX"] = torch_times(lambda: bw(gy, xt, wt, None, [s, s], [p, p], [1, 1], False, [0, 0], 1,
                                                     [True, False, False]), a.reps) if want_dx else None
            tt["ConvGradW"] = torch_times(lambda: bw(gy, xt, wt, None, [s, s], [p, p], [1, 1], False, [0, 0], 1,
                                                     [False, True, False]), a.reps)
        mult = COUNT.get(name, 1)
        for op in ("Conv", "ConvGradX", "ConvGradW"):
            if op not in t:
                continue
            ms = t[op]
            tm = tt.get(op)
            total["eng"] += ms * mult
            total["torch"] += (tm or 0) * mult
            print(f"{name + ' ' + op:<18} {ms:>9.2f} {flops / ms / 1e6:>8.1f} "
                  f"{'' if tm is None else f'{tm:9.2f}'}")
    if not only or "pool" in only:
        x = rng.standard_normal((B, 32, 32, 32)).astype(np.float32)
        model = make_model("MaxPool", {"X": x}, {"kernel_shape": [2, 2], "strides": [2, 2]})
        t = engine_times(model, [x], [True], a.reps)
        tt = {}
        if not a.no_torch:
            xt = torch.from_numpy(x).requires_grad_()
            tt["MaxPool"] = torch_times(lambda: F.max_pool2d_with_indices(xt.detach(), 2, 2), a.reps)
            yt, it = F.max_pool2d_with_indices(xt.detach(), 2, 2)
            gy = torch.randn_like(yt)
            tt["MaxPoolGrad"] = torch_times(
                lambda: torch.ops.aten.max_pool2d_with_indices_backward(gy, xt.detach(), [2, 2], [2, 2], [0, 0],
                                                                        [1, 1], False, it), a.reps)
        for op in ("MaxPool", "MaxPoolGrad"):
            ms = t.get(op, float("nan"))
            total["eng"] += ms
            total["torch"] += tt.get(op) or 0
            tm = tt.get(op)
            print(f"{'pool ' + op:<18} {ms:>9.2f} {'':>8} {'' if tm is None else f'{tm:9.2f}'}")
    print(f"{'total (x model)':<18} {total['eng']:>9.2f} {'':>8} {total['torch']:>9.2f}")


if __name__ == "__main__":
    main()
