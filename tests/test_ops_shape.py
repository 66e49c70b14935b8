"""Shape and glue ops (csrc/ops/shape.c) and reductions (csrc/ops/reduce.c): parity with
numpy in float32 and finite-difference gradient checks in float64.

Shape-like inputs (shape, axes, starts, ...) are passed as const_inputs so that they are
initializers, known at plan time, as the exporter's Constant nodes are.
"""
import numpy as np
import pytest
from onnx import numpy_helper

import ortmod
import torch
from oputil import check_op, make_model, run

RNG = np.random.default_rng(1234)


def rand(*shape):
    return RNG.standard_normal(shape)


def i64(*v):
    return np.array(v, dtype=np.int64)


INT64_MIN = np.iinfo(np.int64).min
INT64_MAX = np.iinfo(np.int64).max


# ---- Shape, Size, Constant, ConstantOfShape ------------------------------------------------

@pytest.mark.parametrize("attrs,expect", [
    ({}, [2, 3, 4]),
    ({"start": 1}, [3, 4]),
    ({"start": -2, "end": -1}, [3]),
    ({"start": 2, "end": 1}, []),
    ({"end": 10}, [2, 3, 4]),
])
def test_shape(attrs, expect):
    check_op("Shape", {"x": rand(2, 3, 4)}, lambda x: np.array(expect, dtype=np.int64), attrs=attrs)


def test_size():
    check_op("Size", {"x": rand(2, 3, 4)}, lambda x: np.array(24, dtype=np.int64))


def test_constant_tensor():
    v = np.arange(6, dtype=np.float32).reshape(2, 3)
    check_op("Constant", {}, lambda: v, attrs={"value": numpy_helper.from_array(v)})


def test_constant_int64_tensor():
    v = np.array([3, -1, 7], dtype=np.int64)
    check_op("Constant", {}, lambda: v, attrs={"value": numpy_helper.from_array(v)})


@pytest.mark.parametrize("attrs,expect", [
    ({"value_float": 2.5}, np.array(2.5, dtype=np.float32)),
    ({"value_floats": [1.0, 2.0]}, np.array([1.0, 2.0], dtype=np.float32)),
    ({"value_int": 7}, np.array(7, dtype=np.int64)),
    ({"value_ints": [4, 5, 6]}, np.array([4, 5, 6], dtype=np.int64)),
])
def test_constant_scalar_attrs(attrs, expect):
    check_op("Constant", {}, lambda: expect, attrs=attrs)


def test_constant_of_shape_value():
    val = numpy_helper.from_array(np.array([1.5], dtype=np.float32))
    check_op("ConstantOfShape", {"shape": i64(2, 3)}, lambda shape: np.full((2, 3), 1.5, np.float32),
             attrs={"value": val}, const_inputs=["shape"])


def test_constant_of_shape_default_and_int():
    check_op("ConstantOfShape", {"shape": i64(4)}, lambda shape: np.zeros(4, np.float32), const_inputs=["shape"])
    val = numpy_helper.from_array(np.array([9], dtype=np.int64))
    check_op("ConstantOfShape", {"shape": i64(2, 2)}, lambda shape: np.full((2, 2), 9, np.int64),
             attrs={"value": val}, const_inputs=["shape"])


# ---- views: Reshape, Flatten, Squeeze, Unsqueeze -------------------------------------------

@pytest.mark.parametrize("shape,expect", [
    ((0, -1), (2, 12)),
    ((-1,), (24,)),
    ((4, -1, 2), (4, 3, 2)),
    ((0, 0, 2, 2), (2, 3, 2, 2)),
    ((1, 24), (1, 24)),
])
def test_reshape(shape, expect):
    check_op("Reshape", {"x": rand(2, 3, 4), "shape": i64(*shape)},
             lambda x, shape: x.reshape(expect), grad=["x"], const_inputs=["shape"])


def test_reshape_allowzero():
    check_op("Reshape", {"x": rand(0, 3), "shape": i64(3, 0)},
             lambda x, shape: x.reshape(3, 0), attrs={"allowzero": 1}, const_inputs=["shape"])


