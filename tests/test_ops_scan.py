"""CumSum, GatherElements and ScatterElements: float32 parity against numpy references and
float64 finite-difference checks of the gradients; integer data (what GPT-2 and BERT
exports feed them) and out-of-range indices."""
import numpy as np
import pytest

from ortmod import _C
from oputil import check_op, make_model, run

RNG = np.random.default_rng(2024)


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


# ---- CumSum ----------------------------------------------------------------------------------

def cumsum_ref(x, axis, exclusive=0, reverse=0):
    x = np.asarray(x)
    if reverse:
        x = np.flip(x, axis)
    y = np.cumsum(x, axis=axis, dtype=x.dtype)
    if exclusive:
        y = y - x
    if reverse:
        y = np.flip(y, axis)
    return np.ascontiguousarray(y)


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("axis", [0, 1, -1])
def test_cumsum(axis, exclusive, reverse):
    x = randn(3, 4, 5)
    check_op("CumSum", {"x": x, "axis": np.array(axis, np.int64)},
             lambda x, axis: cumsum_ref(x, int(axis), exclusive, reverse),
             attrs={"exclusive": exclusive, "reverse": reverse}, grad=["x"], const_inputs=["axis"])


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_cumsum_int(dtype):
    x = RNG.integers(-5, 6, (4, 7)).astype(dtype)
    outs = check_op("CumSum", {"x": x, "axis": np.array([1], np.int32)},
                    lambda x, axis: cumsum_ref(x, 1), const_inputs=["axis"])
    assert outs[0].dtype == dtype


def test_cumsum_axis_as_graph_input():
    """The axis fed at run time (not an initializer) still works."""
    x = randn(2, 6)
    check_op("CumSum", {"x": x, "axis": np.array(1, np.int64)}, lambda x, axis: cumsum_ref(x, 1), grad=["x"])


# ---- GatherElements --------------------------------------------------------------------------

def gather_elements_ref(data, indices, axis):
    idx = np.where(indices < 0, indices + data.shape[axis], indices)
    sl = tuple(slice(None) if d == axis % data.ndim else slice(0, n) for d, n in enumerate(indices.shape))
    return np.take_along_axis(data[sl], idx, axis=axis)


@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_elements(axis):
    data = randn(3, 4, 5)
    shape = [2, 3, 4]
    shape[axis] = 6
    ind = RNG.integers(-data.shape[axis], data.shape[axis], shape).astype(np.int64)
    check_op("GatherElements", {"data": data, "indices": ind},
             lambda data, indices: gather_elements_ref(data, indices, axis),
             attrs={"axis": axis}, grad=["data"])


def test_gather_elements_repeated_indices_accumulate():
    data = randn(4, 3)
    ind = np.array([[0, 0, 0], [0, 1, 0], [3, 3, 3]], np.int64)
    check_op("GatherElements", {"data": data, "indices": ind},
             lambda data, indices: gather_elements_ref(data, indices, 0), grad=["data"])


def test_gather_elements_int64_data():
    """BERT without token_type_ids: torch.gather on its int64 buffer of type ids."""
    data = np.zeros((3, 16), np.int64)
    data[:, 5:] = 1
    ind = np.tile(np.arange(8, dtype=np.int64), (3, 1))
    outs = check_op("GatherElements", {"data": data, "indices": ind},
                    lambda data, indices: gather_elements_ref(data, indices, 1), attrs={"axis": 1})
    assert outs[0].dtype == np.int64


def test_gather_elements_out_of_range():
    m = make_model("GatherElements", {"data": randn(3, 2), "indices": np.array([[3, 0]], np.int64)})
    with pytest.raises(Exception, match="out of range"):
        run(m, [randn(3, 2), np.array([[3, 0]], np.int64)])


# ---- ScatterElements --------------------------------------------------------------------------

def scatter_elements_ref(data, indices, updates, axis, reduction="none"):
    y = data.copy()
    idx = np.where(indices < 0, indices + data.shape[axis], indices)
    for p in np.ndindex(*indices.shape):
        q = list(p)
        q[axis] = idx[p]
        if reduction == "add":
            y[tuple(q)] += updates[p]
        else:
            y[tuple(q)] = updates[p]
    return y


@pytest.mark.parametrize("axis", [0, 1])
def test_scatter_elements_none(axis):
    data = randn(4, 5)
    # distinct indices along the axis so that the result does not depend on the write order
    if axis == 0:
        ind = np.stack([RNG.permutation(4)[:3] for _ in range(5)], 1).astype(np.int64)
    else:
        ind = np.stack([RNG.permutation(5)[:3] for _ in range(4)], 0).astype(np.int64)
    upd = randn(*ind.shape)
    check_op("ScatterElements", {"data": data, "indices": ind, "updates": upd},
             lambda data, indices, updates: scatter_elements_ref(data, indices, updates, axis),
             attrs={"axis": axis}, grad=["data", "updates"])


