"""First-call time (export + compile + first forward/backward) of the model zoo subset per capture path.

Each model runs in a fresh process (the first export in a process pays torch.export's and the
translator's one-time setup), then a second model instance in the same process shows the warm cost.

    python bench/first_call.py                    # both paths, the four benchmark models
    python bench/first_call.py --paths export --models mlp gpt2
    python bench/first_call.py --models zoo       # every case of tests/test_model_zoo.py too
    python bench/first_call.py --models zoo:llama zoo:whisper     # zoo cases by name
"""
import argparse
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODELS = ("mlp", "cnn", "gpt2", "bert")


def child(model, path):
    sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
    import torch
    from ortmod import DebugOptions, ORTModule

    def loss_of(out):
        return out if isinstance(out, torch.Tensor) else out.loss

    def make():
        """The model and its step: a function of the wrapped model that returns the loss."""
        if model == "mlp":
            sys.path.insert(0, os.path.join(ROOT, "demo"))
            import train_mlp
            batch = (torch.randn(128, 2), torch.randint(0, 3, (128,)))
            return train_mlp.Classifier(), lambda m: loss_of(m(*batch))
        if model == "cnn":
            import test_models_cnn as m
            batch = m.make_batches()[0]
            return m.TinyResNet(), lambda ort: loss_of(ort(*batch))
        if model in ("gpt2", "bert"):
            m = __import__(f"test_models_{model}")
            batch = m.make_batches()[0]
            return getattr(m, f"make_{model}")(0.1), lambda ort: loss_of(ort(**batch))
        import test_model_zoo as zoo        # a zoo case: its model, first batch and loss
        make_model, batches, zoo_loss = zoo.CASES[model.removeprefix("zoo:")]
        batch = batches()[0]
        return make_model(), lambda ort: zoo_loss(ort, batch)

    times, stages = [], None
    for _ in range(2):
        net, step = make()
        ort = ORTModule(net, DebugOptions(capture=path)).train()
        t = time.perf_counter()
        step(ort).backward()
        times.append(time.perf_counter() - t)
        if stages is None:      # the first call's: what the one-time setup adds shows there
            stages = next(iter(ort._ortmod_exports.values())).exported.timings
    print(json.dumps({"first": times[0], "warm": times[1], "stages": stages}))


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--paths", nargs="+", default=["torchscript", "export"])
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    a = ap.parse_args()
    if "zoo" in a.models:
        sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
        import test_model_zoo as zoo
        a.models = [m for m in a.models if m != "zoo"] + [f"zoo:{name}" for name in zoo.CASES]
    print(f"{'model':>22} {'path':>12} {'first call s':>13} {'warm s':>8}  export stages (first call)")
    for model in a.models:
        for path in a.paths:
            r = subprocess.run([sys.executable, __file__, "--child", model, path], capture_output=True, text=True)
            lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
            if r.returncode or not lines:
                print(f"{model:>22} {path:>12} failed: {r.stderr.strip().splitlines()[-1:]}")
                continue
            d = json.loads(lines[-1])
            stages = ", ".join(f"{k} {v:.2f}" for k, v in d["stages"].items())
            print(f"{model:>22} {path:>12} {d['first']:>13.2f} {d['warm']:>8.2f}  {stages}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2], sys.argv[3])
    else:
        main()
