"""FSDP2 (torch.distributed.fsdp.fully_shard) under ORTModule: ORTModule(fully_shard(model)), each
block and the model sharded, trains in two processes (gloo, one thread each, each rank its own
data) as FSDP2 over the eager model does: the DTensor shards' gradients at every step and the
weights after five steps (1e-6 of their size) equal; with SGD, AdamW, a parameter dim that does
not divide by the world (uneven shards), gradient accumulation without sync, and two forwards
before their backwards. The reverse order, fully_shard(ORTModule(model)), and what ortmod does
not support (mixed precision, CPU offload, DTensor parameters fully_shard did not make) are
refused by name. (Design: ortmod/_fsdp2.py; docs/integrations.md, "ORTModule over FSDP2".)"""
import copy
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn

import ortmod
from ortmod import ORTModule

fsdp = pytest.importorskip("torch.distributed.fsdp")
pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo")

WORLD = 2
STEPS = 5


class Block(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.fc = nn.Linear(width, width)
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        return self.norm(x + nn.functional.gelu(self.fc(x)))


class Net(nn.Module):
    """width 15: with uneven=True every block's weight, bias and norm have a dim of 15, which
    FSDP2 splits 8 + 7 over two ranks (the second shard padded in its all-gather)."""

    def __init__(self, width=16):
        super().__init__()
        self.inp = nn.Linear(12, width)
        self.blocks = nn.ModuleList([Block(width), Block(width)])
        self.out = nn.Linear(width, 3)

    def forward(self, x, y):
        h = self.inp(x)
        for block in self.blocks:
            h = block(h)
        return nn.functional.cross_entropy(self.out(h), y)


def _sharded(model, **kwargs):
    for block in model.blocks:
        fsdp.fully_shard(block, **kwargs)
    fsdp.fully_shard(model, **kwargs)
    return model


def _rel(a, b):
    """||a - b|| / ||b|| over lists of tensors."""
    num = sum(float((x.double() - y.double()).pow(2).sum()) for x, y in zip(a, b))
    den = sum(float(y.double().pow(2).sum()) for y in b)
    return (num / max(den, 1e-30)) ** 0.5


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# -- two processes -------------------------------------------------------------------------------
CASES = {            # name: (width, optimizer, how each step runs)
    "sgd": (16, "sgd", "plain"),
    "adamw": (16, "adamw", "plain"),
    "uneven": (15, "sgd", "plain"),
    "accumulate": (16, "sgd", "no_sync"),          # two micro-batches, the first without gradient sync
    "two_forwards": (16, "sgd", "two_forwards"),   # f1, f2, backward 1, backward 2
}


def _step(call, root, how, batches):
    """One optimizer step's forwards and backwards; call: the model to call (the ORTModule or
    the eager FSDP model), root: its FSDP root (gradient sync is switched there)."""
    (x1, y1), (x2, y2) = batches
    if how == "plain":
        call(x1, y1).backward()
    elif how == "no_sync":        # gradient accumulation: the first backward keeps its gradient unsharded
        root.set_requires_gradient_sync(False)
        call(x1, y1).backward()
        root.set_requires_gradient_sync(True)
        call(x2, y2).backward()   # reduce-scatters both micro-batches' gradients
    else:
        l1, l2 = call(x1, y1), call(x2, y2)
        l1.backward()
        l2.backward()


def _run_case(name, rank):
    from torch.distributed.tensor import DTensor
    width, opt_name, how = CASES[name]
    torch.manual_seed(0)                      # identical initial weights on both ranks
    base = Net(width)
    eager = _sharded(copy.deepcopy(base))
    inner = _sharded(copy.deepcopy(base))
    ort = ORTModule(inner)
    make = (lambda p: torch.optim.SGD(p, lr=0.1)) if opt_name == "sgd" else \
        (lambda p: torch.optim.AdamW(p, lr=1e-2, weight_decay=0.1))
    opts = {"e": make(eager.parameters()), "o": make(ort.parameters())}
    g = torch.Generator().manual_seed(100 + rank)   # each rank its own data
    out = {"grads_e": [], "grads_o": [], "eval": []}
    for _ in range(STEPS):
        batches = [(torch.randn(8, 12, generator=g), torch.randint(0, 3, (8,), generator=g)) for _ in range(2)]
        for key, call, root in (("e", eager, eager), ("o", ort, inner)):
            opts[key].zero_grad()
            _step(call, root, how, batches)
            grads = [p.grad for p in root.parameters()]
            assert all(isinstance(gr, DTensor) for gr in grads), [type(gr) for gr in grads]
            out["grads_" + key].append([gr.to_local().clone() for gr in grads])
            opts[key].step()
        with torch.no_grad():                   # an inference forward between steps
            out["eval"].append((float(eager(*batches[0])), float(ort(*batches[0]))))
    eager.reshard()             # FSDP's root keeps its parameters unsharded after a forward (ortmod does not)
    out["params_0"] = [p.detach().clone() for p in base.parameters()]
    out["params_e"] = [p.full_tensor().detach() for p in eager.parameters()]
    out["params_o"] = [p.full_tensor().detach() for p in ort.parameters()]
    out["exports"] = ort._ortmod_export_count
    out["engine_only"] = ort._ortmod_fallback is None
    out["sharded"] = [type(p).__name__ for p in inner.parameters()]
    return out


def _worker(rank, port, out_dir):
    import sys
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    try:
        results = {name: _run_case(name, rank) for name in CASES}
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))
        # both ranks done before either tears gloo down (tests/test_ddp.py: gloo aborts otherwise)
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp2")
    mp.spawn(_worker, args=(_free_port(), str(out)), nprocs=WORLD, join=True)
    return [torch.load(out / f"rank{r}.pt") for r in range(WORLD)]