@pytest.mark.parametrize("axis", [0, 1, 2, -1, 3])
def test_flatten(axis):
    x = rand(2, 3, 4)
    a = x.ndim + axis if axis < 0 else axis
    expect = (int(np.prod(x.shape[:a])), int(np.prod(x.shape[a:])))
    check_op("Flatten", {"x": x}, lambda x: x.reshape(expect), attrs={"axis": axis}, grad=["x"])


def test_squeeze_axes():
    check_op("Squeeze", {"x": rand(2, 1, 3, 1), "axes": i64(-1, 1)},
             lambda x, axes: x.reshape(2, 3), grad=["x"], const_inputs=["axes"])


def test_squeeze_all():
    check_op("Squeeze", {"x": rand(2, 1, 3, 1)}, lambda x: x.reshape(2, 3), grad=["x"])


def test_unsqueeze():
    check_op("Unsqueeze", {"x": rand(2, 3), "axes": i64(0, -1)},
             lambda x, axes: x.reshape(1, 2, 3, 1), grad=["x"], const_inputs=["axes"])
    check_op("Unsqueeze", {"x": rand(2, 3), "axes": i64(1)},
             lambda x, axes: x.reshape(2, 1, 3), grad=["x"], const_inputs=["axes"])


def test_unsqueeze_scalar_int64():
    # a folded shape computation: every input is a constant
    check_op("Unsqueeze", {"x": np.array(5, dtype=np.int64), "axes": i64(0)},
             lambda x, axes: x.reshape(1), const_inputs=["x", "axes"])


# ---- Transpose ------------------------------------------------------------------------------

@pytest.mark.parametrize("shape,perm", [
    ((2, 3, 4), (1, 0, 2)),        # trailing block moves whole
    ((2, 3, 4), (2, 0, 1)),
    ((2, 3, 4), None),             # default: reversed
    ((2, 3, 4), (0, 2, 1)),        # batch of 2-D transposes
    ((37, 45), (1, 0)),            # tiled 2-D with ragged tiles
    ((2, 3, 4, 5), (0, 2, 1, 3)),  # attention's head split
    ((2, 3, 4, 5), (0, 2, 3, 1)),
    ((3, 1, 4, 1, 2), (4, 1, 3, 0, 2)),  # size-1 dims
    ((2, 3, 4, 5), (3, 1, 2, 0)),  # general strided path
])
def test_transpose(shape, perm):
    x = rand(*shape)
    attrs = {} if perm is None else {"perm": list(perm)}
    grad = ["x"] if x.size <= 120 else []
    check_op("Transpose", {"x": x}, lambda x: np.transpose(x, perm), attrs=attrs, grad=grad)


def test_transpose_int64():
    x = np.arange(24, dtype=np.int64).reshape(2, 3, 4)
    check_op("Transpose", {"x": x}, lambda x: np.transpose(x, (2, 0, 1)), attrs={"perm": [2, 0, 1]})


# ---- Gather -----------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, -1])
def test_gather_negative_and_repeated(axis):
    x = rand(5, 4, 3)
    n = x.shape[axis]
    idx = np.array([[0, -1], [2, 2], [-n, 1]], dtype=np.int64)
    check_op("Gather", {"x": x, "idx": idx}, lambda x, idx: np.take(x, idx % n, axis=axis),
             attrs={"axis": axis}, grad=["x"])


def test_gather_scalar_index_int32():
    x = rand(5, 4)
    idx = np.array(-2, dtype=np.int32)
    check_op("Gather", {"x": x, "idx": idx}, lambda x, idx: x[-2], attrs={"axis": 0}, grad=["x"])
    check_op("Gather", {"x": x, "idx": idx}, lambda x, idx: x[-2], attrs={"axis": 0}, grad=["x"],
             const_inputs=["idx"])


def test_gather_embedding_grad_accumulates():
    # an embedding lookup: the same row three times; its gradient is the sum of three dys
    w = rand(6, 3)
    idx = np.array([[1, 4, 1], [1, 0, 5]], dtype=np.int64)
    check_op("Gather", {"w": w, "idx": idx}, lambda w, idx: w[idx], grad=["w"])


def test_gather_int64_data():
    x = np.array([7, 8, 9], dtype=np.int64)
    check_op("Gather", {"x": x, "idx": np.array(-1, dtype=np.int64)}, lambda x, idx: x[-1],
             const_inputs=["idx"])


