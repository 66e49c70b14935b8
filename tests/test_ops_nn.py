"""MatMul, Gemm, FusedMatMul, Softmax, LogSoftmax, LayerNormalization, SoftmaxCrossEntropyLoss
and NegativeLogLikelihoodLoss: float32 parity against PyTorch (used only as the reference)
and float64 finite-difference checks of the engine's gradients."""
import os

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from oputil import _Cap, check_op, make_model, run

RNG = np.random.default_rng(1234)


def randn(*shape):
    return RNG.standard_normal(shape).astype(np.float32)


def T(a):
    return torch.from_numpy(np.ascontiguousarray(a))


# ---- MatMul ----------------------------------------------------------------------------

MATMUL_SHAPES = [
    ((3, 4), (4, 5)),
    ((2, 3, 4), (4, 5)),        # batch folds into M
    ((2, 3, 4), (2, 4, 5)),
    ((5,), (5, 3)),             # 1-D left operand
    ((2, 1, 3, 4), (3, 4, 2)),  # batch broadcast both ways
    ((3, 4), (4,)),             # 1-D right operand
    ((4,), (4,)),               # dot product
    ((3, 4), (2, 4, 5)),        # left operand broadcast over the batch
]


@pytest.mark.parametrize("sa,sb", MATMUL_SHAPES)
def test_matmul(sa, sb):
    check_op("MatMul", {"A": randn(*sa), "B": randn(*sb)},
             lambda A, B: torch.matmul(T(A), T(B)).numpy(), grad=["A", "B"])


@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("sa,sb", [((3, 4), (4, 5)), ((2, 3, 4), (4, 5)), ((2, 1, 3, 4), (3, 4, 2))])
def test_fused_matmul(sa, sb, ta, tb):
    A, B = randn(*sa), randn(*sb)
    if ta:
        A = np.ascontiguousarray(np.swapaxes(A, -1, -2))
    if tb:
        B = np.ascontiguousarray(np.swapaxes(B, -1, -2))

    def ref(A, B):
        a, b = T(A), T(B)
        a = a.transpose(-1, -2) if ta else a
        b = b.transpose(-1, -2) if tb else b
        return (0.5 * torch.matmul(a, b)).numpy()

    check_op("FusedMatMul", {"A": A, "B": B}, ref, attrs={"transA": ta, "transB": tb, "alpha": 0.5},
             domain="ortmod", grad=["A", "B"])


def test_matmul_shape_error():
    model = make_model("MatMul", {"A": randn(3, 4), "B": randn(5, 6)})
    with pytest.raises(Exception, match=r"\(3, 4\).*\(5, 6\)"):
        run(model, [randn(3, 4), randn(5, 6)])


# ---- Gemm ------------------------------------------------------------------------------

@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
@pytest.mark.parametrize("cshape", [None, (5,), (3, 5), (1, 5), (), (3, 1)])
def test_gemm(ta, tb, cshape):
    M, K, N = 3, 4, 5
    A = randn(K, M) if ta else randn(M, K)
    B = randn(N, K) if tb else randn(K, N)
    C = None if cshape is None else randn(*cshape)
    alpha, beta = 0.75, 1.5

    def ref(A, B, C):
        a = T(A).T if ta else T(A)
        b = T(B).T if tb else T(B)
        y = alpha * (a @ b)
        return (y if C is None else y + beta * T(C)).numpy()

    check_op("Gemm", {"A": A, "B": B, "C": C}, ref,
             attrs={"transA": ta, "transB": tb, "alpha": alpha, "beta": beta},
             grad=["A", "B"] + ([] if C is None else ["C"]))



def _engine_takes_float32_gemms():
    """ops/gemm_f32.c's rule: an AVX-512 CPU whose OpenBLAS loaded a kernel without AVX-512."""
    import ctypes
    with open("/proc/cpuinfo") as f:
        flags = f.read()
    try:
        lib = ctypes.CDLL("libopenblas.so.0")   # the one the engine loaded
        lib.openblas_get_corename.restype = ctypes.c_char_p
        core = lib.openblas_get_corename().decode().lower()
    except (OSError, AttributeError):
        return False
    return " avx512f" in flags and " avx512vl" in flags and core not in ("skylakex", "cooperlake", "sapphirerapids")


@pytest.mark.parametrize("M,N,K", [(2, 8, 1), (13, 33, 257), (12, 32, 256), (37, 100, 700), (300, 31, 40),
                                   (11, 1000, 3), (130, 70, 513)])
