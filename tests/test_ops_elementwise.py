"""Elementwise ops (ops/elementwise.c): float32 parity against numpy / PyTorch (used only as
the reference) and float64 finite-difference checks of the engine's gradients, including
the broadcasting forms and the backward-only helpers (ReluGrad, GeluGrad, ...)."""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from oputil import check_op, make_model, run

RNG = np.random.default_rng(4321)


def randn(*shape):
    return np.asarray(RNG.standard_normal(shape)).astype(np.float32)


def away_from_zero(a, margin=0.2):
    """Values at least margin from 0 (no kink or pole inside the finite-difference step)."""
    return (np.sign(a) * (np.abs(a) + margin)).astype(a.dtype)


def positive(*shape):
    return (np.abs(randn(*shape)) + 0.5).astype(np.float32)


def T(a):
    return torch.from_numpy(np.ascontiguousarray(a))


# ---- binary ops with broadcasting -------------------------------------------------------

BROADCAST_SHAPES = [
    ((2, 3, 4), (2, 3, 4)),   # same shape
    ((2, 3, 4), (4,)),        # trailing contiguous block
    ((2, 1, 4), (3, 1)),      # both sides broadcast
    ((2, 3), ()),             # scalar right
    ((), (3,)),               # scalar left
    ((4, 1), (1, 5)),         # outer product
]

BINARY = {
    "Add": np.add,
    "Sub": np.subtract,
    "Mul": np.multiply,
    "Div": np.divide,
    "Max": np.maximum,
    "Min": np.minimum,
}


@pytest.mark.parametrize("sa,sb", BROADCAST_SHAPES)
@pytest.mark.parametrize("op", list(BINARY))
def test_binary_float(op, sa, sb):
    A, B = randn(*sa), randn(*sb)
    if op == "Div":
        B = away_from_zero(B, 0.5)
    if op in ("Max", "Min"):
        B = B + 0.05   # no ties between A and B
    check_op(op, {"A": A, "B": B}, lambda A, B: BINARY[op](A, B), grad=["A", "B"])


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "Max", "Min"])
def test_binary_int(op, dtype):
    A = RNG.integers(-20, 20, (3, 4)).astype(dtype)
    B = RNG.integers(1, 7, (4,)).astype(dtype) * np.array([1, -1, 1, -1], dtype)
    ref = {"Div": lambda A, B: np.trunc(A / B).astype(dtype)}.get(op, lambda A, B: BINARY[op](A, B))
    outs = check_op(op, {"A": A, "B": B}, ref)
    assert outs[0].dtype == dtype


