"""Train a small MLP classifier on a synthetic spiral, eager PyTorch vs ORTModule.

Both runs start from the same initial weights and see the same batches, so their
losses should agree to float32 rounding. Prints a side-by-side loss table, steps/s
for each and the final accuracy. Needs no download.
"""
import argparse
import copy
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402
import torch.nn as nn  # noqa: E402

from ortmod import ORTModule  # noqa: E402


def spiral(n_per_class=400, classes=3, noise=0.2, seed=0):
    """The classic interleaved-spirals toy set: 2-D points, one arm per class."""
    g = torch.Generator().manual_seed(seed)
    xs, ys = [], []
    for c in range(classes):
        r = torch.linspace(0.0, 1.0, n_per_class)
        theta = torch.linspace(c * 4.0, (c + 1) * 4.0, n_per_class) + noise * torch.randn(n_per_class, generator=g)
        xs.append(torch.stack([r * torch.sin(theta), r * torch.cos(theta)], dim=1))
        ys.append(torch.full((n_per_class,), c, dtype=torch.int64))
    x, y = torch.cat(xs), torch.cat(ys)
    perm = torch.randperm(len(x), generator=g)
    return x[perm], y[perm]


class Classifier(nn.Module):
    def __init__(self, hidden=64, classes=3):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(2, hidden), nn.GELU(), nn.LayerNorm(hidden),
            nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, classes))
        self.loss = nn.CrossEntropyLoss()

    def forward(self, x, y):
        return self.loss(self.net(x), y)


def train(model, batches, lr):
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    # the first step includes ORTModule's export + compile; time the steady state separately
    start = steady = time.perf_counter()
    for i, (x, y) in enumerate(batches):
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        losses.append(loss.item())
        if i == 0:
            steady = time.perf_counter()
    end = time.perf_counter()
    return losses, (len(batches) - 1) / (end - steady), end - start


def accuracy(model, x, y):
    """Accuracy of the eager model."""
    model.eval()
    with torch.no_grad():
        logits = model.net(x)
    model.train()
    return (logits.argmax(dim=1) == y).float().mean().item()


def ort_accuracy(model, x, y):
    """Accuracy with the forward run on the engine (eval graph, no autograd)."""
    probe = ORTModule(model._original_module.net)
    probe.eval()
    logits = probe(x)
    return (logits.argmax(dim=1) == y).float().mean().item()


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=1e-2)
    ap.add_argument("--every", type=int, default=20)
    ap.add_argument("--threads", type=int, default=0,
                    help="torch intra-op threads for the eager run (0: torch's default)")
    args = ap.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    x, y = spiral()
    g = torch.Generator().manual_seed(1)
    batches = []
    for _ in range(args.steps):
        idx = torch.randint(0, len(x), (args.batch,), generator=g)
        batches.append((x[idx], y[idx]))

    eager = Classifier()
    ort = ORTModule(copy.deepcopy(eager))

    eager_losses, eager_sps, eager_total = train(eager, batches, args.lr)
    ort_losses, ort_sps, ort_total = train(ort, batches, args.lr)

    print(f"spiral: {len(x)} points, 3 classes; MLP 2-64-64-3; AdamW lr {args.lr}; batch {args.batch}; "
          f"torch threads {torch.get_num_threads()}")
    print(f"{'step':>6} {'eager loss':>12} {'ortmod loss':>12} {'|diff|':>10}")
    for i in list(range(0, args.steps, args.every)) + [args.steps - 1]:
        d = abs(eager_losses[i] - ort_losses[i])
        print(f"{i:>6} {eager_losses[i]:>12.6f} {ort_losses[i]:>12.6f} {d:>10.2e}")
    max_diff = max(abs(a - b) for a, b in zip(eager_losses, ort_losses))
    print(f"max |loss diff| over {args.steps} steps: {max_diff:.2e}")
    print()
    print(f"{'':>8} {'steps/s':>10} {'total s':>9} {'accuracy':>9}")
    print(f"{'eager':>8} {eager_sps:>10.1f} {eager_total:>9.2f} {accuracy(eager, x, y):>9.3f}")
    print(f"{'ortmod':>8} {ort_sps:>10.1f} {ort_total:>9.2f} {ort_accuracy(ort, x, y):>9.3f}")
    print(f"ortmod/eager steady-state speed: {ort_sps / eager_sps:.2f}x "
          f"(ortmod total includes export + compile: {ort._ortmod_export_count} export)")
    if not math.isfinite(max_diff) or max_diff > 1e-3:
        print("WARNING: ortmod and eager losses diverge", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
