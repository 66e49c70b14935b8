"""CTC loss on the torch.export capture path (ortmod/capture/rules/ctc.py): torch has no fake kernel
for ``aten._ctc_loss``, so while torch.export traces, torch's CTC loss becomes ``ortmod::ctc_loss``
(the engine's CTCLoss node) with eager's reduction around it. Each test compares the loss and
the gradients with eager, as the TorchScript path's tests do (tests/test_ops_ctc.py), and checks
that the export took this path and emitted the engine's node.
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ortmod
from ortmod import ORTModule
from modelparity import exported_op_types
from test_ops_ctc import MaskedTargetsCTC     # Wav2Vec2ForCTC's call, the TorchScript path's test model
from test_semantics import rel_close, run_both


@pytest.fixture(autouse=True)
def export_path(ortmod_env):
    ortmod_env.setenv("ORTMOD_CAPTURE", "export")
    ortmod_env.delenv("ORTMODULE_FALLBACK_POLICY", raising=False)


def on_this_path(ort):
    assert {r.exported.capture for r in ort._ortmod_exports.values()} == {"export"}
    assert "CTCLoss" in exported_op_types(ort)


class CTCHead(nn.Module):
    """features (T, N, 6) -> Linear -> log_softmax -> CTC loss; lengths from the call, or kept
    as Python lists (constants of the export)."""

    def __init__(self, lengths=None, call=F.ctc_loss, **kw):
        super().__init__()
        torch.manual_seed(0)
        self.proj = nn.Linear(6, 6)
        self.lengths, self.call, self.kw = lengths, call, kw

    def forward(self, feats, targets, *lengths):
        lp = self.proj(feats).log_softmax(-1)
        il, tl = lengths if lengths else self.lengths
        return self.call(lp, targets, il, tl, **self.kw)


TG_PADDED = torch.tensor([[1, 2, 2, 3, 1, 0], [4, 4, 4, 1, 0, 0], [2, 3, 0, 0, 0, 0]])
IL, TL = [14, 11, 8], [5, 4, 2]


def concat(tg, tl):
    return torch.cat([tg[i, :n] for i, n in enumerate(tl)])


def feats(T=14, N=3, seed=7):
    return torch.randn(T, N, 6, generator=torch.Generator().manual_seed(seed))


def both_dtypes(module, *inputs, calls=1, make_inputs=None):
    """run_both (outputs and every gradient against eager, per call) in float32 and float64."""
    for dt in (torch.float32, torch.float64):
        xs = [x.to(dt) if x.is_floating_point() else x for x in inputs]
        make = (lambda k, make_inputs=make_inputs, dt=dt: [x.to(dt) if x.is_floating_point() else x
                                                           for x in make_inputs(k)]) if make_inputs else None
        ort = run_both(copy.deepcopy(module).to(dt), *xs, calls=calls, make_inputs=make)
        on_this_path(ort)


@pytest.mark.parametrize("lengths", ["lists", "tensors"])
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_each_reduction_matches_eager(reduction, lengths):
    if lengths == "lists":
        both_dtypes(CTCHead((IL, TL), reduction=reduction), feats(), TG_PADDED)
    else:
        both_dtypes(CTCHead(reduction=reduction), feats(), TG_PADDED, torch.tensor(IL), torch.tensor(TL))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_concatenated_targets_match_eager(reduction):
    both_dtypes(CTCHead(reduction=reduction), feats(), concat(TG_PADDED, TL), torch.tensor(IL), torch.tensor(TL))
    both_dtypes(CTCHead((IL, TL), reduction=reduction), feats(), concat(TG_PADDED, TL))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_infeasible_target(reduction):
    """Sample 1 needs 4 repeated labels (7 frames) in 5: eager's loss is inf (its gradient NaN);
    with zero_infinity the sample's loss is 0 and it gets no gradient."""
    il = torch.tensor([14, 5, 8])
    both_dtypes(CTCHead(reduction=reduction, zero_infinity=True), feats(), TG_PADDED, il, torch.tensor(TL))
    both_dtypes(CTCHead(reduction=reduction), feats(), TG_PADDED, il, torch.tensor(TL))
    ort = ORTModule(CTCHead(reduction=reduction, zero_infinity=True))
    x = feats().requires_grad_()
    loss = ort(x, TG_PADDED, il, torch.tensor(TL))
    assert torch.isfinite(loss).all()
    loss.sum().backward()
    assert (x.grad[:, 1] == 0).all() and (x.grad[:, 0] != 0).any()


def test_blank_int32_and_zero_target_length():
    tg = torch.where(TG_PADDED == 0, torch.ones_like(TG_PADDED), TG_PADDED)   # labels 1..4, blank 5
    both_dtypes(CTCHead(blank=5), feats(), tg, torch.tensor(IL), torch.tensor(TL))
    both_dtypes(CTCHead(), feats(), TG_PADDED.int(), torch.tensor(IL, dtype=torch.int32),
                torch.tensor([5, 0, 2], dtype=torch.int32))


def test_a_changed_batch_size_keeps_parity():
    """The batch (N) and the frames (T) are symbolic after the first size change: other sizes run
    on the engine with eager's loss and gradients, on the same export."""
    sizes = [(14, 3), (10, 5), (14, 2)]

    def call(k):
        T, N = sizes[k]
        g = torch.Generator().manual_seed(k)
        tg = torch.randint(1, 6, (N, 4), generator=g)
        return [feats(T, N, seed=k), tg, torch.full((N,), T), torch.randint(1, 5, (N,), generator=g)]

    for reduction in ("mean", "none"):
        ort = run_both(CTCHead(reduction=reduction), *call(0), calls=len(sizes), make_inputs=call)
        on_this_path(ort)
        # sizes static at first, then the varied dims symbolic: no export after the second
        assert ort._ortmod_export_count == 2


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_unbatched_input_matches_eager(reduction):
    class Unbatched(nn.Module):
        def forward(self, lp, tg, il, tl):
            return F.ctc_loss(lp.log_softmax(-1), tg, il, tl, reduction=reduction)

    x = torch.randn(10, 5, generator=torch.Generator().manual_seed(3))
    both_dtypes(Unbatched(), x, torch.tensor([1, 3, 3, 2]), torch.tensor(10), torch.tensor(4))


