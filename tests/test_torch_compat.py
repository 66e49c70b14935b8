"""The torch-internals boundary (ortmod/capture/compat.py) and what it says about the running torch.

Nothing in ortmod/ but compat.py imports or reads a private torch name (torch._C, torch._dynamo,
torch.onnx._internal, torch.utils._pytree, torch._subclasses, ...): the walk below fails on any
such import, on any attribute with a leading underscore reached from a name bound to a torch
module, and on getattr of one by string. compat's own facts (the Function.apply binding, the clamp
gradient at a bound) are held against eager on whichever release runs the suite (make
test-compat runs this file on every release of the matrix).
"""
import copy
import ast
import pathlib

import pytest
import torch

import ortmod
from ortmod.capture import compat

ROOT = pathlib.Path(__file__).resolve().parents[1] / "ortmod"
BOUNDARY = ROOT / "capture" / "compat.py"


def _private(part):
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _torch_module(name):
    return name == "torch" or name.startswith("torch.")


def private_torch_uses(source, filename="<src>"):
    """(line, what) for each private torch name ``source`` imports or reads."""
    tree = ast.parse(source, filename)
    torch_names = set()     # local names bound to torch or to something imported from it
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if _torch_module(a.name):
                    if any(_private(p) for p in a.name.split(".")):
                        found.append((node.lineno, f"import {a.name}"))
                    torch_names.add(a.asname or a.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and _torch_module(node.module):
            for a in node.names:
                if any(_private(p) for p in node.module.split(".")) or _private(a.name):
                    found.append((node.lineno, f"from {node.module} import {a.name}"))
                torch_names.add(a.asname or a.name)
    inner = {id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and id(node) not in inner:
            chain, base = [], node
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            # torch.ops.<namespace>.<op>: operator names (aten's own _-prefixed ones among them),
            # the IR's vocabulary rather than torch's Python internals
            ops = chain[::-1][:1] == ["ops"] and base.id == "torch"
            if isinstance(base, ast.Name) and base.id in torch_names and not ops and any(map(_private, chain)):
                found.append((node.lineno, ".".join([base.id] + chain[::-1])))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in ("getattr", "setattr")
              and len(node.args) >= 2 and isinstance(node.args[0], (ast.Name, ast.Attribute))
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and _private(node.args[1].value)):
            base = node.args[0]
            while isinstance(base, ast.Attribute):
                base = base.value
            if isinstance(base, ast.Name) and base.id in torch_names:
                found.append((node.lineno, f"{node.func.id}(..., {node.args[1].value!r})"))
    return sorted(set(found))


def test_no_private_torch_name_outside_the_compat_boundary():
    offenders = []
    for path in sorted(ROOT.rglob("*.py")):
        if path == BOUNDARY:
            continue
        for line, what in private_torch_uses(path.read_text(), str(path)):
            offenders.append(f"{path.relative_to(ROOT.parent)}:{line}: {what}")
    assert not offenders, ("private torch names outside ortmod/capture/compat.py (reach them through "
                           "compat):\n" + "\n".join(offenders))


@pytest.mark.parametrize("source, expected", [
    ("import torch\nx = torch._C._from_dlpack", ["torch._C._from_dlpack"]),
    ("import torch.utils._pytree as pytree", ["import torch.utils._pytree"]),
    ("from torch.onnx._internal.exporter import _core", ["from torch.onnx._internal.exporter import _core"]),
    ("from torch.onnx import symbolic_helper as sh\nsh._maybe_get_const(1, 'i')", ["sh._maybe_get_const"]),
    ("from torch import _dynamo", ["from torch import _dynamo"]),
    ("import torch\ngetattr(torch.nn, '_hidden')", ["getattr(..., '_hidden')"]),
    ("import torch\nt = torch.randn(2)\nv = t._version", []),         # an object's attribute, not torch's name
    ("import torch\nop = torch.ops.aten._unsafe_view.default", []),    # an operator's name
    ("import torch\nd = torch.__file__\nx = torch.nn.functional.relu", []),
    ("from .capture import compat\nx = compat.symbolic_helper.maybe_get_const", []),
])
def test_the_walk_sees_each_kind_of_access(source, expected):
    assert [w for _, w in private_torch_uses(source)] == expected


def test_compat_imports_only_torch():
    # capture/__init__.py imports nothing; compat imports torch and the standard library
    init = ast.parse((ROOT / "capture" / "__init__.py").read_text())
    assert not [n for n in ast.walk(init) if isinstance(n, (ast.Import, ast.ImportFrom))]
    top = [n for n in ast.parse(BOUNDARY.read_text()).body if isinstance(n, (ast.Import, ast.ImportFrom))]
    mods = {a.name.split(".")[0] for n in top if isinstance(n, ast.Import) for a in n.names}
    mods |= {n.module.split(".")[0] for n in top if isinstance(n, ast.ImportFrom)}
    assert mods <= {"torch", "contextlib", "functools", "importlib"}, mods


def test_the_running_release_is_declared():
    assert compat.release_supported(), f"torch {compat.VERSION} is outside {compat.SUPPORTED}"
    assert compat.VERSION == torch.__version__.split("+")[0]


def test_the_declared_range_is_the_matrix():
    """pyproject.toml's torch range, compat.SUPPORTED and the Makefile's TORCH_RELEASES agree."""
    import re
    root = ROOT.parent
    declared = re.search(r'"torch>=(\d+)\.(\d+),<(\d+)\.(\d+)"', (root / "pyproject.toml").read_text()).groups()
    lo, hi = (int(declared[0]), int(declared[1])), (int(declared[2]), int(declared[3]) - 1)
    assert (lo, hi) == compat.SUPPORTED
    matrix = re.search(r"^TORCH_RELEASES := (.*)$", (root / "Makefile").read_text(), re.M).group(1).split()
    minors = sorted({tuple(int(p) for p in r.split(".")[:2]) for r in matrix})
    assert minors == [(2, m) for m in range(lo[1], hi[1] + 1)], matrix


def test_an_untested_release_is_refused_at_import(monkeypatch):
    monkeypatch.setattr(compat, "RELEASE", (2, 9, 1))
    monkeypatch.setattr(compat, "VERSION", "2.9.1")
    monkeypatch.delenv("ORTMOD_UNTESTED_TORCH", raising=False)
    ortmod.options.reload()
    with pytest.raises(ImportError, match=r"ortmod is tested with torch 2\.10 to 2\.14 .*not torch 2\.9\.1"):
        compat._refuse_untested_release()
    monkeypatch.setenv("ORTMOD_UNTESTED_TORCH", "1")
    ortmod.options.reload()
    try:
        compat._refuse_untested_release()
    finally:
        monkeypatch.delenv("ORTMOD_UNTESTED_TORCH")
        ortmod.options.reload()


def test_call_apply_runs_torch_own_apply_for_the_class():
    class Double(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, k=2.0):
            return x * k

        @staticmethod
        def backward(ctx, g):
            return g * 2.0, None

    x = torch.ones(3, requires_grad=True)
    y = compat.call_apply(compat.function_apply(), Double, x)
    y.sum().backward()
    assert y.tolist() == [2.0] * 3 and x.grad.tolist() == [2.0] * 3


def test_patched_function_apply_restores_torch_own():
    before = compat.function_apply()
    seen = []
    with compat.patched_function_apply(lambda cls, *a: seen.append(cls) or a[0]) as original:
        assert original is before
        torch.autograd.Function.apply(torch.ones(1))
    assert seen == [torch.autograd.Function] and compat.function_apply() is before


def test_a_missing_internal_is_named_with_the_release():
    ns = compat.Internals("test feature", "torch.no_such_module_for_ortmod")
    with pytest.raises(compat.TorchFeatureMissing, match=rf"torch {compat.VERSION} has no test feature"):
        ns.anything
    with pytest.raises(compat.TorchFeatureMissing, match="has no TorchScript exporter symbolic helper no_such_name"):
        compat.symbolic_helper.no_such_name


def _clamp_grads(fn, x):
    x = x.clone().requires_grad_()
    fn(x).sum().backward()
    return x.grad


@pytest.mark.parametrize("kind", ["number", "tensor"])
def test_clamp_semantics_is_eager_own(kind):
    """The mode compat reports reproduces eager's gradient on this release at bounds, ties, NaN
    and infinities, for clamp, clamp_min and clamp_max."""
    mode = compat.require_clamp_mode(kind)
    b = (lambda v: v) if kind == "number" else (lambda v: torch.tensor(v, dtype=torch.float64))
    x = torch.tensor([float("nan"), -3.0, -1.0, -0.25, 0.0, 0.5, 1.0, 3.0, float("inf")], dtype=torch.float64)
    for lo, hi, fn in [(-1.0, 1.0, lambda x: torch.clamp(x, b(-1.0), b(1.0))),
                       (0.5, 0.5, lambda x: torch.clamp(x, b(0.5), b(0.5))),
                       (-1.0, None, lambda x: torch.clamp_min(x, b(-1.0))),
                       (None, 1.0, lambda x: torch.clamp_max(x, b(1.0))),
                       (0.0, None, lambda x: torch.clamp(x, min=b(0.0)))]:
        want = []
        for v in x.tolist():
            if v != v:
                want.append(1.0 if mode == compat.CLAMP_HALF else 0.0)
            elif (lo is not None and v < lo) or (hi is not None and v > hi):
                want.append(0.0)
            else:
                ties = (lo is not None and v == lo) + (hi is not None and v == hi)
                want.append({compat.CLAMP_INCLUSIVE: 1.0, compat.CLAMP_EXCLUSIVE: 0.0 if ties else 1.0,
                             compat.CLAMP_HALF: 0.5 if ties == 1 else 1.0}[mode])
        assert _clamp_grads(fn, x).tolist() == want, (kind, lo, hi, mode)


# ---- clamp at its bound through ORTModule, on both capture paths, against eager of this release --
# (torch 2.14 made eager's gradient at a bound none for a number bound and half for a tensor
# bound; ortmod gave torch.clamp's old all-of-it on 2.14: an input gradient 4.6 where eager's was 0)

CLAMPS = {
    "clamp_numbers": lambda x: torch.clamp(x, -0.25, 0.25),
    "clamp_min_number": lambda x: torch.clamp(x, min=0.5) * 3,
    "clamp_min_fn": lambda x: torch.clamp_min(x, 0.5),
    "clamp_max_number": lambda x: x.clamp(max=0.25),
    "clip_numbers": lambda x: torch.clip(x, -0.25, 0.25),
    "clamp_tensors": lambda x: torch.clamp(x, torch.tensor(-0.25, dtype=x.dtype), torch.tensor(0.25, dtype=x.dtype)),
    "clamp_min_tensor": lambda x: torch.clamp_min(x, torch.tensor(0.5, dtype=x.dtype)),
    "clamp_meet": lambda x: torch.clamp(x, torch.tensor(0.5, dtype=x.dtype), torch.tensor(0.5, dtype=x.dtype)),
}


@pytest.mark.parametrize("capture", ["export", "torchscript"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(CLAMPS))
def test_clamp_gradient_at_the_bound_is_eager_own(name, dtype, capture):
    from ortmod import DebugOptions, ORTModule

    fn = CLAMPS[name]

    class Clamp(torch.nn.Module):
        def forward(self, x):
            return fn(x * 1.0)

    x = torch.tensor([[0.5, 0.75, -1.0, 0.25, -0.25, 0.0, float("nan")]], dtype=dtype)
    w = torch.arange(1.0, 8.0, dtype=dtype).view(1, 7)
    grads, outs = [], []
    for model in (Clamp(), ORTModule(Clamp(), DebugOptions(capture=capture))):
        xi = x.clone().requires_grad_()
        y = model(xi)
        (y.nan_to_num(0.0) * w).sum().backward()
        outs.append(y.detach())
        grads.append(xi.grad)
    assert torch.equal(outs[0].isnan(), outs[1].isnan())
    assert torch.equal(outs[0].nan_to_num(7.0), outs[1].nan_to_num(7.0)), (name, outs)
    assert torch.equal(grads[0], grads[1]), (name, compat.clamp_semantics(), grads)


# a float64 clamp by a number float32 cannot hold: the translator types a Python float as float32,
# so on 2.14's number rule ortmod clamped to float32's 0.1 (1.5e-9 above 0.1) and gave no gradient
# to the values between the two, F.gaussian_nll_loss's lifted var among them (a var gradient 0
# where eager's was -59, silently)
BOUNDS_OFF_FLOAT32 = {
    "clamp_min": lambda x: torch.clamp(x, min=0.1),
    "clamp_max": lambda x: x.clamp(max=-0.1),
    "clamp_both": lambda x: torch.clamp(x, -0.1, 0.1),
}


@pytest.mark.parametrize("capture", ["export", "torchscript"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", sorted(BOUNDS_OFF_FLOAT32))
def test_clamp_by_a_number_float32_cannot_hold(name, dtype, capture):
    from ortmod import DebugOptions, ORTModule

    fn = BOUNDS_OFF_FLOAT32[name]

    class Clamp(torch.nn.Module):
        def forward(self, x):
            return fn(x * 1.0)

    f32 = float(torch.tensor(0.1, dtype=torch.float32))          # 0.10000000149...
    vals = [0.1, 0.1 + 1e-12, f32, 0.1 - 1e-12, 0.3, 0.0]
    x = torch.tensor([vals + [-v for v in vals]], dtype=dtype)
    w = torch.arange(1.0, x.numel() + 1.0, dtype=dtype).view(1, -1)
    grads, outs = [], []
    for model in (Clamp(), ORTModule(Clamp(), DebugOptions(capture=capture))):
        xi = x.clone().requires_grad_()
        y = model(xi)
        (y * w).sum().backward()
        outs.append(y.detach())
        grads.append(xi.grad)
    assert torch.equal(outs[0], outs[1]), (name, outs)
    assert torch.equal(grads[0], grads[1]), (name, compat.clamp_semantics(), grads)


@pytest.mark.parametrize("capture", ["export", "torchscript"])
def test_clamp_of_integers_keeps_their_dtype(capture):
    """clamp of an integer tensor by whole-number bounds (Longformer clamps token counts): on torch
    2.14 the TorchScript path's clamp rule typed the bounds float32, and the engine refused the
    Clip ('input 1 has unsupported dtype float32')."""
    from ortmod import DebugOptions, ORTModule

    class Positions(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(8, 3)

        def forward(self, ids):
            pos = torch.clamp(ids - 2, min=0) + torch.clamp(ids, 1, 5) + ids.clamp(max=4)
            return self.emb(pos.clamp(max=7))

    ids = torch.tensor([[0, 1, 2, 3, 5, 6, 7]])
    eager = Positions()
    wrapped = ORTModule(copy.deepcopy(eager), DebugOptions(capture=capture))
    outs = []
    for model in (eager, wrapped):
        y = model(ids)
        (y * torch.arange(1.0, y.numel() + 1.0).view(y.shape)).sum().backward()
        outs.append((y.detach(), model.emb.weight.grad if model is eager else model.module.emb.weight.grad))
    assert torch.equal(outs[0][0], outs[1][0])
    assert torch.equal(outs[0][1], outs[1][1])


@pytest.mark.parametrize("capture", ["export", "torchscript"])
@pytest.mark.parametrize("bound", ["number", "tensor"])
def test_clamp_of_integers_by_a_float_bound_follows_eager(capture, bound):
    """clamp(int tensor, min=2.0) is floating-point in eager: ortmod matches it or refuses by name,
    never returns the integers."""
    from ortmod import DebugOptions, ORTModule

    lo = 2.0 if bound == "number" else torch.tensor(2.0)

    class Clamped(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(4))

        def forward(self, ids):
            return self.w * torch.clamp(ids, min=lo)

    ids = torch.tensor([0, 1, 3, 5])
    want = Clamped()(ids)
    try:
        got = ORTModule(Clamped(), DebugOptions(capture=capture))(ids)
    except ortmod.UnsupportedModelError as e:
        assert "floating-point bound" in str(e) or "clamp" in str(e)
        return
    assert got.dtype == want.dtype and torch.equal(got, want)