@pytest.mark.parametrize("ta,tb", [(0, 0), (1, 0), (0, 1), (1, 1)])
def test_float32_gemm_kernel_every_layout_and_edge(M, N, K, ta, tb):
    """om_gemm's float32 products, on the engine's AVX-512 kernel (ops/gemm_f32.c) where OpenBLAS was
    pinned to a narrower one (this machine: OPENBLAS_CORETYPE=Haswell), else on BLAS: tiles of 12 x 32
    over passes of 256 k, so sizes one either side of those edges, every transpose, alpha and
    beta; fp32-level agreement with fp64 (relative to |A||B|), and the same bits at one thread and
    at two (each element sums its k in a fixed order, however the tiles are shared out)."""
    from onnx import TensorProto, helper

    from ortmod import _C
    node = helper.make_node("Gemm", ["a", "b", "c"], ["y"], transA=ta, transB=tb, alpha=0.75, beta=0.5)
    g = helper.make_graph([node], "g", [helper.make_tensor_value_info(x, TensorProto.FLOAT, None) for x in "abc"],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    eng = _C.Engine(helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)]).SerializeToString(), None)
    a = randn(K, M) if ta else randn(M, K)
    b = randn(N, K) if tb else randn(K, N)
    c = randn(M, N)
    A, B = (a.T if ta else a).astype(np.float64), (b.T if tb else b).astype(np.float64)
    want = 0.75 * A @ B + 0.5 * c
    scale = 0.75 * np.abs(A) @ np.abs(B) + 0.5 * np.abs(c)
    ys = []
    try:
        for threads in (1, 2):
            _C.set_num_threads(threads)
            before = _C.gemm_f32_count()
            caps, _ = eng.forward([a, b, c], False)
            ys.append(np.from_dlpack(_Cap(caps[0])).copy())
            assert _C.gemm_f32_count() - before == (1 if _engine_takes_float32_gemms() else 0)
    finally:
        _C.set_num_threads(torch.get_num_threads())
    err = (np.abs(ys[0] - want) / scale).max()
    assert err < 4e-7 * max(1.0, K ** 0.5 / 4), err
    assert np.array_equal(ys[0], ys[1])


BLAS_ONLY = r"""
import ctypes, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from onnx import TensorProto, helper
from ortmod import _C
lib = ctypes.CDLL(_C.__file__)
lib.openblas_get_corename.restype = ctypes.c_char_p
g = helper.make_graph([helper.make_node("MatMul", ["a", "b"], ["y"])], "g",
                      [helper.make_tensor_value_info(x, TensorProto.FLOAT, None) for x in "ab"],
                      [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
eng = _C.Engine(helper.make_model(g, opset_imports=[helper.make_opsetid("", 20)]).SerializeToString(), None)
a, b = np.random.rand(64, 96).astype(np.float32), np.random.rand(96, 80).astype(np.float32)
counts = []
for blas_only in (0, 1, 0):
    ctypes.c_int.in_dll(lib, "om_gemm_blas_only").value = blas_only
    before = _C.gemm_f32_count()
    eng.forward([a, b], False)
    counts.append(_C.gemm_f32_count() - before)
print(lib.openblas_get_corename().decode(), counts)
"""


def test_bench_switch_sends_float32_gemms_to_blas():
    """bench_train.py --gemm blas sets om_gemm_blas_only: with OpenBLAS pinned to its AVX2 kernel on
    an AVX-512 CPU, where the engine's own kernel takes float32 products, they go to BLAS instead
    while it is set, and back to the engine's kernel when it is cleared."""
    import subprocess
    import sys
    with open("/proc/cpuinfo") as f:
        flags = f.read()
    if " avx512f" not in flags or " avx512vl" not in flags:
        pytest.skip("no AVX-512: every float32 product is BLAS's already")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    r = subprocess.run([sys.executable, "-c", BLAS_ONLY, root], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, OPENBLAS_CORETYPE="Haswell"))
    assert r.returncode == 0, r.stderr[-3000:]
    core, counts = r.stdout.strip().splitlines()[-1].split(" ", 1)
    assert core.lower() == "haswell" and counts == "[1, 0, 1]", r.stdout


# ---- Softmax / LogSoftmax -----------------------------------------------------------------

@pytest.mark.parametrize("op,fn", [("Softmax", torch.softmax), ("LogSoftmax", torch.log_softmax)])
@pytest.mark.parametrize("axis", [-1, 1, 0])
def test_softmax(op, fn, axis):
    X = randn(2, 3, 4) * 3
    check_op(op, {"X": X}, lambda X: fn(T(X), axis).numpy(), attrs={"axis": axis}, grad=["X"])


def test_softmax_extreme_values():
    X = np.array([[1000.0, 0.0, -1000.0], [-np.inf, 0.0, 1.0]], np.float32)
    check_op("Softmax", {"X": X}, lambda X: torch.softmax(T(X), -1).numpy())


# ---- LayerNormalization ------------------------------------------------------------------

@pytest.mark.parametrize("axis", [-1, -2])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm(axis, bias):
    X = randn(2, 3, 6) + 1.5
    nshape = X.shape[axis % 3:]
    S = randn(*nshape)
    Bv = randn(*nshape) if bias else None

    def ref(X, Scale, B):
        return F.layer_norm(T(X), nshape, T(Scale), None if B is None else T(B), eps=1e-5).numpy()

    check_op("LayerNormalization", {"X": X, "Scale": S, "B": Bv}, ref,
             attrs={"axis": axis, "epsilon": 1e-5}, grad=["X", "Scale"] + (["B"] if bias else []),
             grad_atol=1e-5)