@pytest.mark.parametrize("const", [(), ("idx",)], ids=["data", "constant"])   # constant: the shape rule's check
@pytest.mark.parametrize("idx", [[0, 3], [-4, 0]])
def test_gather_out_of_range(idx, const):
    bad = max(idx, key=abs)
    with pytest.raises(Exception, match=rf"Gather node .*index {bad} \(at position {idx.index(bad)}\) is out of range "
                                        r"for axis 0 of size 3"):
        check_op("Gather", {"x": rand(3, 2), "idx": np.array(idx, dtype=np.int64)}, None, const_inputs=const)


# ---- Concat -----------------------------------------------------------------------------------

@pytest.mark.parametrize("axis", [0, 1, -1])
def test_concat(axis):
    shapes = {0: [(1, 3, 2), (2, 3, 2), (3, 3, 2)], 1: [(2, 1, 2), (2, 3, 2), (2, 2, 2)],
              -1: [(2, 3, 1), (2, 3, 2), (2, 3, 3)]}[axis]
    ins = {f"x{i}": rand(*s) for i, s in enumerate(shapes)}
    check_op("Concat", ins, lambda **kw: np.concatenate(list(kw.values()), axis=axis),
             attrs={"axis": axis}, grad=list(ins))


def test_concat_partial_grad():
    ins = {"a": rand(2, 3), "b": rand(2, 2)}
    check_op("Concat", ins, lambda a, b: np.concatenate([a, b], 1), attrs={"axis": 1}, grad=["b"])


def test_concat_int64_shapes():
    ins = {"a": i64(2, 3), "b": i64(4), "c": i64()}
    check_op("Concat", ins, lambda a, b, c: np.concatenate([a, b, c]), attrs={"axis": 0},
             const_inputs=["c"])


# ---- Slice ------------------------------------------------------------------------------------

SLICES = [
    # starts, ends, axes, steps
    ((1, -4), (4, 100), (0, 1), None),
    ((-1,), (INT64_MIN,), (1,), (-1,)),         # full reverse of axis 1
    ((4,), (-100,), (-1,), (-2,)),               # negative step, clamped end
    ((0, 5), (5, 0), None, (2, -3)),             # no axes input, steps given
    ((10,), (20,), (0,), None),                  # empty slice
    ((1, 0), (INT64_MAX, 6), (0, 1), None),      # trailing axis whole: block copies
]


def np_slice(x, starts, ends, axes, steps):
    sl = [slice(None)] * x.ndim
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    for s, e, a, st in zip(starts, ends, axes, steps):
        e = None if (st < 0 and e < -x.shape[a]) else e
        sl[a] = slice(s, e, st)
    return x[tuple(sl)]


@pytest.mark.parametrize("starts,ends,axes,steps", SLICES)
def test_slice(starts, ends, axes, steps):
    x = rand(5, 6)
    ins = {"x": x, "starts": i64(*starts), "ends": i64(*ends),
           "axes": None if axes is None else i64(*axes), "steps": None if steps is None else i64(*steps)}
    if steps is None:
        del ins["steps"]
        if axes is None:
            del ins["axes"]
    consts = [k for k in ins if k != "x"]
    check_op("Slice", ins, lambda x, **kw: np_slice(x, starts, ends, axes, steps), grad=["x"], const_inputs=consts)


def test_slice_3d_middle():
    x = rand(3, 4, 5)
    ins = {"x": x, "starts": i64(1, -1), "ends": i64(3, 0), "axes": i64(1, 2), "steps": i64(1, -2)}
    check_op("Slice", ins, lambda x, **kw: x[:, 1:3, -1:0:-2], grad=["x"],
             const_inputs=["starts", "ends", "axes", "steps"])


def test_slice_int64():
    x = np.arange(10, dtype=np.int64)
    ins = {"x": x, "starts": i64(-3), "ends": i64(INT64_MAX)}
    check_op("Slice", ins, lambda x, **kw: x[-3:], const_inputs=["starts", "ends"])


# ---- Expand -----------------------------------------------------------------------------------

