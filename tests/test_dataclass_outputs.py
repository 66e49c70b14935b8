"""Outputs that are dataclasses come back as the user's own class, holding the engine's tensors,
on both capture paths: ortmod flattens them itself (ortmod/capture/torchscript.py, expand_objects), so the
graph returns only tensors.

- a dataclass pytree does not know (frozen or not, with slots, nested in tuples and dicts, with
  None and int fields): its tensor fields are the engine's outputs, the rest kept as returned;
- a dataclass a library registered with pytree without key paths (diffusers' BaseOutput registers
  every output class, UNet2DOutput among them, with a flatten function only): torch.export and
  ortmod's own flattening used to fail on it ("Did not find a flatten_with_keys_fn").

Each is checked against eager: the fields, the gradients of a loss that reads every tensor field,
and the parameters after SGD steps (tests/modelparity.py, an fp64 eager run refereeing)."""
import copy
import dataclasses
import warnings
from collections import OrderedDict
from typing import Optional

import pytest
import torch
import torch.nn as nn
import torch.utils._pytree as torch_pytree

from ortmod import ORTModule
from modelparity import train_parity
from test_semantics import rel_close


@pytest.fixture(autouse=True, params=["torchscript", "export"])
def capture(request, ortmod_env):
    ortmod_env.setenv("ORTMOD_CAPTURE", request.param)
    return request.param


@dataclasses.dataclass
class Inner:
    sample: torch.Tensor
    extra: Optional[torch.Tensor] = None
    count: int = 0


@dataclasses.dataclass(frozen=True)
class Frozen:
    hidden: torch.Tensor
    inner: Inner
    note: str = "frozen"


@dataclasses.dataclass(slots=True, frozen=True)
class Slotted:
    logits: torch.Tensor
    mask: Optional[torch.Tensor]
    scale: float


