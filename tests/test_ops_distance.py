"""Distances and p-norms through ORTModule against eager autograd (ortmod/capture/rules/symbolics.py).

torch's TorchScript rules for these differ from eager: pairwise_distance puts eps in the
exponent, (sum (x1 - x2)^p)^(1 / (p + eps)), and takes no abs; cdist reuses that rule;
cosine_similarity goes through Sqrt (NaN gradient at a zero vector) and clamps the product of
the norms rather than each norm; the norm of an order other than 1, 2, inf has a NaN gradient
at a zero row; triplet_margin_loss has no rule beyond p 1, 2 without swap. ortmod's rules
decompose eager's formulas (Distance.cpp, Loss.cpp, norm_backward) into engine ops.

Everything in float64 against eager: forward, and gradients for a random output gradient,
at zero rows, zero elements, ties, broadcasting, keepdim and unbatched inputs; a finite-difference
gradcheck of the engine where the function is smooth; a TripletMarginLoss model trained with SGD.
"""
import math

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ortmod
from ortmod import ORTModule
from oputil import Fn

D = torch.float64


def _grads(xs):
    return [torch.zeros_like(x) if x.grad is None else x.grad for x in xs]


def check_against_eager(fn, *inputs, rtol=1e-10, atol=1e-12):
    """fn through ORTModule and eagerly, float64: outputs, then input gradients for one random
    output gradient (NaN where eager's is NaN). An output the engine does not differentiate
    (p = 0 counts) must have eager gradient 0."""
    xe = [x.clone().requires_grad_() for x in inputs]
    xo = [x.clone().requires_grad_() for x in inputs]
    ye, yo = fn(*xe), ORTModule(Fn(fn))(*xo)
    torch.testing.assert_close(yo, ye, rtol=rtol, atol=atol, equal_nan=True)
    dy = torch.randn(ye.shape, dtype=ye.dtype)
    ye.backward(dy)
    if not yo.requires_grad:
        for g in _grads(xe):
            assert not g.any(), "the engine gives no gradient where eager's is not zero"
        return
    yo.backward(dy)
    for k, (go, ge) in enumerate(zip(_grads(xo), _grads(xe))):
        assert not ge.isnan().any() or go.isnan().equal(ge.isnan()), f"input {k}: NaN gradients differ"
        torch.testing.assert_close(go, ge, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"input {k}: {m}")


def engine_gradcheck(fn, *inputs, h=1e-6, rtol=1e-6, atol=1e-8):
    """The engine's gradient against central finite differences of the engine's own forward
    (torch.autograd.gradcheck backwards one forward many times, which the stash does not allow)."""
    m = ORTModule(Fn(fn))
    xs = [x.clone().requires_grad_() for x in inputs]
    y = m(*xs)
    dy = torch.randn(y.shape, dtype=y.dtype)
    y.backward(dy)
    for k, x in enumerate(inputs):
        numeric = torch.zeros_like(x)
        for i in range(x.numel()):
            plus, minus = [v.clone() for v in inputs], [v.clone() for v in inputs]
            plus[k].view(-1)[i] += h
            minus[k].view(-1)[i] -= h
            with torch.no_grad():
                numeric.view(-1)[i] = ((m(*plus) - m(*minus)) * dy).sum() / (2 * h)
        torch.testing.assert_close(xs[k].grad, numeric, rtol=rtol, atol=atol, msg=lambda e: f"input {k}: {e}")


def _rows(*shape):
    return torch.randn(*shape, dtype=D)