def test_int_shape_glue_constant_folded():
    """int64 shape arithmetic with constant inputs (folded at plan time)."""
    A = np.array([2, 3, 8], np.int64)
    B = np.array([1, 1, 2], np.int64)
    check_op("Div", {"A": A, "B": B}, lambda A, B: A // B, const_inputs=["A", "B"])
    check_op("Mul", {"A": A, "B": B}, lambda A, B: A * B, const_inputs=["B"])


def test_int_div_by_zero_is_an_error():
    A = np.array([1, 2], np.int64)
    B = np.array([1, 0], np.int64)
    with pytest.raises(Exception, match="division by zero"):
        check_op("Div", {"A": A, "B": B})


def test_broadcast_mismatch_is_an_error():
    with pytest.raises(Exception, match="broadcast"):
        check_op("Add", {"A": randn(2, 3), "B": randn(4)})


@pytest.mark.parametrize("sa,sb", BROADCAST_SHAPES)
def test_pow(sa, sb):
    A, B = positive(*sa), randn(*sb)
    check_op("Pow", {"X": A, "Y": B}, lambda X, Y: np.power(X, Y), grad=["X", "Y"], rtol=2e-4)


@pytest.mark.parametrize("e", [2.0, 0.5, 3.0, 1.0, -1.5])
def test_pow_scalar_exponent(e):
    """Constant scalar exponents take the fast paths (x*x, sqrt, ...)."""
    X = positive(3, 5)
    check_op("Pow", {"X": X, "Y": np.array(e, np.float32)}, lambda X, Y: np.power(X, Y), grad=["X"],
             const_inputs=["Y"])


def test_pow_int_exponent():
    X = randn(3, 4)
    check_op("Pow", {"X": X, "Y": np.array(3, np.int64)}, lambda X, Y: X ** 3, grad=["X"], const_inputs=["Y"])


@pytest.mark.parametrize("sa,sb", [((2, 3, 4), (4,)), ((2, 1, 4), (3, 1)), ((3,), ())])
@pytest.mark.parametrize("dtype", [np.float32, np.int64, np.bool_])
def test_equal(sa, sb, dtype):
    A = RNG.integers(0, 3, sa).astype(dtype)
    B = RNG.integers(0, 3, sb).astype(dtype)
    outs = check_op("Equal", {"A": A, "B": B}, lambda A, B: np.equal(A, B))
    assert outs[0].dtype == np.bool_


@pytest.mark.parametrize("sc,sx,sy", [((2, 3), (2, 3), (2, 3)), ((3,), (2, 3), ()), ((2, 1), (1, 3), (2, 3)),
                                      ((4, 1, 5), (3, 1), (5,))])
def test_where(sc, sx, sy):
    C = RNG.random(sc) > 0.5
    check_op("Where", {"C": C, "X": randn(*sx), "Y": randn(*sy)}, lambda C, X, Y: np.where(C, X, Y),
             grad=["X", "Y"])


def test_where_int64():
    C = np.array([True, False, True])
    X = np.array([1, 2, 3], np.int64)
    Y = np.array([-1], np.int64)
    check_op("Where", {"C": C, "X": X, "Y": Y}, lambda C, X, Y: np.where(C, X, Y))


# ---- unary ops -----------------------------------------------------------------------------

def _t(fn):
    return lambda X: fn(T(X)).numpy()


UNARY = [
    # name, reference, input maker
    ("Neg", np.negative, lambda: randn(3, 4)),
    ("Relu", _t(torch.relu), lambda: away_from_zero(randn(3, 4))),
    ("Tanh", np.tanh, lambda: randn(3, 4)),
    ("Sigmoid", _t(torch.sigmoid), lambda: randn(3, 4) * 3),
    ("Erf", _t(torch.erf), lambda: randn(3, 4)),
    ("Sqrt", np.sqrt, lambda: positive(3, 4)),
    ("Exp", np.exp, lambda: randn(3, 4)),
    ("Log", np.log, lambda: positive(3, 4)),
    ("Reciprocal", np.reciprocal, lambda: away_from_zero(randn(3, 4), 0.5)),
    ("Abs", np.abs, lambda: away_from_zero(randn(3, 4))),
    ("Identity", lambda X: X, lambda: randn(2, 3, 4)),
    ("Sin", np.sin, lambda: randn(3, 4) * 3),
    ("Cos", np.cos, lambda: randn(3, 4) * 3),
    ("Sign", np.sign, lambda: away_from_zero(randn(3, 4))),
]


@pytest.mark.parametrize("name,ref,make", UNARY, ids=[u[0] for u in UNARY])
def test_unary(name, ref, make):
    check_op(name, {"X": make()}, lambda X: ref(X), grad=["X"])


def test_unary_scalar_and_empty():
    check_op("Exp", {"X": np.array(0.5, np.float32)}, lambda X: np.exp(X), grad=["X"])
    check_op("Tanh", {"X": np.zeros((0, 3), np.float32)}, lambda X: np.tanh(X))


def test_sigmoid_extremes():
    X = np.array([-200.0, -50.0, -1.0, 0.0, 1.0, 50.0, 200.0], np.float32)
    check_op("Sigmoid", {"X": X}, _t(torch.sigmoid), atol=0)


@pytest.mark.parametrize("x_shape,slope_shape", [((3, 4), (1,)), ((2, 3, 5), (3, 1)), ((2, 3, 2, 2), (3, 1, 1))])
def test_prelu(x_shape, slope_shape):
    x = away_from_zero(randn(*x_shape))
    slope = np.abs(randn(*slope_shape)) * 0.5
    check_op("PRelu", {"x": x, "slope": slope},
             lambda x, slope: F.prelu(torch.from_numpy(x), torch.from_numpy(slope).reshape(-1)).numpy(),
             grad=["x", "slope"])


def test_sign_of_zero_and_nan_and_its_zero_gradient():
    X = np.array([-2.0, 0.0, 3.0, np.nan], np.float32)
    check_op("Sign", {"X": X}, lambda X: torch.sign(torch.from_numpy(X)).numpy())   # torch: sign(NaN) = 0
    # torch's sign has gradient 0 everywhere: a tensor of zeros, not "no gradient"
    from oputil import make_model
    model = make_model("Sign", {"X": X[:3].astype(np.float64)}, None, "", 20, 1, ())
    _, grads, _ = run(model, [X[:3].astype(np.float64)], grad=[True])
    assert grads[0] is not None and np.all(grads[0] == 0)


@pytest.mark.parametrize("name,fn", [("Floor", torch.floor), ("Ceil", torch.ceil), ("Round", torch.round)])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_floor_ceil_round_like_torch_with_zero_gradient(name, fn, dtype):
    """Round takes halves to even (ONNX and torch.round); NaN, infinities and -0 pass through; the
    gradient is 0 everywhere, a tensor of zeros, as torch's."""
    X = np.array([-2.5, -1.5, -0.5, -0.0, 0.5, 1.5, 2.5, 0.49999997, -3.7, 3.7, 1e20, np.inf, -np.inf, np.nan],
                 dtype)
    check_op(name, {"X": X}, lambda X: fn(torch.from_numpy(X)).numpy(), atol=0)
    from oputil import make_model
    x = X[:10].astype(np.float64)
    _, grads, _ = run(make_model(name, {"X": x}, None, "", 20, 1, ()), [x], grad=[True])
    assert grads[0] is not None and np.all(grads[0] == 0)


@pytest.mark.parametrize("fmod", [0, 1])
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_mod_int(fmod, dtype):
    A = RNG.integers(-20, 20, (3, 4)).astype(dtype)
    B = (RNG.integers(1, 7, (4,)) * np.array([1, -1, 1, -1])).astype(dtype)
    ref = np.fmod if fmod else np.mod     # C's sign of the dividend / Python's sign of the divisor
    outs = check_op("Mod", {"A": A, "B": B}, lambda A, B: ref(A, B), attrs={"fmod": fmod})
    assert outs[0].dtype == dtype


@pytest.mark.parametrize("fmod", [0, 1])
def test_mod_float_and_its_gradient(fmod):
    A = randn(3, 4) * 5
    B = away_from_zero(randn(4), 0.7)
    ref = np.fmod if fmod else np.mod
    check_op("Mod", {"A": A, "B": B}, lambda A, B: ref(A, B), attrs={"fmod": fmod}, grad=["A"], const_inputs=["B"])


def test_mod_divisor_gradient_is_refused():
    with pytest.raises(Exception, match="divisor"):
        check_op("Mod", {"A": randn(3), "B": away_from_zero(randn(3), 0.7)}, attrs={"fmod": 1}, grad=["A", "B"])


def test_mod_by_zero_is_an_error():
    with pytest.raises(Exception, match="division by zero"):
        check_op("Mod", {"A": np.array([3, 4], np.int64), "B": np.array([2, 0], np.int64)})


@pytest.mark.parametrize("dtype", [np.int64, np.int32])
@pytest.mark.parametrize("name,ref", [("Neg", np.negative), ("Abs", np.abs), ("Relu", lambda X: np.maximum(X, 0)),
                                      ("Sign", np.sign)])
def test_unary_int(name, ref, dtype):
    X = RNG.integers(-9, 9, (3, 4)).astype(dtype)
    check_op(name, {"X": X}, lambda X: ref(X))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate):
    X = randn(4, 6) * 2
    check_op("Gelu", {"X": X}, lambda X: F.gelu(T(X), approximate=approximate).numpy(),
             attrs={"approximate": approximate}, grad=["X"])


