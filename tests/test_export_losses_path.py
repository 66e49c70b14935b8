"""Cross entropy on the torch.export capture path (ORTMOD_CAPTURE=export): the forms torch's own
machinery kept from it, against eager, loss and every gradient, per call.

* An unbatched input (C,) with a 0-d class target: decomposition runs aten's cross_entropy_loss
  on fake tensors through its composite kernel, whose unbatched nll_loss_nd indexes the input
  with the label's value (torch.export cannot trace that). It is kept opaque instead
  (_export_rules.unbatched_cross_entropy_loss) and translated by ortmod's cross_entropy rule:
  weights, ignore_index (an ignored label among the calls), label smoothing, every reduction,
  probability targets. One graph serves every label: none is frozen into it.
* nn.LinearCrossEntropyLoss with chunking options: eager calls torch's own autograd.Function
  (a custom op that computes its gradients in the forward); the graph is torch's reference path,
  which the engine differentiates (_semantics.linear_cross_entropy_reference), with the chunked
  path's NaN gradients where a mean has no target weight; what it cannot reproduce is refused.
"""
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ortmod
from ortmod import DebugOptions, ORTModule
from test_semantics import run_both


@pytest.fixture(autouse=True)
def export_path(ortmod_env):
    ortmod_env.setenv("ORTMOD_CAPTURE", "export")
    ortmod_env.delenv("ORTMODULE_FALLBACK_POLICY", raising=False)


def exports(ort, capture="export"):
    records = list(ort._ortmod_exports.values())
    assert {r.exported.capture for r in records} == {capture}
    return len(records)


class UnbatchedCE(nn.Module):
    """Logits (5,) from a Linear; class weights, ignore_index 2, label smoothing: a weighted and
    an unweighted loss, so the input's and every parameter's gradient carry both."""

    def __init__(self, **kw):
        super().__init__()
        self.a = nn.Linear(3, 5)
        self.register_buffer("w", torch.tensor([0.5, 1.5, 2.0, 1.0, 0.7]))
        self.kw = kw

    def forward(self, x, t):
        z = self.a(x)
        return F.cross_entropy(z, t, weight=self.w, ignore_index=2, **self.kw) + F.cross_entropy(z, t, **self.kw)


@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_unbatched_cross_entropy_class_targets(reduction, label_smoothing):
    """Labels 0, 2 (ignored by the weighted loss: its mean is NaN, as eager's), 4, 2 through one
    graph; nn.CrossEntropyLoss on the call's input with no state at all, the form whose
    decomposition met the label's value (with a parameter or buffer in the module torch's fake
    run took another way, and the loss was kept)."""
    labels = [0, 2, 4, 2]
    for dt in (torch.float32, torch.float64):
        g = torch.Generator().manual_seed(1)
        xs = [torch.randn(3, generator=g, dtype=dt) for _ in labels]
        m = UnbatchedCE(reduction=reduction, label_smoothing=label_smoothing).to(dt)
        ort = run_both(m, xs[0], torch.tensor(0), calls=len(labels),
                       make_inputs=lambda call: (xs[call], torch.tensor(labels[call])))
        assert exports(ort) == 1
        loss = nn.CrossEntropyLoss(reduction=reduction, ignore_index=1, label_smoothing=label_smoothing)
        ort = run_both(loss, torch.randn(3, dtype=dt), torch.tensor(0), calls=3,
                       make_inputs=lambda call: (torch.randn(3, generator=g, dtype=dt), torch.tensor(call)))
        assert exports(ort) == 1


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_unbatched_cross_entropy_probability_targets(reduction):
    w = torch.tensor([0.5, 1.5, 2.0, 1.0])
    for ls in (0.0, 0.3):
        loss = nn.CrossEntropyLoss(weight=w, reduction=reduction, label_smoothing=ls)
        run_both(loss.double(), torch.randn(4, dtype=torch.float64),
                 torch.softmax(torch.randn(4, dtype=torch.float64), 0))


def test_unbatched_nll_loss_with_an_ignored_label():
    loss = nn.NLLLoss(weight=torch.tensor([0.5, 1.5, 2.0]), ignore_index=1, reduction="none")
    ort = run_both(loss, torch.randn(3), torch.tensor(0), calls=3,
                   make_inputs=lambda call: (torch.randn(3), torch.tensor(call)))
    assert exports(ort) == 1


def _linear_ce(reduction, dt, **options):
    # class 2 weighs 0 and label 1 is ignored: a target set of only those has no weight
    return nn.LinearCrossEntropyLoss(4, 5, bias=True, weight=torch.tensor([1.0, 0.5, 0.0, 2.0, 1.5]),
                                     reduction=reduction, ignore_index=1,
                                     options=nn.LinearCrossEntropyOptions(**options)).to(dt)


@pytest.mark.parametrize("capture", ["export", "torchscript"])
@pytest.mark.parametrize("batched", [True, False])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_linear_cross_entropy_chunked_is_its_reference_path_differentiated_by_the_engine(reduction, batched,
                                                                                        capture, ortmod_env):
    """Chunks of 2 rows; per call, targets with weight, then none (every target ignored or of
    weight 0: eager's chunked mean has NaN for the loss and for every gradient), then some. The
    TorchScript path traces the same reference path (torch takes it under torch.jit.trace)."""
    ortmod_env.setenv("ORTMOD_CAPTURE", capture)
    targets = [[0, 3, 4, 2, 1], [1, 2, 1, 2, 1], [4, 4, 0, 3, 3]] if batched else [[0], [1], [2], [3]]
    for dt in (torch.float32, torch.float64):
        g = torch.Generator().manual_seed(2)
        xs = [torch.randn(len(t), 4, generator=g, dtype=dt) for t in targets]
        if not batched:
            xs = [x[0] for x in xs]
        ts = [torch.tensor(t if batched else t[0]) for t in targets]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)
            ort = run_both(_linear_ce(reduction, dt, batch_chunk_size=2, allow_retain_graph=True), xs[0], ts[0],
                           calls=len(targets), make_inputs=lambda call: (xs[call], ts[call]))
        assert exports(ort, capture) == 1


def test_linear_cross_entropy_chunked_in_another_dtype_is_refused():
    """bfloat16: the chunked path accumulates in float32 (acc_dtype), the reference path would
    round in bfloat16."""
    m = _linear_ce("mean", torch.bfloat16)
    with pytest.raises(ortmod.UnsupportedModelError, match=r"chunking options on a torch.bfloat16 input"):
        ORTModule(m, DebugOptions(capture="export"))(torch.randn(3, 4, dtype=torch.bfloat16, requires_grad=True),
                                                     torch.tensor([0, 3, 4]))
