"""DeepSpeed over ORTModule in two processes (gloo, the CPU accelerator, one thread each), ZeRO 1, 2
and 3: each rank its own data, so the optimizer states, gradient partitions and (ZeRO-3) parameter
partitions are really split between the ranks and their reduce-scatters and all-gathers carry
data; the weights after five SGD steps equal DeepSpeed over the eager model's to 1e-6 of their
size, and both ranks hold the same ones.

Run by ``make test-deepspeed`` (tests/test_deepspeed.py's one-process tests beside it).
"""
import os
import socket
import sys
import warnings

import pytest
import torch
import torch.multiprocessing as mp

import dsutil

deepspeed = dsutil.import_deepspeed()

WORLD = 2
STEPS = 5
STAGES = (1, 2, 3)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _train(stage, ort, rank):
    torch.manual_seed(0)                         # identical initial weights on both ranks
    model = dsutil.MLP()
    if ort:
        from ortmod import ORTModule
        model = ORTModule(model)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=dsutil.config(stage, "fp32"))
    losses = []
    for x, y in dsutil.batches(STEPS, seed=1000 + rank):      # each rank its own batches
        loss = ((engine(x) - y) ** 2).mean()
        losses.append(float(loss.detach()))
        engine.backward(loss)
        engine.step()
    out = {"losses": losses, "params": dsutil.full_params(deepspeed, engine)}
    if ort:
        module = engine.module
        out["exports"] = module._ortmod_export_count
        out["engine_only"] = module._ortmod_fallback is None and all(
            e.call.functions is None for e in module._ortmod_cache.values())
    return out


def _worker(rank, port, out_dir):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:0] = [root, os.path.join(root, "tests")]
    torch.set_num_threads(1)
    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "RANK": str(rank),
                       "WORLD_SIZE": str(WORLD), "LOCAL_RANK": str(rank)})
    ds = dsutil.import_deepspeed()
    warnings.filterwarnings("ignore", category=FutureWarning)        # torch.distributed deprecations
    ds.init_distributed(dist_backend="gloo")
    import torch.distributed as dist
    try:
        results = {}
        for stage in STAGES:
            results[stage] = {"eager": _train(stage, False, rank), "ort": _train(stage, True, rank)}
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        dist.barrier()     # both ranks done before either tears gloo down (see test_ddp.py)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("ds2")
    mp.spawn(_worker, args=(_free_port(), str(out)), nprocs=WORLD, join=True)
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]


@pytest.mark.parametrize("stage", STAGES)
def test_two_process_zero_over_ortmodule_matches_eager(results, stage):
    for rank, res in enumerate(results):
        eager, ort = res[stage]["eager"], res[stage]["ort"]
        assert ort["exports"] == 1 and ort["engine_only"]
        torch.testing.assert_close(torch.tensor(ort["losses"]), torch.tensor(eager["losses"]), rtol=1e-6, atol=0)
        err = dsutil.rel(ort["params"], eager["params"])
        assert err < 1e-6, (rank, err)
    # data parallel: the ranks saw different batches and hold the same weights
    for which in ("eager", "ort"):
        assert dsutil.rel(results[1][stage][which]["params"], results[0][stage][which]["params"]) == 0.0
    assert results[0][stage]["ort"]["losses"] != results[1][stage]["ort"]["losses"]
    # the weights moved far enough from the start for the comparison to tell
    torch.manual_seed(0)
    start = [p.detach().double() for p in dsutil.MLP().parameters()]
    assert dsutil.rel(results[0][stage]["eager"]["params"], start) > 1e-2