def test_gelu_default_is_exact():
    X = randn(5)
    check_op("Gelu", {"X": X}, lambda X: F.gelu(T(X)).numpy(), grad=["X"])


def test_gelu_bad_attribute():
    with pytest.raises(Exception, match="approximate"):
        check_op("Gelu", {"X": randn(3)}, attrs={"approximate": "fast"})


# ---- backward-only helpers: parity against autograd -----------------------------------------

def _autograd(fn, x, dy):
    xt = T(x.astype(np.float64)).requires_grad_()
    fn(xt).backward(T(dy.astype(np.float64)))
    return xt.grad.numpy()


def test_relu_grad():
    dy, y = randn(3, 4), np.maximum(randn(3, 4), 0)
    check_op("ReluGrad", {"dY": dy, "Y": y}, lambda dY, Y: dY * (Y > 0), domain="ortmod")


def test_tanh_grad():
    dy, y = randn(3, 4), np.tanh(randn(3, 4))
    check_op("TanhGrad", {"dY": dy, "Y": y}, lambda dY, Y: dY * (1 - Y * Y), domain="ortmod")


def test_sigmoid_grad():
    dy, y = randn(3, 4), 1 / (1 + np.exp(-randn(3, 4)))
    check_op("SigmoidGrad", {"dY": dy, "Y": y.astype(np.float32)}, lambda dY, Y: dY * Y * (1 - Y),
             domain="ortmod")