@pytest.mark.parametrize("case", list(CASES))
def test_ortmodule_of_fully_shard_matches_fsdp2_over_eager(two_ranks, case):
    for rank, results in enumerate(two_ranks):
        res = results[case]
        assert res["exports"] == 2 and res["engine_only"]       # training and no_grad: one export each
        assert set(res["sharded"]) == {"DTensor"}          # resharded after every backward
        for step in range(STEPS):
            for ge, go in zip(res["grads_e"][step], res["grads_o"][step]):
                assert ge.shape == go.shape                 # this rank's shard of the gradient
                torch.testing.assert_close(go, ge, rtol=1e-4, atol=1e-6)
            e, o = res["eval"][step]
            assert abs(e - o) <= 1e-5 * abs(e), (e, o)
        err = _rel(res["params_o"], res["params_e"])
        assert err < 1e-6, (rank, err)
        moved = _rel(res["params_e"], res["params_0"])      # far from the start: the test can tell
        assert moved > 1e-2, moved
    # the reduce-scatter averaged the ranks' gradients: both hold the same full weights
    for p0, p1 in zip(two_ranks[0][case]["params_o"], two_ranks[1][case]["params_o"]):
        torch.testing.assert_close(p0, p1, rtol=0, atol=0)
    if case == "uneven":       # the shards really are uneven: rank 0 holds 8 rows of 15, rank 1 7
        rows = [two_ranks[r][case]["grads_o"][0][2].shape[0] for r in range(WORLD)]
        assert rows == [8, 7], rows


# -- one process: what is refused -----------------------------------------------------------------
@pytest.fixture(scope="module")
def world_of_one():
    created = not dist.is_initialized()
    if created:
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(_free_port())
        dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    if created:
        dist.destroy_process_group()


def _small():
    return nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))


def test_fully_shard_of_an_ortmodule_is_refused(world_of_one):
    wrapped = ORTModule(_small())
    with pytest.raises(TypeError, match=r"fully_shard\(ORTModule\(model\)\) is not supported.*"
                                        r"ORTModule\(fully_shard\(model\)\)"):
        fsdp.fully_shard(wrapped)


