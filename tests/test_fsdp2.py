"""FSDP2 (torch.distributed.fsdp.fully_shard) is refused by name in either order of wrapping,
never run on DTensor shards or with FSDP's hooks half applied. (Why, and the design that would
support it: docs/status.md, "FSDP2".) A world of one process over gloo: fully_shard needs a process
group, the refusal needs no collective."""
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import ortmod
from ortmod import ORTModule

fsdp = pytest.importorskip("torch.distributed.fsdp")
pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no gloo")


@pytest.fixture(scope="module")
def world_of_one():
    created = not dist.is_initialized()
    if created:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ["MASTER_PORT"] = str(port)
        dist.init_process_group("gloo", rank=0, world_size=1)
    yield
    if created:
        dist.destroy_process_group()


def _model():
    return nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 2))


def test_ortmodule_of_a_fully_sharded_model_is_refused(world_of_one):
    model = _model()
    fsdp.fully_shard(model[0])
    fsdp.fully_shard(model)
    wrapped = ORTModule(model)
    with pytest.raises(ortmod.UnsupportedModelError, match=r"FSDP2 \(torch.distributed.fsdp.fully_shard\) is not "
                                                           r"supported.*fully_shard was applied to"):
        wrapped(torch.randn(3, 4))
    assert wrapped._ortmod_export_count == 0


def test_fully_shard_of_an_ortmodule_is_refused(world_of_one):
    wrapped = ORTModule(_model())
    with pytest.raises(TypeError, match=r"FSDP2 .* is not supported.*fully_shard\(ORTModule\(model\)\)"):
        fsdp.fully_shard(wrapped)


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
