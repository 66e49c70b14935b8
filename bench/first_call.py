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


class _ZooStep:
    """A zoo case's model called on its batch, returning its loss (ORTModule wraps the model)."""

    def __init__(self, model, batch, loss_of):
        self.model, self.batch, self.loss_of = model, batch, loss_of

    def train(self):
        return self


def child(model, path):
    sys.path[:0] = [ROOT, os.path.join(ROOT, "tests")]
    import torch
    from ortmod import DebugOptions, ORTModule

    def make():
        if model == "mlp":
            sys.path.insert(0, os.path.join(ROOT, "demo"))
            import train_mlp
            return train_mlp.Classifier(), (torch.randn(128, 2), torch.randint(0, 3, (128,))), {}
        if model == "cnn":
            import test_models_cnn as m
            return m.TinyResNet(), m.make_batches()[0], {}
        if model == "gpt2":
            import test_models_gpt2 as m
            return m.make_gpt2(0.1), (), m.make_batches()[0]
        if model == "bert":
            import test_models_bert as m
            return m.make_bert(0.1), (), m.make_batches()[0]
        import test_model_zoo as zoo        # a zoo case: its model, first batch and loss
        make_model, batches, loss_of = zoo.CASES[model.removeprefix("zoo:")]
        batch = batches()[0]
        return _ZooStep(make_model(), batch, loss_of), (), {}

    times, stages = [], None
    for _ in range(2):
        net, args, kwargs = make()
        if isinstance(net, _ZooStep):
            ort = ORTModule(net.model, DebugOptions(capture=path)).train()
            t = time.perf_counter()
            loss = net.loss_of(ort, net.batch)
        else:
            ort = ORTModule(net, DebugOptions(capture=path)).train()
            t = time.perf_counter()
            out = ort(*args, **kwargs)
            loss = out if isinstance(out, torch.Tensor) else out.loss
        loss.backward()
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
