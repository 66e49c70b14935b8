"""CTC loss (csrc/ops/ctc.c, ortmod/capture/rules/ctc.py): the engine's CTCLoss/CTCLossGrad against
eager PyTorch (the reference only) and finite differences, and nn.CTCLoss / F.ctc_loss through
ORTModule against eager: reductions, padded and concatenated targets, lengths as lists
(constants) and as tensors (inputs), varying lengths, repeated labels (the s-2 skip), blank != 0,
a label equal to blank, impossible alignments with and without zero_infinity (eager's inf loss
and NaN gradient, or 0 and 0), empty inputs and targets, unbatched inputs, float32 and float64;
and eager's refusals (lengths, blank) plus ortmod's own (labels out of range, half dtypes).

eager's gradient is (exp(lp) - sum(alpha beta) / (p y)) * dloss: the derivative through a
log_softmax, not of the loss as a function of free log_probs (its exp(lp) term sums to the
likelihood's 1 over c). The finite differences therefore run through LogSoftmax -> CTCLoss."""
import numpy as np
import onnx
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import TensorProto, helper

import ortmod
from oputil import make_model, run
from ortmod import ORTModule

RNG = np.random.default_rng(20240611)


def log_probs(T, N, C, dtype=np.float32, rng=RNG):
    x = rng.standard_normal((T, N, C)) if N else rng.standard_normal((T, C))
    return torch.from_numpy(x).log_softmax(-1).numpy().astype(dtype)


def eager_per_sample(lp, tg, il, tl, blank=0, zero_infinity=False):
    x = torch.from_numpy(lp).requires_grad_()
    loss = F.ctc_loss(x, torch.from_numpy(tg), torch.from_numpy(il), torch.from_numpy(tl), blank=blank,
                      reduction="none", zero_infinity=zero_infinity)
    return x, loss