def test_abs_grad():
    dy, x = randn(3, 4), randn(3, 4)
    check_op("AbsGrad", {"dY": dy, "X": x}, lambda dY, X: dY * np.sign(X), domain="ortmod")


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu_grad(approximate):
    dy, x = randn(4, 5), randn(4, 5) * 2
    check_op("GeluGrad", {"dY": dy, "X": x},
             lambda dY, X: _autograd(lambda t: F.gelu(t, approximate=approximate), X, dY),
             attrs={"approximate": approximate}, domain="ortmod")


# ---- Cast ------------------------------------------------------------------------------------

CAST_CASES = [
    # (input, to, numpy dtype of the result)
    (lambda: randn(3, 4) * 10, 7, np.int64),           # float -> int64 truncates
    (lambda: randn(3, 4) * 10, 6, np.int32),
    (lambda: RNG.integers(-50, 50, (3, 4)), 1, np.float32),
    (lambda: RNG.integers(-50, 50, (3, 4)).astype(np.int32), 7, np.int64),
    (lambda: randn(3, 4).round(), 9, np.bool_),        # float -> bool: nonzero
    (lambda: RNG.random((3, 4)) > 0.5, 1, np.float32),
    (lambda: RNG.random((3, 4)) > 0.5, 7, np.int64),
    (lambda: randn(3, 4), 11, np.float64),
]


@pytest.mark.parametrize("make,to,npdt", CAST_CASES)
def test_cast(make, to, npdt):
    X = make()
    outs = check_op("Cast", {"X": X}, lambda X: X.astype(npdt), attrs={"to": to})
    assert outs[0].dtype == npdt


def test_cast_float16_round_trip():
    """float32 -> float16 (round to nearest even) -> float32, against numpy."""
    X = np.concatenate([randn(64) * 1e-6, randn(64), randn(64) * 3e4]).astype(np.float32)
    X = np.clip(X, -65000, 65000)   # above 65520 both round to inf; numpy warns about it
    model = make_model("Cast", {"X": X}, {"to": 10})
    outs, _, _ = run(model, [X])
    np.testing.assert_array_equal(outs[0].view(np.uint16), X.astype(np.float16).view(np.uint16))


def test_cast_grad_float():
    """Between floats the gradient is cast back (float64 -> float64 here: the check runs in f64)."""
    check_op("Cast", {"X": randn(3, 4)}, lambda X: X.astype(np.float64), attrs={"to": 11}, grad=["X"])


def test_cast_grad_through_float32():
    """Cast(double -> float) in a float64 model: the backward Cast restores float64."""
    X = RNG.standard_normal((3, 4))
    model = make_model("Cast", {"X": X}, {"to": 1})
    outs, grads, dys = run(model, [X], grad=[True])
    assert outs[0].dtype == np.float32
    assert grads[0].dtype == np.float64
    np.testing.assert_allclose(grads[0], dys[0].astype(np.float64))


# ---- Dropout ---------------------------------------------------------------------------------

def test_dropout_ratio_zero_is_identity():
    X = randn(4, 5)
    ratio, train = np.array(0.0, np.float32), np.array(True)
    check_op("Dropout", {"X": X, "ratio": ratio, "training_mode": train}, lambda X, ratio, training_mode: X,
             const_inputs=["ratio", "training_mode"], grad=["X"], atol=0, rtol=0)


def test_dropout_inference_is_identity():
    X = randn(4, 5)
    check_op("Dropout", {"X": X, "ratio": np.array(0.5, np.float32)}, lambda X, ratio: X,
             const_inputs=["ratio"], grad=["X"], atol=0, rtol=0)
    check_op("Dropout", {"X": X, "ratio": np.array(0.5, np.float32), "training_mode": np.array(False)},
             lambda X, ratio, training_mode: X, const_inputs=["ratio", "training_mode"], grad=["X"])


def _dropout_model(X, n_outputs):
    inputs = {"X": X, "ratio": np.array(0.5, np.float32), "training_mode": np.array(True)}
    return make_model("Dropout", inputs, n_outputs=n_outputs, const_inputs=["ratio", "training_mode"])