class ReturnsDataclasses(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(5, 6)
        self.b = nn.Linear(6, 3)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        y = self.b(h)
        return (Frozen(h, Inner(y, None, 7)),
                {"slotted": Slotted(y.softmax(-1), None, 0.5), "plain": Inner(h.sum(0), y * 2)})


def _loss(out):
    frozen, d = out
    return (frozen.hidden.pow(2).mean() + frozen.inner.sample.sum() + d["slotted"].logits[:, 0].sum()
            + d["plain"].sample.pow(2).sum() + d["plain"].extra.mean())


def test_dataclass_outputs_are_the_users_class_with_gradients():
    torch.manual_seed(0)
    m = ReturnsDataclasses()
    o = ORTModule(copy.deepcopy(m))
    for n in (4, 4, 7):
        x = torch.randn(n, 5)
        xe, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
        ye, yo = m(xe), o(xo)
        fo, do = yo
        assert type(fo) is Frozen and type(fo.inner) is Inner and type(do["slotted"]) is Slotted
        assert type(do["plain"]) is Inner
        assert (fo.note, fo.inner.count, fo.inner.extra) == ("frozen", 7, None)
        assert (do["slotted"].mask, do["slotted"].scale, do["plain"].count) == (None, 0.5, 0)
        with pytest.raises(dataclasses.FrozenInstanceError):
            fo.note = "changed"                     # still the frozen class the module returns
        fe, de = ye
        for what, got, want in [("hidden", fo.hidden, fe.hidden), ("inner.sample", fo.inner.sample, fe.inner.sample),
                                ("slotted.logits", do["slotted"].logits, de["slotted"].logits),
                                ("plain.sample", do["plain"].sample, de["plain"].sample),
                                ("plain.extra", do["plain"].extra, de["plain"].extra)]:
            assert got.grad_fn is not None, what    # the engine's outputs, on the autograd graph
            rel_close(what, got, want)
        assert o(x)[0] is not fo                     # a new object per call
        _loss(ye).backward()
        _loss(yo).backward()
        rel_close("input grad", xo.grad, xe.grad)
        for (name, pe), po in zip(m.named_parameters(), o.parameters()):
            rel_close(f"grad of {name}", po.grad, pe.grad)
        m.zero_grad()
        o.zero_grad()


def test_dataclass_outputs_train_with_sgd_parity():
    batches = [(torch.randn(6, 5),), (torch.randn(6, 5),)]
    train_parity(ReturnsDataclasses, batches, lambda model, b: _loss(model(*b)), steps=5)


# diffusers' BaseOutput, as its outputs.py writes it: an OrderedDict dataclass base whose
# subclasses register themselves with pytree, with no flatten_with_keys_fn


class LibraryOutput(OrderedDict):
    def __init_subclass__(cls):
        torch_pytree.register_pytree_node(
            cls, torch_pytree._dict_flatten,
            lambda values, context: cls(**torch_pytree._dict_unflatten(values, context)),
            serialized_type_name=f"{cls.__module__}.{cls.__name__}")

    def __post_init__(self):
        for field in dataclasses.fields(self):
            v = getattr(self, field.name)
            if v is not None:
                self[field.name] = v

    def __getitem__(self, k):
        if isinstance(k, str):
            return dict(self.items())[k]
        return tuple(self[k] for k in self.keys())[k]

    def __setattr__(self, name, value):
        if name in self.keys() and value is not None:
            super().__setitem__(name, value)
        super().__setattr__(name, value)

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        super().__setattr__(key, value)


@dataclasses.dataclass
class UNetLikeOutput(LibraryOutput):
    sample: torch.Tensor = None
    skip: Optional[torch.Tensor] = None


class ReturnsLibraryOutput(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(2, 3, 3, padding=1)

    def forward(self, x, return_skip=False):
        h = self.conv(x)
        return UNetLikeOutput(sample=torch.sigmoid(h), skip=h.mean((2, 3)) if return_skip else None)


@pytest.mark.parametrize("return_skip", [False, True])
def test_output_registered_without_key_paths(return_skip):
    """A registered node without key paths is rebuilt by its own unflatten: the user's class,
    whose items are the non-None fields, as eager's."""
    def loss_of(model, b):
        out = model(b[0], return_skip=return_skip)
        assert type(out) is UNetLikeOutput and list(out.keys()) == (["sample", "skip"] if return_skip else ["sample"])
        return out.sample.pow(2).mean() + (out[1].sum() if return_skip else 0)
    batches = [(torch.randn(2, 2, 5, 5),), (torch.randn(2, 2, 5, 5),)]
    eager, ort, _ = train_parity(ReturnsLibraryOutput, batches, loss_of, steps=4)
    x = torch.randn(2, 2, 5, 5)
    ye, yo = eager(x, return_skip=return_skip), ort(x, return_skip=return_skip)
    rel_close("sample", yo.sample, ye.sample)
    rel_close("sample item", yo["sample"], ye["sample"])
    assert (yo.skip is None) == (not return_skip)


def test_output_registered_without_key_paths_on_auto_is_exported(ortmod_env):
    """capture="auto" captures it with torch.export, its first choice (no fallback needed)."""
    ortmod_env.setenv("ORTMOD_CAPTURE", "auto")
    o = ORTModule(ReturnsLibraryOutput())
    y = o(torch.randn(1, 2, 4, 4))
    assert type(y) is UNetLikeOutput
    assert {r.exported.capture for r in o._ortmod_exports.values()} == {"export"}


@dataclasses.dataclass
class Sized:
    out: torch.Tensor
    rows: int


class ReturnsSized(nn.Module):
    def __init__(self):
        super().__init__()
        self.l = nn.Linear(3, 3)

    def forward(self, x):
        return Sized(self.l(x), x.shape[0])


def test_number_field_from_a_size_is_eagers_number():
    """A field computed from a size is eager's int for each size, never the traced one's."""
    m = ReturnsSized()
    o = ORTModule(copy.deepcopy(m))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")       # a size that changes a guarded number says so
        for n in (2, 2, 5):
            x = torch.randn(n, 3)
            ye, yo = m(x), o(x)
            assert type(yo.rows) is int and yo.rows == ye.rows == n
            rel_close("out", yo.out, ye.out)