def engine_model(dtype, blank, zero_infinity, with_log_softmax=False):
    """CTCLoss(lp, targets, il, tl), or CTCLoss(LogSoftmax(x), ...) for the gradient check."""
    ft = TensorProto.FLOAT if dtype == np.float32 else TensorProto.DOUBLE
    nodes, first = [], "lp"
    if with_log_softmax:
        nodes.append(helper.make_node("LogSoftmax", ["x"], ["lp"], axis=-1))
        first = "x"
    nodes.append(helper.make_node("CTCLoss", ["lp", "tg", "il", "tl"], ["loss"], domain="ortmod", blank=blank,
                                  zero_infinity=int(zero_infinity)))
    inputs = [helper.make_tensor_value_info(first, ft, None)] + [
        helper.make_tensor_value_info(n, TensorProto.INT64, None) for n in ("tg", "il", "tl")]
    graph = helper.make_graph(nodes, "ctc", inputs, [helper.make_tensor_value_info("loss", ft, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("ortmod", 1)])
    return model.SerializeToString()


# (name, T, N, C, targets, input_lengths, target_lengths, blank)
OP_CASES = [
    ("padded", 12, 3, 5, [[1, 2, 3, 0], [2, 2, 4, 0], [3, 0, 0, 0]], [12, 10, 7], [3, 3, 1], 0),
    ("concatenated", 12, 3, 5, [1, 2, 3, 2, 2, 4, 3], [12, 10, 7], [3, 3, 1], 0),
    ("repeated-labels", 10, 2, 4, [[1, 1, 1, 2], [3, 3, 2, 2]], [10, 9], [4, 4], 0),
    ("blank-last", 9, 2, 5, [[0, 1, 1], [2, 3, 0]], [9, 8], [3, 3], 4),
    ("label-equals-blank", 8, 2, 4, [[1, 0, 2], [0, 0, 3]], [8, 8], [3, 3], 0),
    ("empty-target-and-input", 6, 3, 4, [[1, 2], [0, 0], [3, 1]], [6, 5, 0], [2, 0, 0], 0),
    ("unbatched", 9, 0, 5, [2, 4, 4, 1], [9], [4], 0),
]


@pytest.mark.parametrize("dtype", [np.float32, np.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", OP_CASES, ids=[c[0] for c in OP_CASES])
def test_ctc_op_matches_eager(case, dtype):
    _, T, N, C, tg, il, tl, blank = case
    lp = log_probs(T, N, C, dtype)
    tg, il, tl = (np.array(v, np.int64) for v in (tg, il, tl))
    x, want = eager_per_sample(lp, tg, il, tl, blank)
    dy = RNG.standard_normal(want.shape).astype(dtype)
    want.backward(torch.from_numpy(dy))
    model = engine_model(dtype, blank, False)
    eng = ortmod._C.Engine(model, [True, False, False, False])
    caps, stash = eng.forward([lp, tg, il, tl], True)
    from oputil import _Cap
    got = np.from_dlpack(_Cap(caps[0])).copy()
    grads = eng.backward(stash, [np.require(dy.reshape(got.shape), requirements="C")])
    dlp = np.from_dlpack(_Cap(grads[0])).copy()
    tol = dict(rtol=1e-6, atol=1e-6) if dtype == np.float32 else dict(rtol=1e-13, atol=1e-13)
    print(f"{case[0]} {np.dtype(dtype).name}: loss max diff {np.max(np.abs(got - want.detach().numpy())):.3e}, "
          f"grad max diff {np.max(np.abs(dlp - x.grad.numpy())):.3e}")
    assert got.shape == tuple(want.shape)
    np.testing.assert_allclose(got, want.detach().numpy(), **tol)
    np.testing.assert_allclose(dlp, x.grad.numpy(), **tol)


@pytest.mark.parametrize("case", [c for c in OP_CASES if c[0] != "label-equals-blank"],
                         ids=[c[0] for c in OP_CASES if c[0] != "label-equals-blank"])
def test_ctc_gradient_matches_finite_differences(case):
    _, T, N, C, tg, il, tl, blank = case
    T, C = min(T, 7), C
    il = [min(v, T) for v in il]
    x = RNG.standard_normal((T, N, C) if N else (T, C))
    tg, il, tl = (np.array(v, np.int64) for v in (tg, il, tl))
    model = engine_model(np.float64, blank, False, with_log_softmax=True)
    feeds = [x, tg, il, tl]
    outs, grads, dys = run(model, feeds, grad=[True, False, False, False])
    assert np.all(np.isfinite(outs[0])), "choose lengths that fit"

    def objective(xx):
        o, _, _ = run(model, [xx, tg, il, tl])
        return float(np.sum(o[0] * dys[0]))

    eps, num = 1e-6, np.zeros_like(x)
    for k in range(x.size):
        xp, xm = x.copy(), x.copy()
        xp.reshape(-1)[k] += eps
        xm.reshape(-1)[k] -= eps
        num.reshape(-1)[k] = (objective(xp) - objective(xm)) / (2 * eps)
    print(f"{case[0]}: max |engine - finite differences| {np.max(np.abs(grads[0] - num)):.3e}")
    np.testing.assert_allclose(grads[0], num, rtol=1e-5, atol=1e-7)


# ---- through ORTModule --------------------------------------------------------------------------

class CTCHead(nn.Module):
    """A linear layer, log_softmax, then nn.CTCLoss; lengths given as lists (constants of the
    trace) when ``lengths`` is set, else passed as tensors."""

    def __init__(self, C, lengths=None, **ctc):
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(6, C)
        self.loss = nn.CTCLoss(**ctc)
        self.lengths = lengths

    def forward(self, feats, targets, *lengths):
        lp = self.proj(feats).log_softmax(-1)
        il, tl = lengths if lengths else self.lengths
        return self.loss(lp, targets, il, tl)


def _both(make, feats, *args, rtol, atol):
    eager = make()
    ort = ORTModule(make())
    fe, fo = feats.clone().requires_grad_(), feats.clone().requires_grad_()
    le, lo = eager(fe, *args), ort(fo, *args)
    le_r = le.sum() if le.dim() else le
    lo_r = lo.sum() if lo.dim() else lo
    le_r.backward()
    lo_r.backward()
    torch.testing.assert_close(lo, le, rtol=rtol, atol=atol, equal_nan=True)
    torch.testing.assert_close(fo.grad, fe.grad, rtol=rtol, atol=atol, equal_nan=True)
    # the weights' gradients sum over every frame in a GEMM, whose order differs from eager's
    for (n, pe), (_, po) in zip(eager.named_parameters(), ort.named_parameters()):
        torch.testing.assert_close(po.grad, pe.grad, rtol=rtol, atol=max(atol, 1e-5 if rtol > 1e-8 else atol),
                                   equal_nan=True)
    return le, lo


TG_PADDED = torch.tensor([[1, 2, 2, 3, 1, 0], [4, 4, 4, 1, 0, 0], [2, 3, 0, 0, 0, 0]])
IL, TL = [14, 11, 8], [5, 4, 2]


def _concat(tg, tl):
    return torch.cat([tg[i, :n] for i, n in enumerate(tl)])


MODULE_CASES = [
    # (name, targets, input_lengths, target_lengths, CTCLoss kwargs)
    ("mean-padded", TG_PADDED, IL, TL, dict(reduction="mean")),
    ("sum-padded", TG_PADDED, IL, TL, dict(reduction="sum")),
    ("none-padded", TG_PADDED, IL, TL, dict(reduction="none")),
    ("mean-concatenated", _concat(TG_PADDED, TL), IL, TL, dict(reduction="mean")),
    ("none-concatenated", _concat(TG_PADDED, TL), IL, TL, dict(reduction="none")),
    ("blank-last", TG_PADDED, IL, TL, dict(blank=5)),
    ("zero-target-length", TG_PADDED, [14, 11, 8], [5, 0, 2], dict(reduction="mean")),
    # sample 1 needs 4 repeated labels (7 frames) in 5 frames: inf loss, NaN gradient in eager
    ("impossible", TG_PADDED, [14, 5, 8], TL, dict(reduction="none")),
    ("impossible-sum", TG_PADDED, [14, 5, 8], TL, dict(reduction="sum")),
    ("impossible-zero-infinity", TG_PADDED, [14, 5, 8], TL, dict(reduction="none", zero_infinity=True)),
    ("impossible-zero-infinity-mean", TG_PADDED, [14, 5, 8], TL, dict(reduction="mean", zero_infinity=True)),
    ("zero-input-length", TG_PADDED, [14, 0, 8], TL, dict(reduction="sum")),
]


@pytest.mark.parametrize("as_tensors", [False, True], ids=["lists", "tensors"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("case", MODULE_CASES, ids=[c[0] for c in MODULE_CASES])
def test_ctc_loss_module_matches_eager(case, dtype, as_tensors):
    name, tg, il, tl, kw = case
    if kw.get("blank") == 5:
        tg = torch.where(tg == 0, torch.ones_like(tg), tg)   # labels 1..4 with blank 5
    C = 6
    g = torch.Generator().manual_seed(7)
    feats = torch.randn(14, 3, 6, generator=g, dtype=dtype)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-10, atol=1e-12)

    def make():
        m = CTCHead(C, None if as_tensors else (il, tl), **kw)
        return m.to(dtype)

    args = (tg, torch.tensor(il), torch.tensor(tl)) if as_tensors else (tg,)
    le, lo = _both(make, feats, *args, **tol)
    print(f"{name}: eager {le.detach()}, ORTModule {lo.detach()}")


def test_ctc_loss_unbatched_matches_eager():
    g = torch.Generator().manual_seed(3)
    lp_e = torch.randn(10, 5, generator=g).log_softmax(-1).requires_grad_()
    lp_o = lp_e.detach().clone().requires_grad_()
    tg = torch.tensor([1, 3, 3, 2])
    for reduction in ("none", "mean", "sum"):
        lp_e.grad = lp_o.grad = None
        fn = lambda lp, t: F.ctc_loss(lp, t, [10], [4], reduction=reduction)   # noqa: E731
        from oputil import Fn
        want, got = fn(lp_e, tg), ORTModule(Fn(fn))(lp_o, tg)
        assert got.shape == want.shape
        want.backward()
        got.backward()
        torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(lp_o.grad, lp_e.grad, rtol=1e-6, atol=1e-6)


def test_ctc_loss_int32_targets_and_lengths():
    g = torch.Generator().manual_seed(5)
    feats = torch.randn(14, 3, 6, generator=g)
    _both(lambda: CTCHead(6), feats, TG_PADDED.int(), torch.tensor(IL, dtype=torch.int32),
          torch.tensor(TL, dtype=torch.int32), rtol=1e-5, atol=1e-6)


# ---- refusals --------------------------------------------------------------------------------------

def _ort_ctc(**kw):
    from oputil import Fn
    return ORTModule(Fn(lambda x, t, i, n: F.ctc_loss(x, t, i, n, **kw)))


@pytest.mark.parametrize("il,tl,tg,match", [
    ([15, 11, 8], TL, TG_PADDED, r"input_lengths\[0\] = 15 is outside \[0, 14\]"),
    ([-1, 11, 8], TL, TG_PADDED, r"input_lengths\[0\] = -1"),
    (IL, [7, 4, 2], TG_PADDED, r"target_lengths\[0\] = 7 is larger than the padded targets' width 6"),
    (IL, [5, -1, 2], TG_PADDED, r"target_lengths\[1\] = -1 is negative"),
    (IL, [5, 4, 3], _concat(TG_PADDED, TL), r"concatenated targets"),
    (IL, TL, TG_PADDED * 0 + 9, r"outside the label range \[0, 6\)"),
], ids=["input-too-long", "input-negative", "target-too-long", "target-negative", "concat-size", "label-range"])
def test_ctc_loss_refuses_what_eager_refuses(il, tl, tg, match):
    """Lengths as tensors: the trace (eager, valid values) exports once; the next call's values
    reach the engine's checks. eager refuses the same values (labels out of range aside: its
    kernel reads out of bounds and nothing stops it)."""
    lp = torch.randn(14, 3, 6).log_softmax(-1).requires_grad_()
    m = _ort_ctc()
    good_tg = _concat(TG_PADDED, TL) if tg.dim() == 1 else TG_PADDED
    m(lp, good_tg, torch.tensor(IL), torch.tensor(TL)).backward()
    with pytest.raises(ortmod.InvalidInputError, match=match):
        m(lp, tg, torch.tensor(il), torch.tensor(tl))
    if "label" not in match:
        with pytest.raises(RuntimeError):
            F.ctc_loss(lp, tg, torch.tensor(il), torch.tensor(tl))


def _ctc_model_with_constant_lengths(lp, tg, il, tl, blank=0):
    return make_model("CTCLoss", {"lp": lp, "tg": tg, "il": np.array(il, np.int64), "tl": np.array(tl, np.int64)},
                      {"blank": blank}, domain="ortmod", const_inputs=("il", "tl"))


def test_ctc_op_refuses_constant_lengths_when_planned():
    """Lengths known at plan time (Python lists in the trace become constants) are checked when
    the engine plans, before any kernel runs."""
    lp, tg = log_probs(14, 3, 6), TG_PADDED.numpy()
    with pytest.raises(ortmod.InvalidInputError, match=r"input_lengths\[0\] = 20"):
        run(_ctc_model_with_constant_lengths(lp, tg, [20, 11, 8], TL), [lp, tg])


def test_ctc_op_refuses_blank_out_of_range():
    lp, tg = log_probs(14, 3, 6), TG_PADDED.numpy()
    with pytest.raises(ortmod.InvalidInputError, match="blank = 6 must be in label range"):
        run(_ctc_model_with_constant_lengths(lp, tg, IL, TL, blank=6), [lp, tg])


def test_ctc_op_refuses_half_log_probs():
    lp = np.zeros((4, 1, 3), np.float16)
    tg = np.array([[1]], np.int64)
    graph = helper.make_graph(
        [helper.make_node("CTCLoss", ["lp", "tg", "il", "tl"], ["loss"], domain="ortmod")], "ctc",
        [helper.make_tensor_value_info("lp", TensorProto.FLOAT16, None),
         helper.make_tensor_value_info("tg", TensorProto.INT64, None)],
        [helper.make_tensor_value_info("loss", TensorProto.FLOAT16, None)],
        initializer=[onnx.numpy_helper.from_array(np.array([4], np.int64), "il"),
                     onnx.numpy_helper.from_array(np.array([1], np.int64), "tl")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid("ortmod", 1)])
    with pytest.raises(ortmod.UnsupportedOpError, match="no float16 kernel"):
        ortmod._C.Engine(model.SerializeToString(), None).forward([lp, tg], False)


class MaskedTargetsCTC(nn.Module):
    """Wav2Vec2ForCTC's call: targets = labels.masked_select(labels >= 0), lengths from the mask
    (the export passes CTCLoss the labels and the mask: NonZero's length is data)."""

    def __init__(self, C, reduction):
        super().__init__()
        torch.manual_seed(1)
        self.proj = nn.Linear(6, C)
        self.reduction = reduction

    def forward(self, feats, labels, input_lengths):
        mask = labels >= 0
        lp = self.proj(feats).log_softmax(-1)
        return F.ctc_loss(lp, labels.masked_select(mask), input_lengths, mask.sum(-1), reduction=self.reduction)


@pytest.mark.parametrize("reduction", ["sum", "mean", "none"])
def test_ctc_loss_masked_select_targets_match_eager(reduction):
    g = torch.Generator().manual_seed(11)
    feats = torch.randn(14, 3, 6, generator=g)
    labels = torch.tensor([[1, 2, 2, 3, -100], [4, -100, 4, 1, -100], [2, 3, -100, -100, -100]])
    m = _both(lambda: MaskedTargetsCTC(6, reduction), feats, labels, torch.tensor(IL), rtol=1e-5, atol=1e-6)
    # new labels (another mask) need no new export: the mask is an input
    _, ort = m
    labels2 = torch.tensor([[1, -100, -100, -100, -100], [4, 4, 4, 1, 2], [2, 3, 1, -100, -100]])
    eager = MaskedTargetsCTC(6, reduction)
    torch.testing.assert_close(ORTModule(MaskedTargetsCTC(6, reduction))(feats, labels2, torch.tensor(IL)),
                               eager(feats, labels2, torch.tensor(IL)), rtol=1e-5, atol=1e-6)


def test_ctc_op_masked_targets_count_must_match_lengths():
    lp = log_probs(8, 2, 5)
    tg = np.array([[1, 2, 3], [2, 2, 1]], np.int64)
    mask = np.array([[True, True, False], [True, False, False]])
    model = make_model("CTCLoss", {"lp": lp, "tg": tg, "il": np.array([8, 8], np.int64),
                                   "tl": np.array([2, 2], np.int64), "mask": mask}, domain="ortmod")
    with pytest.raises(ortmod.InvalidInputError, match="the target lengths add up to more than the 3 concatenated targets"):
        run(model, [lp, tg, np.array([8, 8], np.int64), np.array([2, 2], np.int64), mask])