def test_scatter_elements_add():
    data = randn(3, 4)
    ind = np.array([[0, 1, 2, 0], [0, 0, 2, 2]], np.int64)
    upd = randn(2, 4)
    check_op("ScatterElements", {"data": data, "indices": ind, "updates": upd},
             lambda data, indices, updates: scatter_elements_ref(data, indices, updates, 0, "add"),
             attrs={"axis": 0, "reduction": "add"}, grad=["data", "updates"])


def test_scatter_elements_int64():
    data = np.arange(10, dtype=np.int64).reshape(2, 5)
    ind = np.array([[4, -1], [0, 2]], np.int64)
    upd = np.array([[100, 200], [300, 400]], np.int64)
    check_op("ScatterElements", {"data": data, "indices": ind, "updates": upd},
             lambda data, indices, updates: scatter_elements_ref(data, indices, updates, 1),
             attrs={"axis": 1})


def test_scatter_elements_unsupported_reduction():
    m = make_model("ScatterElements", {"data": randn(3), "indices": np.array([0], np.int64), "updates": randn(1)},
                   attrs={"reduction": "mul"})
    with pytest.raises(_C.UnsupportedOpError, match="reduction"):
        run(m, [randn(3), np.array([0], np.int64), randn(1)])


def test_cumsum_bool_gives_int64():
    """torch.cumsum of a bool mask (GPT-2's position ids) exports as CumSum on bool: int64 out, as torch."""
    x = RNG.integers(0, 2, (3, 6)).astype(bool)
    outs = check_op("CumSum", {"x": x, "axis": np.array(1, np.int64)},
                    lambda x, axis: np.cumsum(x, axis=1).astype(np.int64), const_inputs=["axis"])
    assert outs[0].dtype == np.int64


# ---- out-of-range indices ----------------------------------------------------------------------
# Refused by name, before anything is written: by the kernel when the indices are data, by the
# shape rule when they are a constant (known at plan time), which CUDA plans run too (their
# kernels cannot report an index without a synchronization: tests/cuda_emu/harness.py's
# "constant-index-out-of-range" cases). Both ends of [-N, N), every op of scan.c that indexes.
OUT_OF_RANGE = [
    ("GatherElements", {"data": randn(3, 2), "indices": np.array([[-4, 0]], np.int64)}, {"axis": 0}, "",
     r"GatherElements node .*index -4 \(at position 0\) is out of range for axis 0 of size 3"),
    ("GatherElements", {"data": randn(3, 2), "indices": np.array([[0, 1], [1, 2]], np.int32)}, {"axis": 1}, "",
     r"GatherElements node .*index 2 \(at position 3\) is out of range for axis 1 of size 2"),
    ("ScatterElements", {"data": randn(3, 2), "indices": np.array([[0, 3]], np.int64), "updates": randn(1, 2)},
     {"axis": 0}, "", r"ScatterElements node .*index 3 \(at position 1\) is out of range for axis 0 of size 3"),
    ("ScatterElements", {"data": randn(3, 2), "indices": np.array([[-3, -4]], np.int64), "updates": randn(1, 2)},
     {"axis": 0, "reduction": "add"}, "", r"ScatterElements node .*index -4 \(at position 1\) is out of range"),
    ("GatherElementsGrad", {"dy": randn(1, 2), "shape": np.array([3, 2], np.int64),
                            "indices": np.array([[0, 3]], np.int64)}, {"axis": 0}, "ortmod",
     r"GatherElementsGrad node .*index 3 \(at position 1\) is out of range for axis 0 of size 3"),
]


@pytest.mark.parametrize("constant", [False, True], ids=["data", "constant"])
@pytest.mark.parametrize("op,inputs,attrs,domain,match", OUT_OF_RANGE, ids=[f"{c[0]}-{i}" for i, c in enumerate(OUT_OF_RANGE)])
def test_out_of_range_index_is_refused_by_name(op, inputs, attrs, domain, match, constant):
    const = [n for n in inputs if n == "shape" or (constant and n == "indices")]
    m = make_model(op, inputs, attrs, domain=domain, const_inputs=const)
    with pytest.raises(_C.EngineError, match=match):
        run(m, [a for n, a in inputs.items() if n not in const])
