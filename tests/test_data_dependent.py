"""Data-dependent shapes inside the graph (issue 37): NonZero and the segmented plans.

x[mask], masked_select, nonzero, torch.where(cond) export through ONNX NonZero, whose output size
is a value. The engine plans such a graph in segments (csrc/plan/plan.h): it runs up to the
NonZero, counts, and plans the rest for that count, caching the plan under (input shapes,
counts); the backward is planned with the same key. Every model here trains with SGD beside an
eager copy, on both capture paths: the loss of every step and every parameter's gradient must
agree, a count that changes must not export again, a count seen before must not plan again.
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from ortmod import ORTModule
from ortmod._explain import engine_reports


@pytest.fixture(params=["torchscript", "export"])
def capture(request, ortmod_env):
    ortmod_env.setenv("ORTMOD_CAPTURE", request.param)
    return request.param


# ---- models ----------------------------------------------------------------------------------

class BoolIndex(nn.Module):
    """x[mask] with a mask from the data (the threshold is an input: the count is steered)."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x, t):
        h = self.lin(x)
        sel = h[h[:, 0] > t]
        return (sel * sel).sum() + h.mean()


class MaskedSelect(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x, t):
        h = torch.tanh(self.lin(x))
        v = torch.masked_select(h, h > t)
        return (v * v).sum() + 0.1 * h.sum()


