"""The norm reductions ReduceL1, ReduceL2, ReduceSumSquare and ReduceLogSumExp (csrc/ops/reduce.c):
what F.normalize, torch.norm / linalg.vector_norm (ord 1 and 2) and torch.logsumexp export to.

Parity with numpy in float32 and finite-difference gradients in float64 (opset 18's axes input,
keepdims, noop_with_empty_axes, and opset 13's axes attribute); then the torch functions through
ORTModule against eager autograd, zero rows included (the norm's subgradient at 0 is eager's 0;
tests/test_nonfinite.py has NaN and infinities).
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from ortmod import ORTModule
from oputil import Fn, check_op, make_model, run

RNG = np.random.default_rng(14)


# ---- the norm reductions -------------------------------------------------------------------

REDUCTIONS = {
    "ReduceL1": lambda x, axes, keep: np.sum(np.abs(x), axis=axes, keepdims=keep),
    "ReduceL2": lambda x, axes, keep: np.sqrt(np.sum(x * x, axis=axes, keepdims=keep)),
    "ReduceSumSquare": lambda x, axes, keep: np.sum(x * x, axis=axes, keepdims=keep),
    "ReduceLogSumExp": lambda x, axes, keep: np.log(np.sum(np.exp(x), axis=axes, keepdims=keep)),
}


@pytest.mark.parametrize("op", sorted(REDUCTIONS))
@pytest.mark.parametrize("axes,keep", [((1,), 1), ((0, 2), 0), ((-1,), 0), (None, 1), ((2,), 1)])
def test_reduction_parity_and_gradient(op, axes, keep):
    x = RNG.standard_normal((3, 4, 5))
    inputs = {"x": x} if axes is None else {"x": x, "axes": np.array(axes, np.int64)}
    np_axes = None if axes is None else tuple(axes)
    check_op(op, inputs, lambda x, axes=None: REDUCTIONS[op](x.astype(np.float64), np_axes, bool(keep)),
             attrs={"keepdims": keep}, grad=("x",), const_inputs=["axes"], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", sorted(REDUCTIONS))
def test_reduction_noop_with_empty_axes_and_axes_attribute(op):
    x = RNG.standard_normal((3, 4))
    out = check_op(op, {"x": x, "axes": np.array([], np.int64)}, None, attrs={"noop_with_empty_axes": 1},
                   const_inputs=["axes"])
    x32 = x.astype(np.float32)
    want = {"ReduceL1": np.abs(x32), "ReduceL2": np.abs(x32), "ReduceSumSquare": x32 * x32, "ReduceLogSumExp": x32}[op]
    np.testing.assert_allclose(out[0], want, rtol=1e-6)
    check_op(op, {"x": x}, lambda x: REDUCTIONS[op](x.astype(np.float64), (1,), False),
             attrs={"axes": [1], "keepdims": 0}, opset=13, grad=("x",))


def test_reductions_refuse_integers_by_name():
    x = np.arange(6, dtype=np.int64).reshape(2, 3)
    with pytest.raises(Exception, match=r"ReduceL2.*int64"):
        run(make_model("ReduceL2", {"x": x}), [x])


def test_logsumexp_is_max_shifted():
    x = np.array([[1000.0, 1000.0, -1000.0], [-1000.0, -1001.0, -np.inf]], np.float32)
    out = check_op("ReduceLogSumExp", {"x": x, "axes": np.array([1], np.int64)},
                   lambda x, axes: torch.logsumexp(torch.from_numpy(x), 1, keepdim=True).numpy(),
                   const_inputs=["axes"])
    assert np.isfinite(out[0]).all()


NORMS = {
    "normalize": lambda x: F.normalize(x, dim=-1),
    "normalize_p1": lambda x: F.normalize(x, p=1, dim=0),
    "norm": lambda x: torch.norm(x, dim=-1),
    "norm_all": lambda x: torch.norm(x),
    "vector_norm_keepdim": lambda x: torch.linalg.vector_norm(x, dim=0, keepdim=True),
    "vector_norm_1": lambda x: torch.linalg.vector_norm(x, 1, dim=1),
    "logsumexp": lambda x: torch.logsumexp(x, dim=-1),
    "logsumexp_keepdim": lambda x: torch.logsumexp(x, dim=(0, 1), keepdim=True),
    "pairwise_distance": lambda x: F.pairwise_distance(x, x.flip(0)),
    "cosine_similarity": lambda x: F.cosine_similarity(x, x.flip(0)),
    "normalize_p3": lambda x: F.normalize(x, p=3, dim=-1),
    "vector_norm_3": lambda x: torch.linalg.vector_norm(x, 3, dim=1),
    "vector_norm_half": lambda x: torch.linalg.vector_norm(x, 0.5, dim=1),
    "matrix_norm_fro": lambda x: torch.linalg.matrix_norm(x),
}


@pytest.mark.parametrize("zero_row", [False, True])
@pytest.mark.parametrize("name", sorted(NORMS))
def test_norm_functions_match_eager(name, zero_row):
    # rows of zeros: the norm's subgradient at 0 is eager's 0 (pairwise_distance, cosine_similarity
    # and the other orders: ortmod's own export rules, tests/test_ops_distance.py)
    x = torch.randn(4, 6, dtype=torch.float64)
    if zero_row:
        x[1] = 0
    xe, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    ye, yo = Fn(NORMS[name])(xe), ORTModule(Fn(NORMS[name]))(xo)
    torch.testing.assert_close(yo, ye, rtol=1e-10, atol=1e-12)
    g = torch.randn(ye.shape, dtype=torch.float64)
    ye.backward(g)
    yo.backward(g)
    torch.testing.assert_close(xo.grad, xe.grad, rtol=1e-10, atol=1e-12)


EXPORT_NORMS = ["normalize", "normalize_p1", "norm", "norm_all", "vector_norm_keepdim", "vector_norm_1", "logsumexp",
                "logsumexp_keepdim"]


@pytest.mark.parametrize("name", EXPORT_NORMS)
def test_norm_functions_on_the_export_capture_path(name):
    from ortmod import DebugOptions
    x = torch.randn(4, 6, dtype=torch.float64)
    x[1] = 0
    xe, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    ye, yo = Fn(NORMS[name])(xe), ORTModule(Fn(NORMS[name]), DebugOptions(capture="export"))(xo)
    torch.testing.assert_close(yo, ye, rtol=1e-10, atol=1e-12)
    g = torch.randn(ye.shape, dtype=torch.float64)
    ye.backward(g)
    yo.backward(g)
    # the zero row's normalize gradient is dy / eps (~1e12): eps = 1e-12 must be the double, as
    # eager's (torchlib's scalar_tensor made it the float32 9.9999999e-13: 4e-9 relative)
    torch.testing.assert_close(xo.grad, xe.grad, rtol=1e-10, atol=1e-12)


def test_vector_norm_of_order_3_on_the_export_path_keeps_the_zero_row_gradient():
    # torchlib's Pow chain would give the zero row a NaN gradient; ortmod's rule is _p_norm's
    from ortmod import DebugOptions
    fn = lambda x: torch.linalg.vector_norm(x, 3, dim=1)
    x = torch.randn(3, 4, dtype=torch.float64)
    x[1] = 0
    xe, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    ye, yo = Fn(fn)(xe), ORTModule(Fn(fn), DebugOptions(capture="export"))(xo)
    torch.testing.assert_close(yo, ye, rtol=1e-10, atol=1e-12)
    g = torch.randn(ye.shape, dtype=torch.float64)
    ye.backward(g)
    yo.backward(g)
    torch.testing.assert_close(xo.grad, xe.grad, rtol=1e-10, atol=1e-12)