def test_every_way_to_torchs_ctc_loss():
    """F.ctc_loss, nn.CTCLoss, torch.ctc_loss (at::Reduction's numbers) and the aten op."""
    args = (feats(), TG_PADDED, torch.tensor(IL), torch.tensor(TL))
    loss = nn.CTCLoss(reduction="sum")
    both_dtypes(CTCHead(call=lambda *a: loss(*a)), *args)
    both_dtypes(CTCHead(call=torch.ctc_loss, reduction=2), *args)
    both_dtypes(CTCHead(call=torch.ops.aten.ctc_loss.Tensor, blank=0, reduction=0), *args)
    both_dtypes(CTCHead((IL, TL), call=torch.ops.aten.ctc_loss.IntList), feats(), TG_PADDED)


@pytest.mark.parametrize("reduction", ["sum", "mean", "none"])
def test_masked_select_targets_match_eager_and_a_new_mask_needs_no_export(reduction):
    labels = [torch.tensor([[1, 2, 2, 3, -100], [4, -100, 4, 1, -100], [2, 3, -100, -100, -100]]),
              torch.tensor([[1, -100, -100, -100, -100], [4, 4, 4, 1, 2], [2, 3, 1, -100, -100]])]
    ort = run_both(MaskedTargetsCTC(6, reduction), feats(), labels[0], torch.tensor(IL), calls=2,
                   make_inputs=lambda k: (feats(seed=k), labels[k], torch.tensor(IL)))
    on_this_path(ort)
    assert "NonZero" not in exported_op_types(ort)
    assert ort._ortmod_export_count == 1


def test_what_the_engine_cannot_take_is_refused_by_name():
    x = feats()
    with pytest.raises(ortmod.UnsupportedModelError, match="ctc_loss: input_lengths of dtype torch.float32"):
        ORTModule(CTCHead())(x, TG_PADDED, torch.tensor(IL, dtype=torch.float32), torch.tensor(TL))

    class Blank(nn.Module):
        def forward(self, lp, tg, il, tl, blank):
            return F.ctc_loss(lp.log_softmax(-1), tg, il, tl, blank=blank)

    with pytest.raises(ortmod.UnsupportedModelError, match="ctc_loss: blank = .*Python constants"):
        ORTModule(Blank())(x, TG_PADDED, torch.tensor(IL), torch.tensor(TL), torch.tensor(0))


def test_engine_checks_lengths_on_each_call():
    """Lengths that are graph inputs reach the engine's checks (eager's), per call."""
    ort = ORTModule(CTCHead())
    ort(feats(), TG_PADDED, torch.tensor(IL), torch.tensor(TL)).backward()
    with pytest.raises(ortmod.InvalidInputError, match=r"input_lengths\[0\] = 15 is outside \[0, 14\]"):
        ort(feats(), TG_PADDED, torch.tensor([15, 11, 8]), torch.tensor(TL))


def test_loss_value_is_eagers_to_rounding():
    # a direct check next to run_both's: the float64 loss agrees with eager's to 1e-12
    x, m = feats().double(), CTCHead(reduction="sum").double()
    want = m(x, TG_PADDED, torch.tensor(IL), torch.tensor(TL))
    got = ORTModule(copy.deepcopy(m))(x, TG_PADDED, torch.tensor(IL), torch.tensor(TL))
    rel_close("loss", got, want, rtol=1e-12)


class Wav2Vec2LikeCTC(nn.Module):
    """Wav2Vec2ForCTC's loss path in small: a branch on a label value (which real values decide
    on this path, and a guard checks per call), input lengths by integer floor division of a
    mask's sum (torch's reference of it reaches prims.signbit, whose fake dtype torch 2.13 gets
    wrong), masked_select targets."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(2)
        self.proj = nn.Linear(6, 6)

    def forward(self, feats, labels, frames_mask):
        if labels.max() >= 6:
            raise ValueError("label values must be < 6")
        input_lengths = torch.div(frames_mask.sum(-1) - 1, 2, rounding_mode="floor") + 1
        lp = self.proj(feats).log_softmax(-1).transpose(0, 1)
        mask = labels >= 0
        return F.ctc_loss(lp, labels.masked_select(mask), input_lengths, mask.sum(-1), reduction="sum")


def test_a_wav2vec2_like_loss_with_a_branch_on_labels_matches_eager():
    from torch._decomp import decomposition_table
    signbit = decomposition_table[torch.ops.aten.signbit.default]
    labels = torch.tensor([[1, 2, 2, 3, -100], [4, -100, 4, 1, -100], [2, 3, -100, -100, -100]])
    frames = torch.ones(3, 27, dtype=torch.long)
    frames[1, 20:] = 0

    def call(k):
        return torch.randn(3, 14, 6, generator=torch.Generator().manual_seed(k)), labels, frames

    ort = run_both(Wav2Vec2LikeCTC(), *call(0), calls=2, make_inputs=call)
    on_this_path(ort)
    assert decomposition_table[torch.ops.aten.signbit.default] is signbit     # torch's table as it was