def test_layer_norm_saved_stats():
    # Mean/InvStdDev outputs: values, and gradients that flow through them too
    X = randn(4, 5) * 2 + 1
    S, Bv = randn(5), randn(5)

    def ref(X, Scale, B):
        x = T(X).double()
        m = x.mean(-1, keepdim=True)
        inv = 1 / torch.sqrt(x.var(-1, unbiased=False, keepdim=True) + 1e-5)
        y = F.layer_norm(T(X), (5,), T(Scale), T(B), eps=1e-5)
        return y.numpy(), m.float().numpy(), inv.float().numpy()

    check_op("LayerNormalization", {"X": X, "Scale": S, "B": Bv}, ref, attrs={"epsilon": 1e-5},
             n_outputs=3, grad=["X", "Scale", "B"], grad_atol=1e-5)


# ---- SoftmaxCrossEntropyLoss / NegativeLogLikelihoodLoss -----------------------------------

def _labels(shape, C, ignore):
    lab = RNG.integers(0, C, shape).astype(np.int64)
    if ignore is not None:
        lab.reshape(-1)[::3] = ignore
    return lab


LOSS_CASES = [
    # scores shape, reduction, ignore_index, weights
    ((6, 5), "mean", None, False),
    ((6, 5), "sum", None, False),
    ((6, 5), "none", None, False),
    ((6, 5), "mean", 2, False),
    ((6, 5), "mean", -100, True),
    ((6, 5), "sum", 1, True),
    ((6, 5), "none", 3, True),
    ((3, 4, 2), "mean", None, False),
    ((3, 4, 2), "mean", 0, True),
    ((3, 4, 2), "sum", -1, True),
    ((2, 3, 2, 2), "none", 1, True),
]


def _loss_inputs(shape, ignore, weighted, first):
    N, C = shape[:2]
    return {first: randn(*shape), "labels": _labels((N,) + shape[2:], C, ignore),
            "weights": (np.abs(randn(C)) + 0.1) if weighted else None}


def _attrs(red, ignore):
    return {"reduction": red, **({} if ignore is None else {"ignore_index": ignore})}


@pytest.mark.parametrize("shape,red,ignore,weighted", LOSS_CASES)
def test_softmax_cross_entropy(shape, red, ignore, weighted):
    def ref(scores, labels, weights):
        return F.cross_entropy(T(scores), T(labels), weight=None if weights is None else T(weights),
                               reduction=red, ignore_index=-100 if ignore is None else ignore).numpy()

    check_op("SoftmaxCrossEntropyLoss", _loss_inputs(shape, ignore, weighted, "scores"), ref,
             attrs=_attrs(red, ignore), grad=["scores"])


@pytest.mark.parametrize("shape,red,ignore,weighted", [LOSS_CASES[0], LOSS_CASES[5], LOSS_CASES[9]])
def test_softmax_cross_entropy_log_prob(shape, red, ignore, weighted):
    # log_prob as a second output: its gradient adds to the loss's
    def ref(scores, labels, weights):
        loss = F.cross_entropy(T(scores), T(labels), weight=None if weights is None else T(weights),
                               reduction=red, ignore_index=-100 if ignore is None else ignore)
        return loss.numpy(), torch.log_softmax(T(scores), 1).numpy()

    check_op("SoftmaxCrossEntropyLoss", _loss_inputs(shape, ignore, weighted, "scores"), ref,
             attrs=_attrs(red, ignore), n_outputs=2, grad=["scores"])


@pytest.mark.parametrize("shape,red,ignore,weighted", LOSS_CASES)
def test_nll_loss(shape, red, ignore, weighted):
    inputs = _loss_inputs(shape, ignore, weighted, "input")
    inputs["input"] = torch.log_softmax(T(inputs["input"]), 1).numpy()

    def ref(input, labels, weights):
        return F.nll_loss(T(input), T(labels), weight=None if weights is None else T(weights),
                          reduction=red, ignore_index=-100 if ignore is None else ignore).numpy()

    check_op("NegativeLogLikelihoodLoss", inputs, ref, attrs=_attrs(red, ignore), grad=["input"])


def test_cross_entropy_all_ignored_is_nan():
    out = check_op("SoftmaxCrossEntropyLoss", {"scores": randn(3, 4), "labels": np.full(3, -1, np.int64)},
                   attrs={"ignore_index": -1})
    assert np.isnan(out[0])


@pytest.mark.parametrize("op", ["SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss"])
@pytest.mark.parametrize("bad", [4, -3])
def test_loss_label_out_of_range(op, bad):
    labels = np.array([0, bad, 1], np.int64)
    model = make_model(op, {"x": randn(3, 4), "labels": labels}, {"ignore_index": -100})
    with pytest.raises(Exception, match=rf"{op}.*label {bad}"):
        run(model, [randn(3, 4), labels])