class NonzeroGather(nn.Module):
    """nonzero, then index_select of rows and gather along the found columns."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 5)

    def forward(self, x, t):
        h = self.lin(x)
        rows = torch.index_select(h, 0, torch.nonzero(h[:, 1] > t).squeeze(1))
        nz = torch.nonzero(h > t)                       # [count, 2]
        picked = torch.gather(h[nz[:, 0]], 1, nz[:, 1:2])
        return rows.pow(2).sum() + (picked * 0.5).sum()


class Top2MoE(nn.Module):
    """softmax -> top-2 -> per expert torch.where(idx == e) -> the expert on its tokens -> index_add_."""

    def __init__(self, d=8, n_exp=4):
        super().__init__()
        self.router = nn.Linear(d, n_exp)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(d, 16), nn.GELU(), nn.Linear(16, d))
                                     for _ in range(n_exp))

    def forward(self, x):
        probs = F.softmax(self.router(x), dim=-1)
        w, idx = torch.topk(probs, 2, dim=-1)
        w = w / w.sum(-1, keepdim=True)
        out = torch.zeros_like(x)
        for e, expert in enumerate(self.experts):
            tok, slot = torch.where(idx == e)
            y = expert(x[tok]) * w[tok, slot].unsqueeze(-1)
            out.index_add_(0, tok, y)
        return (out * out).mean() + 0.01 * probs.pow(2).sum()


class TinyGCN(nn.Module):
    """A GCN-style layer over the edge list nonzero finds in an adjacency matrix."""

    def __init__(self, d=6):
        super().__init__()
        self.lin, self.out = nn.Linear(d, d), nn.Linear(d, 1)

    def forward(self, x, adj):
        src, dst = torch.nonzero(adj > 0.5, as_tuple=True)
        h = self.lin(x)
        agg = torch.zeros_like(h).index_add(0, dst, h[src])
        deg = torch.zeros(h.shape[0], dtype=h.dtype).index_add(0, dst, torch.ones_like(dst, dtype=h.dtype))
        return self.out(torch.relu(agg / deg.clamp(min=1).unsqueeze(1) + h)).pow(2).mean()


class Nested(nn.Module):
    """A selection of a selection (the second count depends on the first segment's values), and
    boolean-mask assignment with values per selected row (ScatterND at NonZero)."""

    def __init__(self):
        super().__init__()
        self.lin, self.lin2 = nn.Linear(4, 4), nn.Linear(4, 4)

    def forward(self, x):
        h = self.lin(x)
        a = h[h[:, 0] > 0]
        b = self.lin2(a)
        c = b[b[:, 1] > 0]
        out = h.clone()
        m = h[:, 2] > 0
        out[m] = torch.tanh(h[m]) * 2
        return (c * c).sum() + a.sum() * 0.1 + (out * out).mean()


class CountAsNumber(nn.Module):
    """The selection's length used as a number (arange, a divisor): a shape of the later segment."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)

    def forward(self, x):
        h = self.lin(x)
        sel = h[h[:, 0] > 0]
        n = sel.shape[0]
        pos = torch.arange(n, dtype=h.dtype).unsqueeze(1)
        return ((sel + pos) ** 2).sum() / (n + 1) + h.sum() * 0.01


# ---- harness ---------------------------------------------------------------------------------

def rel(a, b):
    """|a - b| relative to b's own size."""
    return ((a - b).abs().max() / b.abs().max().clamp(min=1e-12)).item() if b.numel() else 0.0


def train_beside_eager(model, batches, lr=0.1, tol=1e-4):
    """SGD steps of ORTModule(model) beside an eager copy: loss and every gradient compared each
    step. Returns the ORTModule."""
    ref = copy.deepcopy(model)
    ort = ORTModule(model)
    opt, ref_opt = torch.optim.SGD(model.parameters(), lr=lr), torch.optim.SGD(ref.parameters(), lr=lr)
    for step, args in enumerate(batches):
        loss, ref_loss = ort(*args), ref(*args)
        loss.backward()
        ref_loss.backward()
        assert rel(loss.detach(), ref_loss.detach()) < tol, (step, loss.item(), ref_loss.item())
        for (name, p), q in zip(model.named_parameters(), ref.parameters()):
            assert p.grad is not None, (step, name)
            assert rel(p.grad, q.grad) < tol, (step, name, rel(p.grad, q.grad))
        opt.step()
        ref_opt.step()
        opt.zero_grad()
        ref_opt.zero_grad()
    return ort


def plan_cache(ort):
    reports = engine_reports(ort)
    assert len(reports) == 1
    return reports[0]["plan_cache"]


# ---- tests -----------------------------------------------------------------------------------

def test_bool_index_counts_change_none_all_and_repeat(capture):
    """x[mask]: some rows, none (an empty selection), all, a new count, and a count seen
    before: one export for all of them, one plan per new count, none for a repeated one."""
    torch.manual_seed(0)
    x = torch.randn(6, 4)
    thresholds = [0.0, 100.0, -100.0, 0.3, 0.0, 100.0]
    model = BoolIndex()
    # lr 0: the weights stay, so the counts are the ones computed here
    ort = train_beside_eager(model, [(x, torch.tensor(t)) for t in thresholds], lr=0.0)
    assert ort._ortmod_export_count == 1, "a new count is a value, not a shape: no export"
    cache = plan_cache(ort)
    # segment 0 once, then segment 1 per distinct count (0 rows, 6 rows and the others)
    distinct = {int((model.lin(x)[:, 0] > t).sum()) for t in thresholds}
    assert cache["planned"] == 1 + len(distinct), (cache, distinct)
    assert {0, 6} <= distinct


def test_bool_index_trains_with_parity(capture):
    torch.manual_seed(1)
    batches = [(torch.randn(8, 4), torch.tensor(0.1 * (i % 3))) for i in range(6)]
    ort = train_beside_eager(BoolIndex(), batches)
    assert ort._ortmod_export_count == 1


def test_masked_select(capture):
    torch.manual_seed(2)
    batches = [(torch.randn(5, 4), torch.tensor(t)) for t in (0.1, 0.5, 2.0, -2.0, 0.1)]
    ort = train_beside_eager(MaskedSelect(), batches)
    assert ort._ortmod_export_count == 1


def test_nonzero_index_select_gather(capture):
    torch.manual_seed(3)
    batches = [(torch.randn(6, 4), torch.tensor(t)) for t in (0.0, 0.4, 50.0, 0.0)]
    ort = train_beside_eager(NonzeroGather(), batches)
    assert ort._ortmod_export_count == 1


def test_top2_moe_router(capture):
    """Four data-dependent nodes in sequence (one torch.where per expert): segments of segments."""
    torch.manual_seed(4)
    batches = [(torch.randn(10, 8),) for _ in range(5)]
    ort = train_beside_eager(Top2MoE(), batches, lr=0.5)
    assert ort._ortmod_export_count == 1
    assert plan_cache(ort)["planned"] >= 5      # segment 0, then at least one plan per expert's count


def test_gcn_over_nonzero_edges(capture):
    torch.manual_seed(5)
    batches = [(torch.randn(7, 6), torch.rand(7, 7)) for _ in range(4)]
    batches.append((torch.randn(7, 6), torch.zeros(7, 7)))     # no edge at all
    batches.append((torch.randn(7, 6), torch.ones(7, 7)))      # every edge
    ort = train_beside_eager(TinyGCN(), batches)
    assert ort._ortmod_export_count == 1


def test_nested_selection_and_mask_assignment(capture):
    torch.manual_seed(7)
    batches = [(torch.randn(12, 4),) for _ in range(5)]
    ort = train_beside_eager(Nested(), batches)
    assert ort._ortmod_export_count == 1


def test_count_used_as_a_number(capture):
    torch.manual_seed(11)
    ort = train_beside_eager(CountAsNumber(), [(torch.randn(7, 4),) for _ in range(5)])
    assert ort._ortmod_export_count == 1, "the count is no trace constant: it changes without an export"


def test_recompute_level_2(capture, ortmod_env):
    """Recompute clones forward nodes into the backward (the last segment); NonZero itself is
    never cloned (a random-like op: its output is kept)."""
    ortmod_env.setenv("ORTMODULE_MEMORY_OPT_LEVEL", "2")
    torch.manual_seed(8)
    train_beside_eager(Top2MoE(), [(torch.randn(10, 8),) for _ in range(3)], lr=0.5)
    train_beside_eager(Nested(), [(torch.randn(12, 4),) for _ in range(3)])


def test_small_plan_cache_evicts_and_stays_right(capture, ortmod_env):
    """Past ORTMOD_MAX_CACHED_PLANS the segments' plans are evicted like any other (bounded); a
    plan evicted while a forward's stash still holds it serves that stash's backward."""
    ortmod_env.setenv("ORTMOD_MAX_CACHED_PLANS", "2")
    torch.manual_seed(6)
    model = BoolIndex()
    ref = copy.deepcopy(model)
    ort = ORTModule(model)
    xs = [(torch.randn(8, 4), torch.tensor(t)) for t in (0.0, 0.5, -0.5, 1.0)]
    losses = [ort(*a) for a in xs]                  # four forwards, then their backwards
    sum(losses).backward()
    sum(ref(*a) for a in xs).backward()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert rel(p.grad, q.grad) < 1e-4
    cache = plan_cache(ort)
    assert cache["plans"] <= 2 and cache["evicted"] > 0, cache


def test_output_of_data_dependent_size(capture):
    """The selection itself as the module's output: its size comes from the engine, per call."""
    model = BoolIndex()

    class Sel(nn.Module):
        def __init__(self, lin):
            super().__init__()
            self.lin = lin

        def forward(self, x, t):
            h = self.lin(x)
            return h[h[:, 0] > t]

    ort = ORTModule(Sel(model.lin))
    x = torch.randn(6, 4)
    for t in (0.0, 100.0, -100.0):
        y, want = ort(x, torch.tensor(t)), Sel(model.lin)(x, torch.tensor(t))
        assert y.shape == want.shape
        assert rel(y.detach(), want.detach()) < 1e-5
        y.sum().backward()
    # the graph declares the selection's length symbolic (TorchScript: a dynamic axis; torch.export:
    # its unbacked symbol), never the first call's count
    import onnx
    record = next(iter(ort._ortmod_exports.values()))
    dims = onnx.load_from_string(record.exported.onnx_bytes).graph.output[0].type.tensor_type.shape.dim
    assert dims[0].dim_param and not dims[0].HasField("dim_value"), dims
    with torch.no_grad():
        assert ort(x, torch.tensor(0.0)).shape == want.new_empty(int((model.lin(x)[:, 0] > 0).sum()), 3).shape
    assert ort._ortmod_export_count <= 2        # training, and the no_grad call's inference graph


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_refuses_by_name(capture):
    ort = ORTModule(BoolIndex().cuda())
    with pytest.raises(Exception, match="NonZero"):
        ort(torch.randn(6, 4, device="cuda"), torch.tensor(0.0, device="cuda"))


# ---- OneHot, and a MoE nobody here wrote --------------------------------------------------------

class OneHotMix(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Parameter(torch.randn(5, 3))

    def forward(self, idx):
        return (F.one_hot(idx, 5).to(self.emb.dtype) @ self.emb).pow(2).sum()


def test_one_hot(capture):
    torch.manual_seed(9)
    ort = train_beside_eager(OneHotMix(), [(torch.randint(0, 5, (4, 6)),) for _ in range(3)])
    assert ort._ortmod_export_count == 1
    with pytest.raises(Exception, match="OneHot node .*index 7 is outside"):
        ort(torch.tensor([[1, 7]]))
    with pytest.raises(Exception, match="OneHot node .*index 5 is outside"):    # eager raises for -1 too
        ort(torch.tensor([[1, -1]]))


def test_mixtral_eager_experts_train(ortmod_env):
    """transformers' MixtralForCausalLM with its eager experts (one_hot, nonzero, torch.where per
    expert, index_add_): trains with parity on the product's default capture (auto: torch.export
    cannot trace the loop over the experts found, `expert_mask[expert_idx]` with a data-dependent
    index, and the TorchScript path captures it; the loop's length is a guarded trace value)."""
    transformers = pytest.importorskip("transformers")
    import warnings
    ortmod_env.delenv("ORTMOD_CAPTURE", raising=False)   # auto, whatever the suite's path (make test-export)
    cfg = transformers.MixtralConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                     num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                     num_experts_per_tok=2, max_position_embeddings=64)
    cfg._experts_implementation = "eager"
    torch.manual_seed(10)
    model = transformers.MixtralForCausalLM(cfg)
    ids = [torch.randint(0, 64, (2, 12)) for _ in range(3)]

    class Loss(nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, x):
            return self.m(input_ids=x, labels=x).loss

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")     # the trace's note on the loop over a tensor
        ort = train_beside_eager(Loss(model), [(i,) for i in ids])
    assert ort._ortmod_export_count == 1
