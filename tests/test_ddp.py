"""DistributedDataParallel(ORTModule(model)): two processes on this machine (gloo, one thread
each), the same gradients as DDP over the eager model at every step, and the same weights after
five SGD steps (1e-6 of their size)."""
import copy
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

WORLD = 2
STEPS = 5


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(12, 16), nn.GELU(), nn.LayerNorm(16), nn.Linear(16, 3))

    def forward(self, x, y):
        return nn.functional.cross_entropy(self.net(x), y)


def _rel(a, b):
    """||a - b|| / ||b|| over lists of tensors."""
    num = sum(float((x.double() - y.double()).pow(2).sum()) for x, y in zip(a, b))
    den = sum(float(y.double().pow(2).sum()) for y in b)
    return (num / max(den, 1e-30)) ** 0.5


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, port, out_dir):
    import sys
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from ortmod import ORTModule
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        torch.manual_seed(0)                      # identical initial weights on both ranks
        base = Net()
        eager = DDP(copy.deepcopy(base))
        ort = DDP(ORTModule(copy.deepcopy(base)))
        opt_e = torch.optim.SGD(eager.parameters(), lr=0.1)
        opt_o = torch.optim.SGD(ort.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(100 + rank)   # each rank its own data
        result = {"grads_e": [], "grads_o": []}
        for _ in range(STEPS):
            x, y = torch.randn(8, 12, generator=g), torch.randint(0, 3, (8,), generator=g)
            for model, opt, key in ((eager, opt_e, "grads_e"), (ort, opt_o, "grads_o")):
                opt.zero_grad()
                model(x, y).backward()
                result[key].append([p.grad.clone() for p in model.parameters()])
                opt.step()
        result["params_e"] = [p.detach().clone() for p in eager.parameters()]
        result["params_0"] = [p.detach().clone() for p in base.parameters()]
        result["params_o"] = [p.detach().clone() for p in ort.parameters()]
        result["exports"] = ort.module._ortmod_export_count
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
        # both ranks done before either tears gloo down: a rank that destroys its group while
        # the other still talks to it aborts in gloo's threads ("terminate called without an
        # active exception", SIGABRT), about one run in eight on 2 cores
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo")
def test_ddp_over_ortmodule_matches_ddp_over_eager(tmp_path):
    mp.spawn(_worker, args=(_free_port(), str(tmp_path)), nprocs=WORLD, join=True)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]
    for r, res in enumerate(results):
        assert res["exports"] == 1
        for step in range(STEPS):
            for ge, go in zip(res["grads_e"][step], res["grads_o"][step]):
                torch.testing.assert_close(go, ge, rtol=1e-4, atol=1e-6)
        for pe, po in zip(res["params_e"], res["params_o"]):
            torch.testing.assert_close(po, pe, rtol=1e-4, atol=1e-5)
        err = _rel(res["params_o"], res["params_e"])
        assert err < 1e-6, err
        moved = _rel(res["params_e"], res["params_0"])      # far from the start: the test can tell
        assert moved > 1e-2, moved
    # DDP averaged the gradients: both ranks hold the same ones although their data differ
    for g0, g1 in zip(results[0]["grads_o"][0], results[1]["grads_o"][0]):
        torch.testing.assert_close(g0, g1, rtol=0, atol=0)
