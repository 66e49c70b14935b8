"""GatherND and ScatterND: float32 parity against numpy references, float64 finite-difference
checks of the gradients, integer and bool data (transformers shifts int64 labels with slice
assignment), duplicated tuples against eager torch's index_put_, out-of-range tuples and the
refused reductions."""
import numpy as np
import pytest
import torch

from ortmod import _C
from oputil import check_op, make_model, run

RNG = np.random.default_rng(14)


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def gather_nd_ref(data, indices, batch_dims=0):
    b, k = batch_dims, indices.shape[-1]
    bshape = data.shape[:b]
    d = data.reshape((-1,) + data.shape[b:])
    ind = indices.reshape((d.shape[0], -1, k))
    out = []
    for bi in range(d.shape[0]):
        for t in ind[bi]:
            out.append(d[bi][tuple(int(v) for v in t)])
    return np.array(out, dtype=data.dtype).reshape(bshape + indices.shape[b:-1] + data.shape[b + k:])


def scatter_nd_ref(data, indices, updates, reduction="none"):
    y = data.copy()
    k = indices.shape[-1]
    ind = indices.reshape(-1, k)
    upd = updates.reshape((ind.shape[0],) + data.shape[k:])
    for t, u in zip(ind, upd):
        t = tuple(int(v) for v in t)
        if reduction == "add":
            y[t] += u
        else:
            y[t] = u
    return y


def tuples(shape, k, n, distinct=False, negative=True):
    """n index tuples over the first k dims of shape (negative values when asked)."""
    space = int(np.prod(shape[:k]))
    flat = RNG.permutation(space)[:n] if distinct else RNG.integers(0, space, n)
    t = np.stack(np.unravel_index(flat, shape[:k]), -1).astype(np.int64)
    if negative:
        neg = RNG.integers(0, 2, t.shape).astype(bool)
        t = np.where(neg, t - np.array(shape[:k]), t)
    return t


# ---- GatherND --------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 2, 3])
def test_gather_nd(k):
    data = randn(3, 4, 5)
    ind = tuples(data.shape, k, 6).reshape(2, 3, k)      # repeats likely: they accumulate in the gradient
    check_op("GatherND", {"data": data, "indices": ind}, lambda data, indices: gather_nd_ref(data, indices),
             grad=["data"])


def test_gather_nd_repeated_tuples_accumulate():
    data = randn(4, 3)
    ind = np.array([[0], [0], [3], [-4], [2]], np.int64)
    check_op("GatherND", {"data": data, "indices": ind}, lambda data, indices: gather_nd_ref(data, indices),
             grad=["data"])


@pytest.mark.parametrize("batch_dims", [1, 2])
def test_gather_nd_batch_dims(batch_dims):
    data = randn(2, 3, 4, 5)
    k = 1 if batch_dims == 2 else 2
    ind = np.stack([tuples(data.shape[batch_dims:], k, 4).reshape(4, k) for _ in range(int(np.prod(data.shape[:batch_dims])))])
    ind = ind.reshape(data.shape[:batch_dims] + (4, k))
    check_op("GatherND", {"data": data, "indices": ind},
             lambda data, indices: gather_nd_ref(data, indices, batch_dims),
             attrs={"batch_dims": batch_dims}, grad=["data"])


@pytest.mark.parametrize("dtype", [np.int64, np.bool_, np.uint8])
def test_gather_nd_moves_any_dtype(dtype):
    data = RNG.integers(0, 2 if dtype == np.bool_ else 100, (4, 6)).astype(dtype)
    ind = np.array([[1, 5], [3, -1], [0, 0]], np.int64)
    outs = check_op("GatherND", {"data": data, "indices": ind}, lambda data, indices: gather_nd_ref(data, indices))
    assert outs[0].dtype == dtype


def test_gather_nd_out_of_range_names_the_node():
    data, ind = randn(3, 2), np.array([[0, 1], [0, 2]], np.int64)
    m = make_model("GatherND", {"data": data, "indices": ind})
    with pytest.raises(Exception, match=r"GatherND node .*index 2 \(tuple 1, entry 1\) is out of range"):
        run(m, [data, ind])


