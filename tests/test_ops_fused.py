"""The fused ops of csrc/ops/fused.c and csrc/ops/attention.c (domain "ortmod"), run
directly: float32 parity against numpy references and float64 finite-difference checks
of their gradients (which run the fused backward ops)."""
import math

import numpy as np
import pytest

from oputil import check_op

rng = np.random.default_rng(0)


def rnd(*shape, scale=1.0):
    return rng.standard_normal(shape) * scale


def gelu(x, approximate="none"):
    if approximate == "tanh":
        return 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x ** 3)))
    erf = np.vectorize(math.erf)
    return 0.5 * x * (1 + erf(x / math.sqrt(2)))


@pytest.mark.parametrize("xshape,transB,bshape", [((5, 4), 0, (6,)), ((2, 3, 4), 1, (6,)), ((4,), 0, (6,)),
                                                  ((2, 3, 4), 0, (1,))])
def test_matmul_bias(xshape, transB, bshape):
    w = rnd(6, 4) if transB else rnd(4, 6)
    check_op("MatMulBias", {"x": rnd(*xshape), "w": w, "b": rnd(*bshape)},
             lambda x, w, b: x @ (w.T if transB else w) + b, attrs={"transB": transB} if transB else {},
             grad=["x", "w", "b"], domain="ortmod")


def test_matmul_bias_rejects_a_non_column_bias():
    with pytest.raises(Exception, match="bias"):
        check_op("MatMulBias", {"x": rnd(5, 4), "w": rnd(4, 6), "b": rnd(5)}, None, domain="ortmod")


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_bias_gelu(approximate):
    check_op("BiasGelu", {"x": rnd(2, 3, 8, scale=2), "b": rnd(8)}, lambda x, b: gelu(x + b, approximate),
             attrs={"approximate": approximate}, grad=["x", "b"], domain="ortmod")


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("xshape,transB,bshape", [((5, 4), 0, (6,)), ((2, 3, 4), 1, (6,)), ((2, 3, 4), 0, (1,))])
def test_matmul_bias_gelu(approximate, xshape, transB, bshape):
    w = rnd(6, 4) if transB else rnd(4, 6)
    attrs = {"approximate": approximate}
    if transB:
        attrs["transB"] = 1
    check_op("MatMulBiasGelu", {"x": rnd(*xshape), "w": w, "b": rnd(*bshape)},
             lambda x, w, b: gelu(x @ (w.T if transB else w) + b, approximate), attrs=attrs,
             grad=["x", "w", "b"], domain="ortmod")


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("cols,bias", [(5, 5), (1100, 1100), (1100, 1)])
def test_matmul_bias_gelu_with_preactivation_output(approximate, cols, bias):
    """z = xW + b as a second output: its value, and its own gradient added to the GELU's
    (1100 columns: the float32 rows run in two chunks; a one-value bias is spread per chunk)."""
    def ref(x, w, b):
        z = x @ w + b
        return gelu(z, approximate), z
    check_op("MatMulBiasGelu", {"x": rnd(3, 4), "w": rnd(4, cols), "b": rnd(bias)}, ref,
             attrs={"approximate": approximate}, grad=["x", "w", "b"], domain="ortmod", n_outputs=2)


def test_matmul_bias_gelu_rejects_an_unknown_approximation():
    with pytest.raises(Exception, match="approximate"):
        check_op("MatMulBiasGelu", {"x": rnd(3, 4), "w": rnd(4, 5), "b": rnd(5)}, None,
                 attrs={"approximate": "fast"}, domain="ortmod")


@pytest.mark.parametrize("bias,residual", [(True, True), (False, True), (True, False)])
def test_bias_dropout_ratio0(bias, residual):
    inputs = {"x": rnd(3, 8), "b": rnd(8) if bias else None, "r": rnd(3, 8) if residual else None,
              "ratio": np.array(0.0, np.float32), "training_mode": np.array(True)}

    def ref(x, b, r, ratio, training_mode):
        return x + (b if b is not None else 0) + (r if r is not None else 0)

    check_op("BiasDropout", inputs, ref, grad=[n for n in ("x", "b", "r") if inputs[n] is not None],
             domain="ortmod", const_inputs=["ratio", "training_mode"])


def test_bias_dropout_residual_broadcast():
    check_op("BiasDropout", {"x": rnd(2, 3, 8), "b": rnd(8), "r": rnd(1, 3, 8)}, lambda x, b, r: x + b + r,
             grad=["x", "b", "r"], domain="ortmod")


def test_bias_dropout_inference_is_identity_with_ratio():
    check_op("BiasDropout", {"x": rnd(3, 8), "b": rnd(8), "r": rnd(3, 8), "ratio": np.array(0.5, np.float32)},
             lambda x, b, r, ratio: x + b + r, grad=["x", "b"], domain="ortmod", const_inputs=["ratio"])


def test_simplified_layer_norm():
    def ref(x, s):
        return x / np.sqrt((x ** 2).mean(-1, keepdims=True) + 1e-5) * s

    check_op("SimplifiedLayerNormalization", {"x": rnd(2, 3, 8), "s": rnd(8)}, ref, attrs={"epsilon": 1e-5},
             grad=["x", "s"], domain="ortmod")


# ---- FusedAttention ------------------------------------------------------------------------