def test_dropout_statistics_and_backward_mask():
    """p = 0.5: about half zeroed, kept values doubled, and backward applies the same mask."""
    X = (np.abs(randn(200, 100)) + 0.1).astype(np.float32)   # never exactly 0
    outs, grads, dys = run(_dropout_model(X, 2), [X], grad=[True])
    y, mask = outs
    assert mask.dtype == np.bool_ and mask.shape == X.shape
    frac = 1.0 - mask.mean()
    assert abs(frac - 0.5) < 0.02, frac
    np.testing.assert_array_equal(y == 0, ~mask)
    np.testing.assert_allclose(y[mask], X[mask] * 2, rtol=1e-6)
    np.testing.assert_allclose(grads[0], dys[0] * mask * 2, rtol=1e-6)


def test_dropout_backward_without_mask_output():
    """The model asks only for y; the gradient rule adds the mask output so it is saved."""
    X = (np.abs(randn(50, 40)) + 0.1).astype(np.float32)
    outs, grads, dys = run(_dropout_model(X, 1), [X], grad=[True])
    kept = outs[0] != 0
    assert 0.4 < kept.mean() < 0.6
    np.testing.assert_allclose(grads[0], dys[0] * kept * 2, rtol=1e-6)


def test_dropout_grad_op():
    dy = randn(6, 7)
    mask = RNG.random((6, 7)) > 0.3
    check_op("DropoutGrad", {"dY": dy, "mask": mask, "ratio": np.array(0.3, np.float32),
                             "training_mode": np.array(True)},
             lambda dY, mask, ratio, training_mode: dY * mask / np.float32(0.7),
             const_inputs=["ratio", "training_mode"], domain="ortmod")


# ---- SumToShape --------------------------------------------------------------------------------

SUM_TO = [
    ((2, 3, 4), (4,)),
    ((2, 3, 4), (3, 1)),
    ((2, 3, 4), (2, 1, 4)),
    ((2, 3, 4), ()),
    ((2, 3, 4), (2, 3, 4)),   # nothing broadcast: a copy
    ((2, 3, 4), (1, 1, 1)),
]


def _sum_to(x, shape):
    lead = x.ndim - len(shape)
    r = x.sum(axis=tuple(range(lead))) if lead > 0 else x
    axes = tuple(i for i, d in enumerate(shape) if d == 1 and r.shape[i] != 1)
    return (r.sum(axis=axes, keepdims=True) if axes else r).reshape(shape)


@pytest.mark.parametrize("sx,st", SUM_TO)
def test_sum_to_shape(sx, st):
    X = randn(*sx)
    check_op("SumToShape", {"X": X, "shape": np.array(st, np.int64)},
             lambda X, shape: _sum_to(X, st), const_inputs=["shape"], domain="ortmod", grad=["X"])


# Sizes that take om_sum_rows's paths (csrc/ops/rowsum.c) at any thread count: wide rows
# shared out by columns, narrow rows with a partial row per range, a middle unit axis.
ROW_SUMS = [((4096, 8), (8,)), ((3000, 3), (1, 3)), ((64, 4096), (4096,)), ((7, 1, 700), (1, 700)),
            ((3, 50, 130), (50, 130))]


@pytest.mark.parametrize("sx,st", ROW_SUMS)
@pytest.mark.parametrize("threads", [1, 2])
def test_sum_to_shape_over_leading_axes_on_the_pool(sx, st, threads):
    from ortmod import _C
    old = _C.get_num_threads()
    _C.set_num_threads(threads)
    try:
        for dt, tol in ((np.float32, 1e-4), (np.float64, 1e-12)):
            X = RNG.standard_normal(sx).astype(dt)
            mb = make_model("SumToShape", {"X": X, "shape": np.array(st, np.int64)}, const_inputs=["shape"],
                            domain="ortmod")
            (out,), _, _ = run(mb, [X])
            want = _sum_to(X.astype(np.float64), st)
            np.testing.assert_allclose(out, want, rtol=tol, atol=tol * np.sqrt(X.size / max(out.size, 1)))
    finally:
        _C.set_num_threads(old)


def test_sum_to_shape_int64():
    X = RNG.integers(-5, 5, (3, 4)).astype(np.int64)
    check_op("SumToShape", {"X": X, "shape": np.array([4], np.int64)}, lambda X, shape: X.sum(0),
             const_inputs=["shape"], domain="ortmod")


@pytest.mark.parametrize("sx,st", [((2, 3), (2,)), ((3, 4), (1, 1, 4))])
def test_sum_to_shape_bad_target(sx, st):
    with pytest.raises(Exception, match="SumToShape"):
        check_op("SumToShape", {"X": randn(*sx), "shape": np.array(st, np.int64)},
                 const_inputs=["shape"], domain="ortmod")