def test_gather_nd_bad_tuple_length():
    data, ind = randn(3, 2), np.zeros((2, 3), np.int64)
    m = make_model("GatherND", {"data": data, "indices": ind})
    with pytest.raises(Exception, match="GatherND node .*tuple length"):
        run(m, [data, ind])


# ---- ScatterND -------------------------------------------------------------------------------

@pytest.mark.parametrize("k", [1, 2, 3])
def test_scatter_nd_none(k):
    data = randn(3, 4, 5)
    # distinct targets: the result does not depend on the write order
    n = 3 if k == 1 else 4
    ind = tuples(data.shape, k, n, distinct=True).reshape(n, 1, k)
    upd = randn(*((n, 1) + data.shape[k:]))
    check_op("ScatterND", {"data": data, "indices": ind, "updates": upd},
             lambda data, indices, updates: scatter_nd_ref(data, indices, updates),
             grad=["data", "updates"])


def test_scatter_nd_add_with_repeated_tuples():
    data = randn(4, 3)
    ind = np.array([[[0], [2]], [[0], [-4]], [[3], [2]]], np.int64)
    upd = randn(3, 2, 3)
    check_op("ScatterND", {"data": data, "indices": ind, "updates": upd},
             lambda data, indices, updates: scatter_nd_ref(data, indices, updates, "add"),
             attrs={"reduction": "add"}, grad=["data", "updates"])


def test_scatter_nd_int64_label_shift():
    """transformers' shift_tokens_right: shifted[:, 1:] = labels[:, :-1]; shifted[:, 0] = start."""
    labels = RNG.integers(0, 64, (2, 5)).astype(np.int64)
    ind = np.stack(np.meshgrid(np.arange(2), np.arange(1, 5), indexing="ij"), -1).astype(np.int64)
    outs = check_op("ScatterND", {"data": np.zeros_like(labels), "indices": ind, "updates": labels[:, :-1].copy()},
                    lambda data, indices, updates: scatter_nd_ref(data, indices, updates))
    expect = np.zeros_like(labels)
    expect[:, 1:] = labels[:, :-1]
    np.testing.assert_array_equal(outs[0], expect)
    assert outs[0].dtype == np.int64


@pytest.mark.parametrize("dtype", [np.bool_, np.int32])
def test_scatter_nd_other_dtypes(dtype):
    data = RNG.integers(0, 2, (3, 4)).astype(dtype)
    ind = np.array([[2], [0]], np.int64)
    upd = RNG.integers(0, 2, (2, 4)).astype(dtype)
    outs = check_op("ScatterND", {"data": data, "indices": ind, "updates": upd},
                    lambda data, indices, updates: scatter_nd_ref(data, indices, updates))
    assert outs[0].dtype == dtype


def test_scatter_nd_add_refuses_bool():
    data, ind, upd = np.zeros((3,), bool), np.array([[1]], np.int64), np.ones((1,), bool)
    m = make_model("ScatterND", {"data": data, "indices": ind, "updates": upd}, attrs={"reduction": "add"})
    with pytest.raises(Exception, match="ScatterND"):
        run(m, [data, ind, upd])