def attn_ref(q, k, v, mask=None, scale=1.0, causal=False, kt=False, nan_to_zero=False):
    kk = k if kt else np.swapaxes(k, -1, -2)
    s = (q @ kk) * scale
    if mask is not None:
        s = s + mask
    if causal:
        s = np.where(np.tril(np.ones(s.shape[-2:], dtype=bool)), s, -np.inf)
    m = s.max(-1, keepdims=True)
    with np.errstate(invalid="ignore"):
        p = np.exp(s - m)
        p = p / p.sum(-1, keepdims=True)
    if nan_to_zero:
        p = np.where(np.isnan(p), 0, p)
    return p @ v


@pytest.mark.parametrize("L,S", [(5, 7), (7, 5), (1, 3)])
@pytest.mark.parametrize("causal", [False, True])
def test_fused_attention(L, S, causal):
    q, k, v = rnd(2, 2, L, 4), rnd(2, 2, S, 4), rnd(2, 2, S, 3)
    check_op("FusedAttention", {"q": q, "k": k, "v": v}, lambda q, k, v: attn_ref(q, k, v, None, 0.5, causal),
             attrs={"scale": 0.5, "causal": int(causal)}, grad=["q", "k", "v"], domain="ortmod")


def test_fused_attention_mask_grad_and_broadcast_batch():
    # K and V shared over heads (broadcast batch), mask broadcast over heads: gradients sum
    q, k, v, mask = rnd(2, 3, 4, 4), rnd(2, 1, 6, 4), rnd(2, 1, 6, 2), rnd(2, 1, 4, 6)
    check_op("FusedAttention", {"q": q, "k": k, "v": v, "mask": mask}, lambda q, k, v, mask: attn_ref(q, k, v, mask),
             grad=["q", "k", "v", "mask"], domain="ortmod")


def test_fused_attention_k_transposed_and_scale_factors():
    q, kt, v = rnd(2, 4, 4), rnd(2, 4, 6), rnd(2, 6, 3)
    inputs = {"q": q, "k": kt, "v": v, "mask": None, "f0": np.array(2.0), "f1": np.array(4.0)}
    # scale = 1 * f0 / f1 (bit 1 of inv: f1 divides)
    check_op("FusedAttention", inputs, lambda q, k, v, mask, f0, f1: attn_ref(q, k, v, None, 0.5, kt=True),
             attrs={"k_transposed": 1, "inv": 2}, grad=["q", "k", "v"], domain="ortmod", const_inputs=["f0", "f1"])


def test_fused_attention_many_key_tiles():
    q, k, v = rnd(1, 70, 4), rnd(1, 300, 4), rnd(1, 300, 2)
    check_op("FusedAttention", {"q": q, "k": k, "v": v}, lambda q, k, v: attn_ref(q, k, v, None, 0.7, causal=True),
             attrs={"scale": 0.7, "causal": 1}, domain="ortmod", rtol=1e-4, atol=1e-5)
    q, k, v = rnd(1, 3, 2), rnd(1, 140, 2), rnd(1, 140, 2)
    check_op("FusedAttention", {"q": q, "k": k, "v": v}, lambda q, k, v: attn_ref(q, k, v), grad=["q", "k", "v"],
             domain="ortmod")


def test_fused_attention_nan_to_zero_fully_masked_row():
    q, k, v = rnd(1, 3, 4), rnd(1, 5, 4), rnd(1, 5, 2)
    mask = np.zeros((1, 3, 5))
    mask[0, 1, :] = -np.inf
    out = check_op("FusedAttention", {"q": q, "k": k, "v": v, "mask": mask},
                   lambda q, k, v, mask: attn_ref(q, k, v, mask, nan_to_zero=True), attrs={"nan_to_zero": 1},
                   grad=["q", "k", "v"], domain="ortmod")
    assert np.all(out[0][0, 1] == 0)


def test_fused_attention_rejects_non_broadcasting_mask():
    with pytest.raises(Exception, match="mask"):
        check_op("FusedAttention", {"q": rnd(1, 3, 4), "k": rnd(1, 5, 4), "v": rnd(1, 5, 2), "mask": rnd(1, 4, 5)},
                 None, domain="ortmod")


# Q, K, V shapes that csrc/ops/attention_geom.h (shared by attention.c and cuda/attention.cu)
# refuses, each with the message that names the problem
@pytest.mark.parametrize("q,k,v,match", [
    ((4,), (1, 5, 4), (1, 5, 2), r"Q, K and V must have rank >= 2, got \[4\] float32"),
    ((1, 3, 4), (1, 5, 3), (1, 5, 2), r"Q and K differ in the head dim; K is \[1, 5, 3\]"),
    ((1, 3, 4), (1, 5, 4), (1, 6, 2), r"V must have S rows, got \[1, 6, 2\]"),
    ((2, 3, 4), (3, 5, 4), (3, 5, 2), r"batch dims do not broadcast: \[3, 5, 4\]"),
    ((2, 3, 4), (2, 5, 4), (3, 2, 5, 2), r"V has more batch dims than the scores: \[3, 2, 5, 2\]"),
    ((2, 2, 3, 4), (2, 1, 5, 4), (2, 3, 5, 2), r"batch dims do not broadcast; V is \[2, 3, 5, 2\]"),
])
def test_fused_attention_refuses_bad_shapes_by_name(q, k, v, match):
    with pytest.raises(Exception, match=r"FusedAttention node '[^']*': " + match):
        check_op("FusedAttention", {"q": rnd(*q), "k": rnd(*k), "v": rnd(*v)}, None, domain="ortmod")