def _with_zeros(x1, x2):
    """x1 with one row equal to x2's (a zero difference) and half of another row equal."""
    x1 = x1.clone()
    x1[1] = x2[1]
    x1[2, : x1.shape[1] // 2] = x2[2, : x1.shape[1] // 2]
    return x1


ORDERS = [2, 1, 3, 1.5, 0.5, 0, -1, -2.5, math.inf, -math.inf]


# ---- pairwise_distance --------------------------------------------------------------------

@pytest.mark.parametrize("p", ORDERS)
def test_pairwise_distance_orders(p):
    a, b = _rows(5, 6), _rows(5, 6)
    check_against_eager(lambda x, y: F.pairwise_distance(x, y, p=p), a, b)


@pytest.mark.parametrize("p", ORDERS)
def test_pairwise_distance_zero_differences(p):
    # eps=0: the zero row's norm is 0 (eager's subgradient there), and zero elements (|d|^(p-1))
    b = _rows(5, 6)
    check_against_eager(lambda x, y: F.pairwise_distance(x, y, p=p, eps=0.0), _with_zeros(_rows(5, 6), b), b)


@pytest.mark.parametrize("case", ["keepdim", "eps", "broadcast_row", "broadcast_vector", "unbatched",
                                  "batched_3d", "scalar", "module"])
def test_pairwise_distance_arguments(case):
    a, b = _rows(4, 6), _rows(4, 6)
    fn, inputs = {
        "keepdim": (lambda x, y: F.pairwise_distance(x, y, p=3, keepdim=True), (a, b)),
        "eps": (lambda x, y: F.pairwise_distance(x, y, p=3, eps=0.25), (a, b)),
        "broadcast_row": (lambda x, y: F.pairwise_distance(x, y, p=3), (a, _rows(1, 6))),
        "broadcast_vector": (lambda x, y: F.pairwise_distance(x, y, p=1), (a, _rows(6))),
        "unbatched": (lambda x, y: F.pairwise_distance(x, y, p=3), (_rows(6), _rows(6))),
        "batched_3d": (lambda x, y: F.pairwise_distance(x, y, p=math.inf), (_rows(2, 3, 6), _rows(2, 3, 6))),
        "scalar": (lambda x, y: F.pairwise_distance(x, y), (_rows(()), _rows(()))),
        "module": (nn.PairwiseDistance(p=1.5, eps=1e-3, keepdim=True), (a, b)),
    }[case]
    check_against_eager(fn, *inputs)


def test_pairwise_distance_is_not_torchs_rule():
    # the case the colleague found: eps in the exponent and no abs made odd p wrong
    a, b = _rows(4, 6), _rows(4, 6)
    y = ORTModule(Fn(lambda x, y: F.pairwise_distance(x, y, p=3)))(a, b)
    assert torch.isfinite(y).all()
    torch.testing.assert_close(y, (a - b + 1e-6).abs().pow(3).sum(-1).pow(1 / 3), rtol=1e-12, atol=0)


def test_pairwise_distance_gradcheck():
    # the engine's own gradient against finite differences of its own forward
    engine_gradcheck(lambda x, y: F.pairwise_distance(x, y, p=3), _rows(3, 4), _rows(3, 4))
    engine_gradcheck(lambda x, y: F.pairwise_distance(x, y, p=0.5, keepdim=True), _rows(3, 4), _rows(1, 4))


# ---- cosine_similarity --------------------------------------------------------------------

def _cos_inputs(kind):
    a, b = _rows(4, 6), _rows(4, 6)
    if kind == "zero_vector":
        a[1] = 0
    elif kind == "tiny_vector":      # 0 < norm < eps: eager's clamp is straight-through
        a[2] *= 1e-10
    elif kind == "both_zero":
        a[1], b[1] = 0, 0
    return a, b


@pytest.mark.parametrize("dim", [1, 0, -1])
@pytest.mark.parametrize("kind", ["random", "zero_vector", "tiny_vector", "both_zero"])
def test_cosine_similarity_matches_eager(kind, dim):
    check_against_eager(lambda x, y: F.cosine_similarity(x, y, dim=dim), *_cos_inputs(kind))


@pytest.mark.parametrize("case", ["eps", "broadcast_row", "broadcast_along_dim", "broadcast_vector",
                                  "unbatched", "batched_3d", "module"])
def test_cosine_similarity_arguments(case):
    a, b = _cos_inputs("tiny_vector")
    fn, inputs = {
        "eps": (lambda x, y: F.cosine_similarity(x, y, eps=0.5), (a, b)),
        "broadcast_row": (lambda x, y: F.cosine_similarity(x, y), (a, _rows(1, 6))),
        # eager expands first: the norm of a (4, 1) operand is over its 6 repeated copies
        "broadcast_along_dim": (lambda x, y: F.cosine_similarity(x, y), (a, _rows(4, 1))),
        "broadcast_vector": (lambda x, y: F.cosine_similarity(x, y), (a, _rows(6))),
        "unbatched": (lambda x, y: F.cosine_similarity(x, y, dim=0), (_rows(6), torch.zeros(6, dtype=D))),
        "batched_3d": (lambda x, y: F.cosine_similarity(x, y, dim=-2), (_rows(2, 3, 4), _rows(2, 3, 4))),
        "module": (nn.CosineSimilarity(dim=0), (a, b)),
    }[case]
    check_against_eager(fn, *inputs)


def test_cosine_similarity_zero_vector_gradient_is_finite():
    a, b = _cos_inputs("zero_vector")
    a.requires_grad_()
    ORTModule(Fn(lambda x, y: F.cosine_similarity(x, y)))(a, b).sum().backward()
    assert torch.isfinite(a.grad).all() and a.grad[1].abs().max() > 1e6   # x2 / (|x2| eps)


def test_cosine_similarity_float32():
    a, b = _cos_inputs("zero_vector")
    check_against_eager(lambda x, y: F.cosine_similarity(x, y), a.float(), b.float(), rtol=1e-5, atol=1e-6)


def test_cosine_similarity_gradcheck():
    engine_gradcheck(lambda x, y: F.cosine_similarity(x, y), _rows(3, 4), _rows(3, 4))
    engine_gradcheck(lambda x, y: F.cosine_similarity(x, y, dim=0), _rows(3, 4), _rows(3, 1))


def test_mixed_dtypes_are_refused_by_name():
    m = ORTModule(Fn(lambda x, y: F.cosine_similarity(x, y)))
    with pytest.raises(ortmod.UnsupportedModelError, match="cosine_similarity"):
        m(_rows(3, 4), _rows(3, 4).float())


# ---- p-norms of other orders ----------------------------------------------------------------

@pytest.mark.parametrize("p", [3, 0.5, -1, 1.5])
@pytest.mark.parametrize("which", ["vector_norm", "norm", "normalize", "linalg_norm"])
def test_norm_orders_at_zero_rows(which, p):
    # torch's rule: (sum |x|^p)^(1/p), whose gradient at a zero row is inf * 0 = NaN
    fn = {
        "vector_norm": lambda x: torch.linalg.vector_norm(x, p, dim=-1),
        "norm": lambda x: torch.norm(x, p=p, dim=-1, keepdim=True),
        "normalize": lambda x: F.normalize(x, p=p, dim=-1),
        "linalg_norm": lambda x: torch.linalg.norm(x, p, dim=-1),
    }[which]
    check_against_eager(fn, _with_zeros(_rows(4, 6), torch.zeros(4, 6, dtype=D)))


@pytest.mark.parametrize("case", ["all_dims_keepdim", "scalar", "dtype", "matrix_fro_zero", "linalg_norm_fro_zero",
                                  "linalg_norm_matrix_1", "norm_fro_dim"])
def test_norm_arguments(case):
    zero3 = torch.zeros(3, 3, dtype=D)
    fn, x = {
        "all_dims_keepdim": (lambda x: torch.linalg.vector_norm(x, 3, keepdim=True), _rows(3, 4)),
        "scalar": (lambda x: torch.linalg.vector_norm(x, 3), _rows(())),
        "dtype": (lambda x: torch.linalg.vector_norm(x.float(), 3, dim=1, dtype=D), _rows(3, 4)),
        "matrix_fro_zero": (lambda x: torch.linalg.matrix_norm(x), zero3),
        "linalg_norm_fro_zero": (lambda x: torch.linalg.norm(x, "fro"), zero3),
        "linalg_norm_matrix_1": (lambda x: torch.linalg.norm(x, 1), _rows(3, 3)),
        "norm_fro_dim": (lambda x: torch.norm(x, "fro", dim=1), _with_zeros(_rows(4, 6), torch.zeros(4, 6, dtype=D))),
    }[case]
    check_against_eager(fn, x, rtol=1e-6 if case == "dtype" else 1e-10)


# ---- cdist ----------------------------------------------------------------------------------

@pytest.mark.parametrize("p", [2, 1, 3, 1.5, 0.5, 0, math.inf])
def test_cdist_orders(p):
    check_against_eager(lambda x, y: torch.cdist(x, y, p=p), _rows(2, 3, 4), _rows(2, 5, 4))


def test_cdist_gradcheck():
    engine_gradcheck(lambda x, y: torch.cdist(x, y, p=3), _rows(2, 3), _rows(4, 3))


@pytest.mark.parametrize("case", ["inf_ties", "p3_coincident", "p_half_coincident", "p2_coincident",
                                  "mm_by_rows", "mm_forced", "mm_off", "unbatched_rows"])
def test_cdist_cases(case):
    t = torch.tensor([[1.0, 3.0, -3.0], [0.0, 2.0, 2.0]], dtype=D)
    fn, inputs = {
        # _cdist_backward gives every tie of the max the whole gradient (vector_norm shares it)
        "inf_ties": (lambda x, y: torch.cdist(x, y, p=math.inf), (t, torch.zeros(1, 3, dtype=D))),
        "p3_coincident": (lambda x, y: torch.cdist(x, y, p=3), (t, t.clone())),
        "p_half_coincident": (lambda x, y: torch.cdist(x, y, p=0.5), (t, t.clone())),
        "p2_coincident": (lambda x, y: torch.cdist(x, y), (t, t.clone())),
        # more than 25 rows: eager's matrix-product path (_euclidean_dist)
        "mm_by_rows": (lambda x, y: torch.cdist(x, y), (_rows(30, 4), _rows(7, 4))),
        "mm_forced": (lambda x, y: torch.cdist(x, y, compute_mode="use_mm_for_euclid_dist"), (_rows(3, 4), _rows(7, 4))),
        "mm_off": (lambda x, y: torch.cdist(x, y, compute_mode="donot_use_mm_for_euclid_dist"),
                   (_rows(30, 4), _rows(7, 4))),
        "unbatched_rows": (lambda x, y: torch.cdist(x, y, p=1.5), (_rows(3, 4), _rows(5, 4))),
    }[case]
    check_against_eager(fn, *inputs)


# ---- triplet_margin_loss --------------------------------------------------------------------

@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("p", [2, 1, 3, 0.5, math.inf])
def test_triplet_margin_loss(p, swap):
    a, pos, neg = _rows(5, 6), _rows(5, 6), _rows(5, 6)
    check_against_eager(lambda x, y, z: F.triplet_margin_loss(x, y, z, p=p, swap=swap), a, pos, neg)


def _dyadic_triplet():
    a = torch.randint(-8, 8, (5, 6), dtype=torch.float64) / 4
    neg = a - 0.5
    neg[:, -1] -= 1.0
    return a, a - 0.5, neg


@pytest.mark.parametrize("case", ["swap_tie", "none_margin_eps", "unbatched", "module_sum", "at_the_clamp"])
def test_triplet_margin_loss_arguments(case):
    a, pos, neg = _rows(5, 6), _rows(5, 6), _rows(5, 6)
    fn, inputs = {
        # anchor == positive: the swapped distance ties with the negative one (minimum shares dy)
        "swap_tie": (lambda x, y, z: F.triplet_margin_loss(x, y, z, swap=True, reduction="none"), (a, a.clone(), neg)),
        "none_margin_eps": (lambda x, y, z: F.triplet_margin_loss(x, y, z, margin=3.0, eps=0.1, reduction="none"),
                            (a, pos, neg)),
        "unbatched": (lambda x, y, z: F.triplet_margin_loss(x, y, z, p=3), (_rows(6), _rows(6), _rows(6))),
        "module_sum": (nn.TripletMarginLoss(margin=2.0, p=3, swap=True, reduction="sum"), (a, pos, neg)),
        # p=1 distances of 3 and 4 in exact dyadics, margin 1: every row's loss sits exactly at
        # clamp_min's bound, whose gradient there is eager's number kernel's (all of dy to 2.13,
        # none on 2.14)
        "at_the_clamp": (lambda x, y, z: F.triplet_margin_loss(x, y, z, margin=1.0, p=1, eps=0.0, reduction="none"),
                         _dyadic_triplet()),
    }[case]
    check_against_eager(fn, *inputs)


class TripletEmbedder(nn.Module):
    """An embedding net trained with a triplet loss of order 3 with the distance swap."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 6))
        self.loss = nn.TripletMarginLoss(margin=1.0, p=3, swap=True)

    def forward(self, anchor, positive, negative):
        return self.loss(self.net(anchor), self.net(positive), self.net(negative))


def test_triplet_margin_loss_sgd_parity():
    from modelparity import train_parity
    g = torch.Generator().manual_seed(3)
    batches = [tuple(torch.randn(12, 8, generator=g) for _ in range(3)) for _ in range(4)]
    _, _, losses = train_parity(TripletEmbedder, batches, lambda m, b: m(*b), steps=8, lr=0.05)
    assert losses[-1] < losses[0]


EXPORT_PATH = {
    "pairwise_distance_p2": (lambda x, y: F.pairwise_distance(x, y), (_rows(4, 6), _rows(4, 6))),
    "pairwise_distance_p3": (lambda x, y: F.pairwise_distance(x, y, p=3), (_rows(4, 6), _rows(4, 6))),
    # the decomposition's clamp_min has a gradient; ortmod's rule keeps eager's no_grad clamp
    "cosine_similarity_zero": (lambda x, y: F.cosine_similarity(x, y), _cos_inputs("zero_vector")),
    "cosine_similarity_tiny": (lambda x, y: F.cosine_similarity(x, y), _cos_inputs("tiny_vector")),
    "cosine_similarity_broadcast": (lambda x, y: F.cosine_similarity(x, y, eps=0.5), (_rows(4, 6) * 0.01, _rows(4, 1))),
    "triplet_p2": (lambda x, y, z: F.triplet_margin_loss(x, y, z), (_rows(4, 6), _rows(4, 6), _rows(4, 6))),
    "triplet_p3_swap": (lambda x, y, z: F.triplet_margin_loss(x, y, z, p=3, swap=True),
                        (_rows(4, 6), _rows(4, 6), _rows(4, 6))),
    "cdist": (lambda x, y: torch.cdist(x, y, p=1), (_rows(4, 6), _rows(3, 6))),
}


@pytest.mark.parametrize("name", sorted(EXPORT_PATH))
def test_export_capture_path_matches_eager_or_refuses_by_name(name):
    # the torch.export path: what it takes must match eager; what it has not reviewed it refuses by name
    from ortmod import DebugOptions
    for fn, inputs in [EXPORT_PATH[name]]:
        xe = [x.clone().requires_grad_() for x in inputs]
        xo = [x.clone().requires_grad_() for x in inputs]
        try:
            yo = ORTModule(Fn(fn), DebugOptions(capture="export"))(*xo)
        except ortmod.UnsupportedModelError as e:
            assert "not yet reviewed" in str(e) or "reviewed on this path" in str(e), str(e)
            continue
        ye = fn(*xe)
        torch.testing.assert_close(yo, ye, rtol=1e-10, atol=1e-12)
        dy = torch.randn(ye.shape, dtype=D)
        ye.backward(dy)
        yo.backward(dy)
        for go, ge in zip(_grads(xo), _grads(xe)):
            torch.testing.assert_close(go, ge, rtol=1e-8, atol=1e-12)


# ---- cosine_embedding_loss ------------------------------------------------------------------

@pytest.mark.parametrize("case", ["mean", "zero_vector", "margin_none", "sum_float_target", "target_zero",
                                  "unbatched", "tie_at_margin", "module"])
def test_cosine_embedding_loss(case):
    # torch's exporter has no rule; ortmod's is Loss.cpp's formula (its EPSILON a float32 1e-12)
    a, b = _rows(4, 6), _rows(4, 6)
    t = torch.tensor([1, -1, 1, -1])
    zero = a.clone()
    zero[1] = 0
    fn, inputs = {
        "mean": (lambda x, y: F.cosine_embedding_loss(x, y, t), (a, b)),
        "zero_vector": (lambda x, y: F.cosine_embedding_loss(x, y, torch.tensor([1, 1, -1, -1])), (zero, b)),
        "margin_none": (lambda x, y: F.cosine_embedding_loss(x, y, t, margin=-0.2, reduction="none"), (a, b)),
        "sum_float_target": (lambda x, y: F.cosine_embedding_loss(x, y, t.double(), reduction="sum"), (a, b)),
        "target_zero": (lambda x, y: F.cosine_embedding_loss(x, y, torch.tensor([1, 0, -1, 0]), reduction="none"),
                        (a, b)),
        "unbatched": (lambda x, y: F.cosine_embedding_loss(x, y, torch.tensor(-1)), (_rows(6), _rows(6))),
        "tie_at_margin": (lambda x, y: F.cosine_embedding_loss(x, y, -torch.ones(4, dtype=torch.long), margin=0.5,
                                                              reduction="none"), (a, a * 0.5 + b * 0.1)),
        "module": (lambda x, y: nn.CosineEmbeddingLoss(margin=0.3)(x, y, t), (a, b)),
    }[case]
    check_against_eager(fn, *inputs)


# ---- torch.dist, triplet_margin_with_distance_loss ----------------------------------------

@pytest.mark.parametrize("p", [2, 1, 3, 0.5, math.inf, -math.inf])
@pytest.mark.parametrize("case", ["random", "equal", "broadcast", "scalar"])
def test_dist(case, p):
    # torch's exporter has no rule for aten::dist (p = 2 came through another path)
    a = _rows(4, 6)
    x, y = {"random": (a, _rows(4, 6)), "equal": (a, a.clone()), "broadcast": (a, _rows(1, 6)),
            "scalar": (_rows(()), _rows(()))}[case]
    check_against_eager(lambda u, v: torch.dist(u, v, p), x, y)


def test_triplet_margin_with_distance_loss():
    a, pos, neg = _rows(4, 6), _rows(4, 6), _rows(4, 6)
    a[1] = 0
    check_against_eager(lambda x, y, z: F.triplet_margin_with_distance_loss(x, y, z), a, pos, neg)
    check_against_eager(lambda x, y, z: F.triplet_margin_with_distance_loss(
        x, y, z, distance_function=lambda u, v: 1 - F.cosine_similarity(u, v), swap=True), a, pos, neg)


# ---- non-finite inputs ----------------------------------------------------------------------

def _non_finite():
    x = _rows(4, 6)
    x[0, 1], x[2, 0], x[1, 2] = math.inf, -math.inf, math.nan
    return x


@pytest.mark.parametrize("name", ["pairwise_p2", "pairwise_p1", "pairwise_p3", "pairwise_half", "pairwise_inf",
                                  "cosine", "vector_norm_3", "cdist_p2", "cdist_p3", "cdist_inf_no_nan_no_inf"])
def test_non_finite_inputs(name):
    # NaN and infinities where eager has them, forward and backward. Not here (they differ):
    # cdist p = inf, whose eager max over a row skips a NaN (ortmod's is NaN) and whose gradient
    # at an infinite element is NaN (ortmod's 0); cdist p = 1's gradient at a NaN element (eager
    # NaN, ortmod's sign(NaN) 0); cdist's matrix-product path, where the NaN of an infinite input
    # spreads differently through eager's _euclidean_dist_backward and the engine's MatMul
    # gradient
    fn = {
        "pairwise_p2": lambda x, y: F.pairwise_distance(x, y),
        "pairwise_p1": lambda x, y: F.pairwise_distance(x, y, p=1),
        "pairwise_p3": lambda x, y: F.pairwise_distance(x, y, p=3),
        "pairwise_half": lambda x, y: F.pairwise_distance(x, y, p=0.5),
        "pairwise_inf": lambda x, y: F.pairwise_distance(x, y, p=math.inf),
        "cosine": lambda x, y: F.cosine_similarity(x, y),
        "vector_norm_3": lambda x, y: torch.linalg.vector_norm(x - y, 3, dim=1),
        "cdist_p2": lambda x, y: torch.cdist(x, y),
        "cdist_p3": lambda x, y: torch.cdist(x, y, p=3),
        "cdist_inf_no_nan_no_inf": lambda x, y: torch.cdist(x, y, p=math.inf),
    }[name]
    x = _non_finite() if name != "cdist_inf_no_nan_no_inf" else _rows(4, 6) * 1e300   # large, finite
    check_against_eager(fn, x, _rows(4, 6))