@pytest.mark.parametrize("policy, what", [
    ({"mp_policy": fsdp.MixedPrecisionPolicy(param_dtype=torch.bfloat16)}, "mixed precision policy"),
    ({"mp_policy": fsdp.MixedPrecisionPolicy(reduce_dtype=torch.float64)}, "mixed precision policy"),
    ({"offload_policy": fsdp.CPUOffloadPolicy(pin_memory=False)}, "CPU offload"),
])
def test_what_ortmod_does_not_support_is_refused_by_name(world_of_one, policy, what):
    model = _small()
    fsdp.fully_shard(model[0], **policy)
    fsdp.fully_shard(model, **policy)
    wrapped = ORTModule(model)
    with pytest.raises(ortmod.UnsupportedModelError, match=rf"FSDP2 .*under ORTModule: a? ?{what}"):
        wrapped(torch.randn(3, 4))
    assert wrapped._ortmod_export_count == 0


def test_several_modules_as_one_group_and_hsdp_are_refused_by_name(world_of_one):
    from torch.distributed.device_mesh import init_device_mesh
    model = _small()
    fsdp.fully_shard([model[0], model[2]])
    fsdp.fully_shard(model)
    with pytest.raises(ortmod.UnsupportedModelError, match=r"several modules sharded as one group"):
        ORTModule(model)(torch.randn(3, 4))
    model = _small()
    fsdp.fully_shard(model, mesh=init_device_mesh("cpu", (1, 1), mesh_dim_names=("replicate", "shard")))
    with pytest.raises(ortmod.UnsupportedModelError, match=r"HSDP \(a 2-d device mesh"):
        ORTModule(model)(torch.randn(3, 4))


def test_dtensor_parameters_without_fully_shard_are_refused(world_of_one):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor
    mesh = init_device_mesh("cpu", (1,))
    model = nn.Linear(4, 2)
    model.weight = nn.Parameter(distribute_tensor(model.weight.detach(), mesh, [Replicate()]))
    with pytest.raises(ortmod.UnsupportedModelError, match="DTensor parameters that fully_shard did not make"):
        ORTModule(model)(torch.randn(3, 4))


def test_state_dict_between_forward_and_backward(world_of_one):
    """state_dict() reshards (FSDP's pre-hook), freeing the unsharded storage in place: the
    engine's stash reads its own copy in backward, and the gradients are eager FSDP2's."""
    torch.manual_seed(0)
    base = _small()
    models = []
    for _ in range(2):
        model = copy.deepcopy(base)
        fsdp.fully_shard(model[0])
        fsdp.fully_shard(model)
        models.append(model)
    eager, inner = models
    ort = ORTModule(inner)
    x = torch.randn(3, 4)
    for call, model in ((eager, eager), (ort, inner)):
        loss = call(x).pow(2).sum()
        model.state_dict()
        loss.backward()
    for pe, po in zip(eager.parameters(), inner.parameters()):
        assert type(po).__name__ == "DTensor" and po.grad is not None
        torch.testing.assert_close(po.grad.to_local(), pe.grad.to_local(), rtol=1e-5, atol=1e-7)


def test_a_class_swap_from_the_wrapped_class_is_refused_by_name():
    """A library that swaps a module's class for a subclass of module.__class__ (FSDP2, above)
    reads the model's class from an ORTModule: such a swap is refused by name; a subclass of
    ORTModule is taken."""
    wrapped = ORTModule(nn.Linear(3, 3))
    with pytest.raises(TypeError, match="cannot become PatchedLinear"):
        wrapped.__class__ = type("PatchedLinear", (nn.Linear,), {})
    assert type(wrapped) is ORTModule
    mine = type("MyORTModule", (ORTModule,), {})
    wrapped.__class__ = mine
    assert type(wrapped) is mine and isinstance(wrapped, nn.Linear)
    x = torch.randn(2, 3)
    torch.testing.assert_close(wrapped(x), wrapped.module(x), rtol=1e-6, atol=1e-6)