@pytest.mark.parametrize("xshape,shape", [
    ((3, 1), (2, 3, 4)),
    ((2, 1, 4), (3, 1, 1, 1)),   # shape's 1s keep x's dims
    ((), (2, 3)),                # scalar
    ((1, 3), (4, 3)),            # contiguous rows repeated
    ((2, 3), (2, 3)),            # nothing to do
])
def test_expand(xshape, shape):
    x = rand(*xshape)
    check_op("Expand", {"x": x, "shape": i64(*shape)},
             lambda x, shape: np.broadcast_to(x, np.broadcast_shapes(x.shape, tuple(shape))).copy(),
             grad=["x"], const_inputs=["shape"])


# ---- Range --------------------------------------------------------------------------------------

def test_range_int64():
    ins = {"start": np.array(2, np.int64), "limit": np.array(11, np.int64), "delta": np.array(3, np.int64)}
    check_op("Range", ins, lambda **kw: np.arange(2, 11, 3, dtype=np.int64), const_inputs=list(ins))
    ins = {"start": np.array(5, np.int64), "limit": np.array(-2, np.int64), "delta": np.array(-2, np.int64)}
    check_op("Range", ins, lambda **kw: np.arange(5, -2, -2, dtype=np.int64), const_inputs=list(ins))


def test_range_float():
    ins = {"start": np.array(1.0), "limit": np.array(2.0), "delta": np.array(0.25)}
    check_op("Range", ins, lambda **kw: np.arange(1.0, 2.0, 0.25, dtype=np.float32), const_inputs=list(ins))


# ---- Split --------------------------------------------------------------------------------------

def test_split_sizes():
    x = rand(6, 4)
    check_op("Split", {"x": x, "split": i64(1, 2, 3)}, lambda x, split: tuple(np.split(x, [1, 3], axis=0)),
             attrs={"axis": 0}, n_outputs=3, grad=["x"], const_inputs=["split"])


def test_split_num_outputs_uneven():
    x = rand(2, 5)
    check_op("Split", {"x": x}, lambda x: (x[:, 0:2], x[:, 2:4], x[:, 4:5]),
             attrs={"axis": -1, "num_outputs": 3}, n_outputs=3, grad=["x"])


def test_split_grad_with_missing_dy():
    """Only some outputs carry a gradient: the missing parts of dx are zeros."""
    from ortmod import _C
    from oputil import _Cap

    x = rand(6, 2)
    model = make_model("Split", {"x": x}, {"axis": 0, "num_outputs": 3}, n_outputs=3)
    eng = _C.Engine(model, [True])
    caps, stash = eng.forward([np.ascontiguousarray(x)], True)
    outs = [np.from_dlpack(_Cap(c)).copy() for c in caps]
    np.testing.assert_array_equal(outs[1], x[2:4])
    d0, d2 = rand(2, 2), rand(2, 2)
    (g,) = eng.backward(stash, [d0, None, d2])
    g = np.from_dlpack(_Cap(g)).copy()
    np.testing.assert_array_equal(g, np.concatenate([d0, np.zeros((2, 2)), d2]))


# ---- reductions --------------------------------------------------------------------------------

def np_reduce(fn, x, axes, keepdims, noop=0):
    if axes is None or len(axes) == 0:
        if noop:
            return x
        axes = tuple(range(x.ndim))
    return fn(x, axis=tuple(axes), keepdims=bool(keepdims))


REDUCE_CASES = [
    ((0, 2), 1),
    ((0, 2), 0),
    ((-1,), 0),
    ((1,), 1),
    ((0,), 0),
    ((-3, -2, -1), 0),   # every axis, named
    (None, 0),           # every axis by default
    (None, 1),
]


@pytest.mark.parametrize("op,fn", [("ReduceSum", np.sum), ("ReduceMean", np.mean)])
@pytest.mark.parametrize("axes,keepdims", REDUCE_CASES)
def test_reduce_sum_mean(op, fn, axes, keepdims):
    x = rand(3, 4, 5)
    ins = {"x": x} if axes is None else {"x": x, "axes": i64(*axes)}
    check_op(op, ins, lambda x, axes=None: np_reduce(fn, x, axes, keepdims),
             attrs={"keepdims": keepdims}, grad=["x"], const_inputs=["axes"], opset=18)


