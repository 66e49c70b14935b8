"""Comparisons, logic, Clip, activations, Tile, Trilu, Pad and Einsum: float32 parity against
numpy/PyTorch (references only) and float64 finite-difference checks of the gradients."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from oputil import check_op, make_model, run

RNG = np.random.default_rng(777)


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def T(a):
    return torch.from_numpy(np.ascontiguousarray(a))


# ---- comparisons and logic ---------------------------------------------------------------

@pytest.mark.parametrize("op,fn", [("Less", np.less), ("Greater", np.greater),
                                   ("LessOrEqual", np.less_equal), ("GreaterOrEqual", np.greater_equal)])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.int32])
def test_compare(op, fn, dtype):
    a = RNG.integers(-3, 4, (2, 3, 4)).astype(dtype)
    b = RNG.integers(-3, 4, (3, 1)).astype(dtype)
    check_op(op, {"A": a, "B": b}, lambda A, B: fn(A, B))


@pytest.mark.parametrize("op,fn", [("And", np.logical_and), ("Or", np.logical_or), ("Xor", np.logical_xor)])
def test_logic(op, fn):
    a = RNG.integers(0, 2, (2, 3, 4)).astype(bool)
    b = RNG.integers(0, 2, (4,)).astype(bool)
    check_op(op, {"A": a, "B": b}, lambda A, B: fn(A, B))


def test_not():
    a = RNG.integers(0, 2, (3, 5)).astype(bool)
    check_op("Not", {"X": a}, lambda X: np.logical_not(X))


def test_isnan_isinf():
    x = np.array([1.0, np.nan, np.inf, -np.inf, 0.0], np.float32)
    check_op("IsNaN", {"X": x}, lambda X: np.isnan(X))
    check_op("IsInf", {"X": x}, lambda X: np.isinf(X))
    check_op("IsInf", {"X": x}, lambda X: np.isposinf(X), attrs={"detect_negative": 0})
    check_op("IsInf", {"X": x}, lambda X: np.isneginf(X), attrs={"detect_positive": 0})


# ---- Clip ----------------------------------------------------------------------------------

@pytest.mark.parametrize("lo,hi", [(-0.5, 0.7), (None, 0.3), (-0.2, None), (None, None)])
def test_clip(lo, hi):
    x = randn(3, 7)
    inputs = {"X": x, "min": None if lo is None else np.float32(lo), "max": None if hi is None else np.float32(hi)}
    check_op("Clip", inputs, lambda X, min, max: np.clip(X, min, max) if (min is not None or max is not None) else X,
             grad=["X"])


def test_clip_int64():
    x = np.arange(-5, 6, dtype=np.int64)
    check_op("Clip", {"X": x, "min": np.int64(-2), "max": np.int64(3)}, lambda X, min, max: np.clip(X, min, max))


# ---- activations ----------------------------------------------------------------------------

ACTS = [
    ("LeakyRelu", {}, lambda x: F.leaky_relu(x, 0.01)),
    ("LeakyRelu", {"alpha": 0.2}, lambda x: F.leaky_relu(x, 0.2)),
    ("Softplus", {}, F.softplus),
    ("Elu", {"alpha": 0.7}, lambda x: F.elu(x, 0.7)),
    ("Selu", {}, F.selu),
    ("HardSigmoid", {"alpha": 1 / 6, "beta": 0.5}, F.hardsigmoid),
    ("HardSwish", {}, F.hardswish),
    ("Mish", {}, F.mish),
    ("Softsign", {}, F.softsign),
    ("Celu", {}, F.celu),
    ("Celu", {"alpha": 1.7}, lambda x: F.celu(x, 1.7)),
]


@pytest.mark.parametrize("op,attrs,fn", ACTS, ids=[a[0] + str(i) for i, a in enumerate(ACTS)])
def test_activation(op, attrs, fn):
    x = randn(4, 9) * 3
    x[np.abs(np.abs(x) - 3) < 1e-3] += 0.01      # keep finite differences off HardSwish's kinks
    x[np.abs(x) < 1e-3] += 0.01
    check_op(op, {"X": x}, lambda X: fn(T(X)).numpy(), attrs=attrs, grad=["X"])


# ---- Tile / Trilu ------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,reps", [((2, 3), (2, 3)), ((3,), (4,)), ((2, 1, 3), (1, 4, 2))])
def test_tile(shape, reps):
    x = randn(*shape)
    check_op("Tile", {"X": x, "repeats": np.array(reps, np.int64)}, lambda X, repeats: np.tile(X, repeats),
             grad=["X"], const_inputs=["repeats"])


def test_tile_int64():
    x = np.arange(6, dtype=np.int64).reshape(2, 3)
    check_op("Tile", {"X": x, "repeats": np.array([2, 1], np.int64)}, lambda X, repeats: np.tile(X, repeats),
             const_inputs=["repeats"])


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, 0, 1, -2])
def test_trilu(upper, k):
    x = randn(2, 4, 5)
    inputs = {"X": x, "k": None if k is None else np.array(k, np.int64)}

    def ref(X, k):
        kk = 0 if k is None else int(k)
        return np.triu(X, kk) if upper else np.tril(X, kk)

    check_op("Trilu", inputs, ref, attrs={"upper": upper}, grad=["X"])


def test_trilu_bool():
    x = np.ones((4, 4), bool)
    check_op("Trilu", {"X": x}, lambda X: np.tril(X), attrs={"upper": 0})


# ---- Pad -----------------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad(mode):
    x = randn(2, 3, 4)
    pads = np.array([0, 1, 2, 1, 2, 3], np.int64)   # begin per axis, then end per axis
    inputs = {"X": x, "pads": pads}
    if mode == "constant":
        inputs["value"] = np.float32(0.5)

    def ref(X, pads, value=None):
        pw = [(int(pads[i]), int(pads[i + 3])) for i in range(3)]
        if mode == "constant":
            return np.pad(X, pw, mode="constant", constant_values=value)
        return np.pad(X, pw, mode={"reflect": "reflect", "edge": "edge", "wrap": "wrap"}[mode])

    check_op("Pad", inputs, ref, attrs={"mode": mode}, grad=["X"], const_inputs=["pads"])


def test_pad_axes_negative():
    x = randn(3, 5)
    inputs = {"X": x, "pads": np.array([1, -2], np.int64), "value": None, "axes": np.array([-1], np.int64)}
    check_op("Pad", inputs, lambda X, pads, value, axes: np.pad(X, [(0, 0), (1, 0)])[:, :-2], grad=["X"],
             const_inputs=["pads", "axes"])


# ---- Einsum ------------------------------------------------------------------------------

EINSUM = [
    ("bij,bjk->bik", [(2, 3, 4), (2, 4, 5)]),
    ("bhqd,bhkd->bhqk", [(2, 2, 3, 4), (2, 2, 5, 4)]),
    ("...ij,...jk->...ik", [(2, 3, 4), (2, 4, 2)]),
    ("...ij,...jk->...ik", [(2, 1, 3, 4), (3, 4, 2)]),    # ellipsis broadcast both ways
    ("ij,jk", [(3, 4), (4, 2)]),                           # implicit output
    ("bhqk,bhkd->bhqd", [(1, 2, 3, 4), (1, 2, 4, 5)]),
    ("i,j->ij", [(3,), (4,)]),                             # outer product (no contraction)
    ("bi,bi->b", [(3, 4), (3, 4)]),
    ("ij->ji", [(3, 4)]),
    ("ijk->kji", [(2, 3, 4)]),
    ("bn,anm,bm->ba", None),                               # 3 operands: unsupported (checked below)
]


@pytest.mark.parametrize("eq,shapes", [e for e in EINSUM if e[1] is not None], ids=[e[0] for e in EINSUM if e[1]])
def test_einsum(eq, shapes):
    names = ["A", "B"][:len(shapes)]
    inputs = {n: randn(*s) for n, s in zip(names, shapes)}
    check_op("Einsum", inputs, lambda **kw: np.einsum(eq, *kw.values()), attrs={"equation": eq}, grad=names,
             rtol=1e-4, atol=1e-5)


def test_einsum_sum_forward():
    x = randn(3, 4)
    check_op("Einsum", {"A": x}, lambda A: A.sum(1), attrs={"equation": "ij->i"})


def test_einsum_three_operands_unsupported():
    m = make_model("Einsum", {"A": randn(2, 3), "B": randn(4, 3, 5), "C": randn(2, 5)},
                   {"equation": "bn,anm,bm->ba"})
    with pytest.raises(Exception, match="Einsum"):
        run(m, [randn(2, 3), randn(4, 3, 5), randn(2, 5)])