def test_scatter_nd_duplicates_match_eager_index_put():
    """Reduction none with a duplicated target: the last tuple wins, as eager's CPU index_put_
    (deterministic mode, and any assignment small enough for one thread); the gradients are
    eager's index_put_ backward: every duplicate update receives dy of its target."""
    data = randn(5, 3)
    idx = np.array([1, 3, 1, 4, 1, 3], np.int64)
    upd = randn(6, 3)
    xt = torch.from_numpy(data.astype(np.float64)).requires_grad_()
    ut = torch.from_numpy(upd.astype(np.float64)).requires_grad_()
    with torch.no_grad():
        for det in (False, True):
            prev = torch.are_deterministic_algorithms_enabled()
            torch.use_deterministic_algorithms(det)
            try:
                y = xt.detach().clone()
                y[torch.from_numpy(idx)] = ut.detach()
            finally:
                torch.use_deterministic_algorithms(prev)
            ref = scatter_nd_ref(data.astype(np.float64), idx[:, None], upd.astype(np.float64))
            np.testing.assert_array_equal(y.numpy(), ref)
    y = xt.index_put((torch.from_numpy(idx),), ut)
    m = make_model("ScatterND", {"data": data.astype(np.float64), "indices": idx[:, None],
                                 "updates": upd.astype(np.float64)})
    outs, grads, dys = run(m, [data.astype(np.float64), idx[:, None], upd.astype(np.float64)],
                           grad=[True, False, True])
    np.testing.assert_array_equal(outs[0], y.detach().numpy())
    y.backward(torch.from_numpy(dys[0]))
    np.testing.assert_allclose(grads[0], xt.grad.numpy(), rtol=0, atol=0)
    np.testing.assert_allclose(grads[2], ut.grad.numpy(), rtol=0, atol=0)


def test_scatter_nd_out_of_range_names_the_node():
    data, ind, upd = randn(3, 2), np.array([[1], [-4]], np.int64), randn(2, 2)
    m = make_model("ScatterND", {"data": data, "indices": ind, "updates": upd})
    with pytest.raises(Exception, match=r"ScatterND node .*index -4 \(tuple 1, entry 0\) is out of range"):
        run(m, [data, ind, upd])


def test_scatter_nd_updates_shape_checked():
    data, ind, upd = randn(3, 2), np.array([[1], [2]], np.int64), randn(2, 3)
    m = make_model("ScatterND", {"data": data, "indices": ind, "updates": upd})
    with pytest.raises(Exception, match="ScatterND node .*updates must have the shape"):
        run(m, [data, ind, upd])


@pytest.mark.parametrize("reduction", ["mul", "max", "min"])
def test_scatter_nd_unsupported_reduction(reduction):
    data, ind, upd = randn(3), np.array([[0]], np.int64), randn(1)
    m = make_model("ScatterND", {"data": data, "indices": ind, "updates": upd}, attrs={"reduction": reduction})
    with pytest.raises(_C.UnsupportedOpError, match=f"reduction' = '{reduction}'"):
        run(m, [data, ind, upd])


# Out-of-range tuples, as tests/test_ops_scan.py's: refused by name before anything is written, by
# the kernel (indices as data) or by the shape rule (a constant: what a CUDA plan cannot check in
# its kernels), for the three ops of gather_nd.c.
OUT_OF_RANGE = [
    ("GatherND", {"data": randn(3, 2), "indices": np.array([[0, 1], [-3, -3]], np.int64)}, {}, "",
     r"GatherND node .*index -3 \(tuple 1, entry 1\) is out of range for a dim of size 2"),
    ("ScatterND", {"data": randn(3, 2), "indices": np.array([[1], [3]], np.int64), "updates": randn(2, 2)},
     {"reduction": "add"}, "", r"ScatterND node .*index 3 \(tuple 1, entry 0\) is out of range for a dim of size 3"),
    ("GatherNDGrad", {"dy": randn(2, 2), "shape": np.array([3, 2], np.int64), "indices": np.array([[0], [-4]], np.int64)},
     {}, "ortmod", r"GatherNDGrad node .*index -4 \(tuple 1, entry 0\) is out of range for a dim of size 3"),
]


@pytest.mark.parametrize("constant", [False, True], ids=["data", "constant"])
@pytest.mark.parametrize("op,inputs,attrs,domain,match", OUT_OF_RANGE, ids=[c[0] for c in OUT_OF_RANGE])
def test_out_of_range_tuple_is_refused_by_name(op, inputs, attrs, domain, match, constant):
    const = [n for n in inputs if n == "shape" or (constant and n == "indices")]
    m = make_model(op, inputs, attrs, domain=domain, const_inputs=const)
    with pytest.raises(_C.EngineError, match=match):
        run(m, [a for n, a in inputs.items() if n not in const])
