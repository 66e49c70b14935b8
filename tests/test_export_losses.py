"""Losses torch's TorchScript exporter cannot export at opset 20, through ORTModule against eager
autograd (ortmod/capture/rules/losses.py's rules).

Everything in float64 against eager: the forward value and the gradients of every input that
eager differentiates, for one random output gradient, at the kinks eager's backward formulas
decide (l1's sgn(0) = 0, smooth_l1 and huber at |d| = beta, smooth_l1 with beta 0 at d = 0, the
margin losses at z == 0, binary_cross_entropy's clamped log at 0 and 1), for each reduction,
with weights, ignored targets and unbatched inputs; and the refusals, which name the loss.
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ortmod
from ortmod import ORTModule
from oputil import Fn

D = torch.float64
REDUCTIONS = ["none", "mean", "sum"]


def _grads(xs):
    return [torch.zeros_like(x) if x.grad is None else x.grad for x in xs]


def check_against_eager(fn, *inputs, rtol=1e-10, atol=1e-12, grad=None):
    """fn through ORTModule and eagerly: the output, then the gradients of the float inputs
    (those flagged in ``grad``, default all float inputs) for one random output gradient."""
    grad = grad if grad is not None else [x.is_floating_point() for x in inputs]
    xe = [x.clone().requires_grad_(r) for x, r in zip(inputs, grad)]
    xo = [x.clone().requires_grad_(r) for x, r in zip(inputs, grad)]
    # a module of its own for ORTModule: it takes over the module's buffers (a loss's weight)
    ye, yo = fn(*xe), ORTModule(Fn(copy.deepcopy(fn) if isinstance(fn, nn.Module) else fn))(*xo)
    torch.testing.assert_close(yo, ye, rtol=rtol, atol=atol, equal_nan=True)
    dy = torch.randn(ye.shape, dtype=ye.dtype)
    ye.backward(dy)
    yo.backward(dy)
    for k, (go, ge, r) in enumerate(zip(_grads(xo), _grads(xe), grad)):
        if r:
            torch.testing.assert_close(go, ge, rtol=rtol, atol=atol, equal_nan=True,
                                       msg=lambda m: f"input {k}: {m}")


def _kinked(shape, points):
    """A random tensor whose first elements are ``points`` (the kinks to test)."""
    x = torch.randn(*shape, dtype=D)
    p = torch.tensor(points, dtype=D)
    x.view(-1)[: p.numel()] = p
    return x


# ---- l1, smooth_l1, huber -----------------------------------------------------------------

@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_l1_loss(reduction):
    t = torch.randn(4, 5, dtype=D)
    x = t + _kinked((4, 5), [0.0, 0.0, 1.0, -1.0])          # ties: d == 0, sgn(0) = 0
    check_against_eager(lambda a, b: F.l1_loss(a, b, reduction=reduction), x, t)


def test_l1_loss_broadcast_and_module():
    check_against_eager(nn.L1Loss(), torch.randn(3, 4, dtype=D), torch.randn(3, 4, dtype=D))
    check_against_eager(lambda a, b: F.l1_loss(a, b.expand_as(a)), torch.randn(3, 4, dtype=D), torch.randn(4, dtype=D))


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("beta", [1.0, 0.5, 2.0, 1e-3])
def test_smooth_l1_loss(beta, reduction):
    t = torch.randn(4, 5, dtype=D)
    d = _kinked((4, 5), [0.0, beta, -beta, beta / 2, -beta / 2, 3 * beta, -3 * beta])
    check_against_eager(lambda a, b: F.smooth_l1_loss(a, b, reduction=reduction, beta=beta), t + d, t)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_smooth_l1_loss_beta_zero(reduction):
    # F.smooth_l1_loss calls l1_loss for beta 0 (gradient 0 at d == 0); aten's smooth_l1_loss
    # itself gives -1 there, for the input and the target alike
    t = torch.randn(4, 5, dtype=D)
    x = t + _kinked((4, 5), [0.0, 0.0, 1.0, -1.0])
    check_against_eager(lambda a, b: F.smooth_l1_loss(a, b, reduction=reduction, beta=0.0), x, t)
    check_against_eager(lambda a, b: torch._C._nn.smooth_l1_loss(a, b, {"none": 0, "mean": 1, "sum": 2}[reduction], 0.0), x, t)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("delta", [1.0, 0.5, 3.0])
def test_huber_loss(delta, reduction):
    t = torch.randn(4, 5, dtype=D)
    d = _kinked((4, 5), [0.0, delta, -delta, delta / 2, -3 * delta, 3 * delta])
    check_against_eager(lambda a, b: F.huber_loss(a, b, reduction=reduction, delta=delta), t + d, t)


def test_huber_loss_module_float32():
    x, t = torch.randn(6, 3), torch.randn(6, 3)
    check_against_eager(nn.HuberLoss(delta=0.7), x, t, rtol=1e-5, atol=1e-6)
    check_against_eager(nn.SmoothL1Loss(beta=0.7), x, t, rtol=1e-5, atol=1e-6)


# ---- binary_cross_entropy ------------------------------------------------------------------

def _probabilities(shape, points=()):
    x = torch.rand(*shape, dtype=D) * 0.98 + 0.01
    p = torch.tensor(points, dtype=D)
    x.view(-1)[: p.numel()] = p
    return x


# 0 and 1 (log clamped at -100; input gradient divided by max((1 - x) x, 1e-12), target
# gradient -logit(x) = +-inf), tiny inputs (log1p(-x), not log(1 - x)), t == x
BCE_POINTS = [0.0, 1.0, 1e-9, 1 - 1e-9, 1e-50, 0.5, 0.3]


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True])
def test_binary_cross_entropy(reduction, weighted):
    x = _probabilities((4, 7), BCE_POINTS)
    t = _probabilities((4, 7), [0.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.3])
    w = torch.randn(7, dtype=D).abs()
    if weighted:
        fn = lambda a, b, c: F.binary_cross_entropy(a, b, weight=c, reduction=reduction)
        check_against_eager(fn, x, t, w, grad=[True, True, False])   # eager does not differentiate weight
    else:
        check_against_eager(lambda a, b: F.binary_cross_entropy(a, b, reduction=reduction), x, t)


def test_binary_cross_entropy_saturated_hard_targets():
    # the usual case: 0/1 targets that do not require grad, inputs saturated at 0 and 1
    x = _probabilities((3, 5), [0.0, 1.0, 0.0, 1.0])
    t = torch.tensor([[0.0, 1.0, 1.0, 0.0, 1.0]] * 3, dtype=D)
    check_against_eager(nn.BCELoss(), x, t, grad=[True, False])
    check_against_eager(nn.BCELoss(weight=torch.tensor(2.5, dtype=D), reduction="sum"), x, t, grad=[True, False])


def test_binary_cross_entropy_float32_tiny():
    # eager's log1p(-x): 1e-9 as a loss, where log(1 - x) would give 0
    x = torch.tensor([1e-9, 1e-7, 0.25, 1.0 - 2 ** -24])
    t = torch.tensor([0.0, 0.0, 0.0, 1.0])
    check_against_eager(lambda a, b: F.binary_cross_entropy(a, b, reduction="none"), x, t, rtol=1e-6, atol=0)


# ---- binary_cross_entropy_with_logits -------------------------------------------------------

# logits past where sigmoid rounds to 0 or 1 (|x| > 37 in float64): torch's TorchScript rule,
# Log(Sigmoid(x)) and Log(1 - Sigmoid(x)), gives inf there (model fuzzer seed 20000)
LOGIT_POINTS = [0.0, 40.0, -40.0, 800.0, -800.0, 1e4, -1e4, 17.0, -17.0]


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("pos_weighted", [False, True])
def test_binary_cross_entropy_with_logits(reduction, weighted, pos_weighted):
    x = _kinked((4, 9), LOGIT_POINTS)
    t = _probabilities((4, 9), [0.0, 1.0, 0.0, 1.0, 0.0, 0.5, 1.0, 0.3, 0.7])
    w, pw = torch.rand(9, dtype=D) + 0.5, torch.rand(9, dtype=D) * 2 + 0.1
    kw = lambda c, d: dict(weight=c if weighted else None, pos_weight=d if pos_weighted else None, reduction=reduction)
    fn = lambda a, b, c, d: F.binary_cross_entropy_with_logits(a, b, **kw(c, d))
    check_against_eager(fn, x, t, w, pw, grad=[True, True, False, False])   # eager refuses to differentiate w, pw


def test_binary_cross_entropy_with_logits_float32_large():
    x = torch.tensor([[20.0, -20.0, 100.0, -100.0, 1e3, -1e3, 0.5]])
    t = torch.tensor([[0.0, 1.0, 0.2, 1.0, 0.0, 0.7, 1.0]])
    for loss in (nn.BCEWithLogitsLoss(reduction="none"),
                 nn.BCEWithLogitsLoss(reduction="none", pos_weight=torch.full((7,), 1.5))):
        check_against_eager(loss, x, t, rtol=1e-6, atol=0)


# ---- margin_ranking, hinge_embedding, soft_margin -----------------------------------------

@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("margin", [0.0, 0.5])
def test_margin_ranking_loss(reduction, margin):
    x1, x2 = torch.randn(12, dtype=D), torch.randn(12, dtype=D)
    y = torch.tensor([1, -1] * 6, dtype=D)
    x1[:4] = x2[:4] + y[:4] * margin            # on the kink: clamp_min's gradient passes there
    check_against_eager(lambda a, b, c: F.margin_ranking_loss(a, b, c, margin=margin, reduction=reduction), x1, x2, y)
    check_against_eager(lambda a, b, c: F.margin_ranking_loss(a, b, c, margin=margin, reduction=reduction),
                        x1, x2, y.long(), grad=[True, True, False])


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("margin", [1.0, 0.5])
def test_hinge_embedding_loss(reduction, margin):
    x = _kinked((3, 4), [margin, margin, 0.0, -1.0, 2 * margin])
    y = torch.tensor([[1, -1, -1, 1], [-1, -1, 1, 1], [1, -1, 2, 0]], dtype=D)   # 2 and 0: both terms
    check_against_eager(lambda a, b: F.hinge_embedding_loss(a, b, margin=margin, reduction=reduction), x, y,
                        grad=[True, False])
    check_against_eager(lambda a, b: F.hinge_embedding_loss(a, b, margin=margin, reduction=reduction), x, y.long(),
                        grad=[True, False])
    check_against_eager(nn.HingeEmbeddingLoss(margin=margin, reduction=reduction), x[0, 0], y[0, 1], grad=[True, False])


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_soft_margin_loss(reduction):
    x = _kinked((3, 5), [0.0, 30.0, -30.0, 800.0, -800.0, 1e-3])   # exp overflows at 800: inf, NaN gradient
    y = torch.tensor([1.0, -1.0, 1.0] * 5, dtype=D).view(3, 5)
    check_against_eager(lambda a, b: F.soft_margin_loss(a, b, reduction=reduction), x, y, grad=[True, False])
    check_against_eager(nn.SoftMarginLoss(reduction=reduction), x.float(), y.float(), grad=[True, False],
                        rtol=1e-5, atol=1e-6)



# ---- multi_margin, multilabel_margin ----------------------------------------------------------

def _margin_scores(margin):
    """Scores with z = margin - x[y] + x[d] exactly 0 in places (eager's z > 0: no gradient)."""
    x = torch.randn(5, 4, dtype=D)
    y = torch.tensor([2, 0, 3, 1, 1])
    x[0, 1] = x[0, 2] - margin          # z == 0
    x[1, :] = 0.25                      # ties with the target: z == margin
    x[3, 0] = x[3, 1] - margin
    return x, y


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("p", [1, 2])
@pytest.mark.parametrize("margin", [1.0, 0.5])
@pytest.mark.parametrize("weighted", [False, True])
def test_multi_margin_loss(reduction, p, margin, weighted):
    x, y = _margin_scores(margin)
    w = torch.rand(4, dtype=D) + 0.5 if weighted else None
    check_against_eager(lambda a, b: F.multi_margin_loss(a, b, p=p, margin=margin, weight=w, reduction=reduction), x, y)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_multi_margin_loss_unbatched(reduction):
    x, y = _margin_scores(1.0)
    check_against_eager(lambda a, b: F.multi_margin_loss(a, b, reduction=reduction), x[0], y[0])          # target ()
    check_against_eager(lambda a, b: F.multi_margin_loss(a, b, p=2, reduction=reduction), x[0], y[:1])   # target (1,)
    check_against_eager(nn.MultiMarginLoss(weight=torch.rand(4, dtype=D), reduction=reduction), x, y)


def _multilabel_targets():
    # -1 terminates each row; what follows it is ignored (row 2); a repeated class counts twice
    # (row 3); row 4 has no targets; row 1 every class (no non-target: loss 0)
    return torch.tensor([[3, 0, -1, 1], [0, 1, 2, 3], [1, -1, 0, 2], [2, 2, -1, 0], [-1, 1, 2, 3]])


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_multilabel_margin_loss(reduction):
    x = torch.randn(5, 4, dtype=D)
    x[0, 1] = x[0, 3] - 1.0             # z == 0 for the pair (3, 1)
    x[2, 2] = x[2, 1] - 1.0
    check_against_eager(lambda a, b: F.multilabel_margin_loss(a, b, reduction=reduction), x, _multilabel_targets())


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_multilabel_margin_loss_unbatched(reduction):
    x = torch.randn(6, dtype=D)
    check_against_eager(nn.MultiLabelMarginLoss(reduction=reduction), x, torch.tensor([4, 1, -1, 0, 0, 0]))
    check_against_eager(nn.MultiLabelMarginLoss(reduction=reduction), x, torch.tensor([5, 4, 3, 2, 1, 0]))


# ---- poisson_nll -------------------------------------------------------------------------------

@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("log_input", [True, False])
@pytest.mark.parametrize("full", [False, True])
def test_poisson_nll_loss(reduction, log_input, full):
    x = torch.randn(4, 5, dtype=D) if log_input else torch.rand(4, 5, dtype=D) * 3
    if not log_input:
        x[0, 0] = 0.0                   # log(0 + eps)
    t = torch.tensor([0.0, 0.5, 1.0, 1.0 + 1e-9, 2.0, 7.0, 3.5] * 3 * 1, dtype=D)[:20].view(4, 5)   # Stirling for t > 1
    check_against_eager(lambda a, b: F.poisson_nll_loss(a, b, log_input=log_input, full=full, eps=1e-3,
                                                        reduction=reduction), x, t)


def test_poisson_nll_loss_module_defaults():
    x, t = torch.rand(3, 4, dtype=D), torch.poisson(torch.rand(3, 4, dtype=D) * 4)
    check_against_eager(nn.PoissonNLLLoss(), x, t, grad=[True, False])
    check_against_eager(nn.PoissonNLLLoss(log_input=False, full=True), x, t, grad=[True, False])


# ---- cross_entropy ------------------------------------------------------------------------------

def _class_targets(shape, classes, ignore=None, n_ignored=2):
    t = torch.randint(0, classes, shape)
    if ignore is not None:
        t.view(-1)[:n_ignored] = ignore                 # pad-like positions
    return t


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("ls", [0.0, 0.1, 1.0])
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("ignore_index", [-100, 1])
def test_cross_entropy_class_targets(reduction, ls, weighted, ignore_index):
    x = torch.randn(6, 4, dtype=D)
    t = _class_targets((6,), 4, ignore=ignore_index)
    w = torch.rand(4, dtype=D) + 0.5 if weighted else None
    check_against_eager(lambda a, b: F.cross_entropy(a, b, weight=w, reduction=reduction, ignore_index=ignore_index,
                                                     label_smoothing=ls), x, t)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("ls", [0.0, 0.25])
def test_cross_entropy_spatial(reduction, ls):
    x = torch.randn(2, 3, 4, 5, dtype=D)
    t = _class_targets((2, 4, 5), 3, ignore=-100, n_ignored=3)
    w = torch.rand(3, dtype=D) + 0.5
    check_against_eager(nn.CrossEntropyLoss(weight=w, reduction=reduction, label_smoothing=ls), x, t)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("ls", [0.0, 0.1])
@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_unbatched(reduction, ls, weighted):
    x = torch.randn(5, dtype=D)
    w = torch.rand(5, dtype=D) + 0.5 if weighted else None
    fn = lambda a, b: F.cross_entropy(a, b, weight=w, reduction=reduction, label_smoothing=ls)
    check_against_eager(fn, x, torch.tensor(3))
    check_against_eager(fn, x, torch.softmax(torch.randn(5, dtype=D), 0))       # probability target (C,)


def test_cross_entropy_unbatched_confident_float32():
    # the module_db case: a loss of ~5e-6 from logits ~8, where the engine's m + log(sum)
    # rounding (without the max shift) was 30% off
    x = torch.tensor([-7.2750, 8.2008, -6.3643])
    w = torch.tensor([-5.2724, -7.0859, -3.1733])
    m = nn.CrossEntropyLoss(weight=w, reduction="sum")
    torch.testing.assert_close(ORTModule(copy.deepcopy(m))(x, torch.tensor(1)), m(x, torch.tensor(1)), rtol=1e-6, atol=0)
    # the gradient (softmax - 1) w at the target cancels: 1 ulp of exp near 1 is 8% of it
    check_against_eager(m, x, torch.tensor(1), rtol=1e-5, atol=5e-7)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("ls", [0.0, 0.3])
@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy_probability_targets(reduction, ls, weighted):
    x = torch.randn(3, 4, 2, dtype=D)
    t = torch.softmax(torch.randn(3, 4, 2, dtype=D), 1)
    w = torch.rand(4, dtype=D) + 0.5 if weighted else None
    check_against_eager(lambda a, b: F.cross_entropy(a, b, weight=w, reduction=reduction, label_smoothing=ls), x, t)


def test_cross_entropy_everything_ignored():
    # mean over no targets: 0 / 0 = NaN, as eager (with and without smoothing)
    x, t = torch.randn(3, 4, dtype=D), torch.full((3,), -100)
    for ls in (0.0, 0.2):
        check_against_eager(lambda a, b: F.cross_entropy(a, b, label_smoothing=ls), x, t)


# ---- refusals ------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, fn, inputs", [
    ("l1_loss", lambda a, b: F.l1_loss(a, b), (torch.randn(3), torch.randn(3, dtype=D))),
    ("smooth_l1_loss", lambda a, b: F.smooth_l1_loss(a, b), (torch.randn(3), torch.randn(3, dtype=D))),
    ("margin_ranking_loss", lambda a, b, c: F.margin_ranking_loss(a, b, c),
     (torch.randn(3), torch.randn(3), torch.ones(3, dtype=D))),
    ("cross_entropy", lambda a, b: F.cross_entropy(a, b, label_smoothing=0.1),
     (torch.randn(3, 4), torch.softmax(torch.randn(3, 4, dtype=D), 1))),
])
def test_refused_variants_name_the_loss(name, fn, inputs):
    # mixed dtypes (eager promotes): the TorchScript path refuses them by name rather than
    # compute in the wrong dtype; torch.export's type promotion computes them in eager's dtype,
    # but for probability targets, which that path refuses by name too
    export = ortmod.DebugOptions().capture == "export"
    if export and name != "cross_entropy":
        check_against_eager(fn, *inputs)
        return
    xs = [x.requires_grad_() if x.is_floating_point() else x for x in inputs]
    with pytest.raises(ortmod.UnsupportedModelError, match=name if export else f"^{name}: "):
        ORTModule(Fn(fn))(*xs)


def test_margin_kernels_skip_nan_scores():
    # eager's kernels test z > 0: a NaN score outside the target contributes nothing
    x = torch.randn(3, 4, dtype=D)
    x[0, 1] = float("nan")
    check_against_eager(lambda a, b: F.multi_margin_loss(a, b, reduction="none"), x, torch.tensor([2, 0, 3]))
    check_against_eager(lambda a, b: F.multi_margin_loss(a, b, p=2, reduction="sum"), x, torch.tensor([2, 0, 3]))
    check_against_eager(lambda a, b: F.multilabel_margin_loss(a, b, reduction="none"), x,
                        torch.tensor([[2, -1, 0, 0], [0, 3, -1, 0], [3, -1, 0, 0]]))