@pytest.mark.parametrize("op,fn", [("ReduceMax", np.max), ("ReduceMin", np.min)])
@pytest.mark.parametrize("axes,keepdims", REDUCE_CASES)
def test_reduce_max_min(op, fn, axes, keepdims):
    x = RNG.permutation(60).reshape(3, 4, 5).astype(np.float64) * 0.1   # no ties
    ins = {"x": x} if axes is None else {"x": x, "axes": i64(*axes)}
    check_op(op, ins, lambda x, axes=None: np_reduce(fn, x, axes, keepdims),
             attrs={"keepdims": keepdims}, grad=["x"], const_inputs=["axes"], opset=18)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("axis,keepdims,last", [(0, 1, 0), (1, 0, 0), (-1, 1, 0), (2, 1, 1), (1, 0, 1)])
def test_arg_max_min(op, axis, keepdims, last):
    """First extremum (last with select_last_index); NaN counts as the extremum, as torch says."""
    x = np.round(RNG.standard_normal((3, 4, 5)), 0)          # many ties
    x[1, 2, 3] = x[2, 0, 0] = x[2, 0, 4] = np.nan

    def ref(x):
        t = torch.from_numpy(x)
        if not last:
            return (t.argmax if op == "ArgMax" else t.argmin)(axis, keepdim=bool(keepdims)).numpy()
        flipped = torch.from_numpy(np.ascontiguousarray(np.flip(x, axis)))
        i = (flipped.argmax if op == "ArgMax" else flipped.argmin)(axis, keepdim=bool(keepdims))
        return (x.shape[axis] - 1 - i).numpy()
    check_op(op, {"x": x}, ref, attrs={"axis": axis, "keepdims": keepdims, "select_last_index": last})
    ints = np.nan_to_num(x, nan=7.0).astype(np.int64)
    check_op(op, {"x": ints}, ref, attrs={"axis": axis, "keepdims": keepdims, "select_last_index": last})


def test_arg_max_of_an_empty_axis_is_refused():
    x = np.zeros((2, 0), np.float32)
    with pytest.raises(ortmod.InvalidInputError, match="empty axis"):
        run(make_model("ArgMax", {"x": x}, {"axis": 1}), [x])


def test_reduce_noop_with_empty_axes():
    x = rand(2, 3)
    check_op("ReduceSum", {"x": x}, lambda x: x, attrs={"noop_with_empty_axes": 1}, grad=["x"])
    check_op("ReduceMean", {"x": x, "axes": np.zeros(0, np.int64)}, lambda x, axes: x,
             attrs={"noop_with_empty_axes": 1}, grad=["x"], const_inputs=["axes"], opset=18)


def test_reduce_mean_opset17_axes_attribute():
    x = rand(2, 3, 4)
    check_op("ReduceMean", {"x": x}, lambda x: x.mean(axis=(1,), keepdims=False),
             attrs={"axes": [-2], "keepdims": 0}, grad=["x"], opset=17)


def test_reduce_sum_opset13():
    x = rand(2, 3, 4)
    check_op("ReduceSum", {"x": x, "axes": i64(1)}, lambda x, axes: x.sum(axis=1, keepdims=True),
             grad=["x"], const_inputs=["axes"], opset=13)


def test_reduce_prod():
    x = rand(3, 4)
    check_op("ReduceProd", {"x": x, "axes": i64(0)}, lambda x, axes: x.prod(axis=0, keepdims=True),
             const_inputs=["axes"], opset=18)


def test_reduce_large_rows():
    # long contiguous reductions take the 8-accumulator path; a leading-axis reduction
    # takes the elementwise row path
    x = rand(7, 1031)
    check_op("ReduceSum", {"x": x, "axes": i64(1)}, lambda x, axes: x.sum(1, keepdims=True),
             const_inputs=["axes"], rtol=1e-4, atol=1e-4)
    check_op("ReduceMean", {"x": x, "axes": i64(0)}, lambda x, axes: x.mean(0, keepdims=False),
             attrs={"keepdims": 0}, const_inputs=["axes"], rtol=1e-4, atol=1e-5)


def test_reduce_int64():
    x = np.arange(24, dtype=np.int64).reshape(2, 3, 4)
    for op, fn in [("ReduceSum", np.sum), ("ReduceMax", np.max), ("ReduceMin", np.min), ("ReduceProd", np.prod)]:
        check_op(op, {"x": x, "axes": i64(1)}, lambda x, axes: fn(x, axis=1, keepdims=False),
                 attrs={"keepdims": 0}, const_inputs=["axes"], opset=18)
