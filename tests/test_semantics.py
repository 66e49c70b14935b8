"""Capture keeps PyTorch's training semantics, or refuses by name (ortmod/capture/tracing.py, ortmod/capture/rules/symbolics.py).

Each case runs one module eagerly and through ORTModule from identical weights, on inputs that
require grad, and compares the output, every input and parameter gradient (relative to its own
size) and whether a gradient exists at all. The patterns are the ones real training code uses:
stop-gradients, arguments torch's exporter drops, values Python takes out of tensors.
"""
import copy
import math
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import ortmod
from ortmod import DebugOptions, ORTModule
from oputil import Fn

RTOL, ATOL = 1e-4, 1e-6


def rel_close(what, got, want, rtol=RTOL):
    """Closeness relative to the tensor's own size: a gradient of 1e-3 everywhere is compared at 1e-7."""
    got, want = got.detach().double(), want.detach().double()
    assert got.shape == want.shape, f"{what}: shape {tuple(got.shape)} != {tuple(want.shape)}"
    finite = want[torch.isfinite(want)]
    scale = finite.abs().max().item() if finite.numel() else 0.0
    torch.testing.assert_close(got, want, rtol=rtol, atol=ATOL + rtol * scale, equal_nan=True,
                               msg=lambda m: f"{what}: {m}")


def run_both(module, *inputs, grad_inputs=True, calls=1, make_inputs=None):
    """Eager and ORTModule on copies of ``module``; compares outputs and gradients per call."""
    eager = copy.deepcopy(module)
    ort = ORTModule(copy.deepcopy(module))
    for call in range(calls):
        xs = make_inputs(call) if make_inputs else inputs
        xe = [x.detach().clone().requires_grad_(grad_inputs and x.is_floating_point()) for x in xs]
        xo = [x.detach().clone().requires_grad_(grad_inputs and x.is_floating_point()) for x in xs]
        ye, yo = eager(*xe), ort(*xo)
        rel_close(f"call {call} output", yo, ye)
        w = torch.randn_like(ye.detach()) if ye.dim() else torch.tensor(1.0, dtype=ye.dtype)
        (ye * w).sum().backward()
        (yo * w).sum().backward()
        for i, (a, b) in enumerate(zip(xo, xe)):
            assert (a.grad is None) == (b.grad is None), f"call {call} input {i}: gradient presence differs"
            if b.grad is not None:
                rel_close(f"call {call} grad of input {i}", a.grad, b.grad)
        for (n, pe), (_, po) in zip(eager.named_parameters(), ort.named_parameters()):
            assert (po.grad is None) == (pe.grad is None), f"call {call} {n}: gradient presence differs"
            if pe.grad is not None:
                rel_close(f"call {call} grad of {n}", po.grad, pe.grad)
                pe.grad = po.grad = None
    return ort


# ---- stop-gradient ------------------------------------------------------------------------------

class Detached(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 6)

    def forward(self, x):
        h = self.a(x)
        return self.b(h) * h.detach() + h


class NoGradBlock(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 6)

    def forward(self, x):
        h = torch.tanh(self.a(x))
        with torch.no_grad():
            scale = h.abs().mean(dim=-1, keepdim=True) + 1.0
            target = self.b(h)
        return (h / scale - target) ** 2


class OnlyDetachedPath(nn.Module):
    """b is reached only through a detach: eager gives it no gradient at all (None)."""
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 6)

    def forward(self, x):
        return self.a(x) + self.b(x).detach()


class ConvBatchNorm(nn.Module):
    """Conv outputs are traced with requires_grad=0 annotations: a stop-gradient must not read them.
    (No bias before the BatchNorm: its gradient is zero up to rounding noise.)"""
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(3, 4, 3, bias=False), nn.BatchNorm2d(4), nn.ReLU(), nn.Conv2d(4, 2, 1))

    def forward(self, x):
        return self.net(x)


@pytest.mark.parametrize("module,shape", [(Detached(), (4, 6)), (NoGradBlock(), (4, 6)),
                                          (OnlyDetachedPath(), (4, 6)), (ConvBatchNorm(), (2, 3, 7, 7))],
                         ids=["detach", "no_grad", "only-detached-path", "conv-batchnorm"])
def test_stop_gradient(module, shape):
    run_both(module, torch.randn(*shape))


class InplaceUnderNoGrad(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)
        with torch.no_grad():
            h.mul_(0.5)
        return h


def test_inplace_under_no_grad_is_refused():
    with pytest.raises(ortmod.UnsupportedModelError, match="in-place .*no_grad"):
        ORTModule(InplaceUnderNoGrad())(torch.randn(2, 4))


# ---- arguments the stock exporter drops ---------------------------------------------------------

class EmbeddingBag(nn.Module):
    def __init__(self, functional=False):
        super().__init__()
        self.functional = functional
        self.emb = nn.Embedding(10, 5, padding_idx=0)
        self.lin = nn.Linear(5, 3)

    def forward(self, ids):
        e = F.embedding(ids, self.emb.weight, padding_idx=3) if self.functional else self.emb(ids)
        return self.lin(e)


@pytest.mark.parametrize("functional", [False, True], ids=["module", "functional"])
def test_embedding_padding_idx_gets_no_gradient(functional):
    ids = torch.tensor([[0, 3, 5, 0], [2, 3, 3, 9]])
    ort = run_both(EmbeddingBag(functional), ids, grad_inputs=False)
    assert ort is not None


def _export_path():
    return ortmod.DebugOptions().capture == "export"


def test_embedding_max_norm_is_refused():
    # it renormalizes the weight in place: the TorchScript path names max_norm, the torch.export
    # path the parameter changed in place
    m = nn.Embedding(10, 4, max_norm=1.0)
    with pytest.raises(ortmod.UnsupportedModelError, match="max_norm|mutates parameter 'weight' in place"):
        ORTModule(m)(torch.tensor([1, 2, 3]))


@pytest.mark.parametrize("module,shape", [
    (nn.AvgPool2d(3, stride=2, padding=1, divisor_override=5), (2, 3, 9, 9)),
    (nn.AvgPool3d(2, divisor_override=3), (1, 2, 4, 6, 4)),
    (nn.Softplus(beta=2.0, threshold=1.5), (4, 7)),
    (nn.Softplus(), (4, 7)),
], ids=["avgpool2d-divisor", "avgpool3d-divisor", "softplus-threshold", "softplus-default"])
def test_arguments_are_kept(module, shape):
    x = torch.randn(*shape) * 3
    run_both(module, x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_log_sigmoid_extremes(dtype):
    # torch's TorchScript rule, Log(Sigmoid(x)): -inf below -104 (float32) / -745 (float64),
    # 0 for -exp(-x) at large x, 3.6e-8 relative off at x = 20 in float64
    x = torch.tensor([-1e3, -800.0, -120.0, -20.0, -1.0, 0.0, 1.0, 17.0, 20.0, 40.0, 120.0], dtype=dtype)
    xe, xo = x.clone().requires_grad_(), x.clone().requires_grad_()
    ye, yo = F.logsigmoid(xe), ORTModule(Fn(F.logsigmoid))(xo)
    rtol = 1e-12 if dtype == torch.float64 else 1e-6
    torch.testing.assert_close(yo, ye, rtol=rtol, atol=0)      # relative, elementwise: -exp(-120) too
    w = torch.linspace(-1, 1, x.numel(), dtype=dtype)
    (ye * w).sum().backward()
    (yo * w).sum().backward()
    torch.testing.assert_close(xo.grad, xe.grad, rtol=rtol, atol=0)


class MoveDim(nn.Module):
    def __init__(self, src, dst):
        super().__init__()
        self.src, self.dst = src, dst
        self.lin = nn.Linear(3, 3)

    def forward(self, x):                       # the channel dim (3) last, a linear, and back
        return torch.movedim(self.lin(torch.movedim(x, self.src, self.dst)), self.dst, self.src)


@pytest.mark.parametrize("src,dst", [(1, -1), (-3, 3), (1, 3), ((1, -1), (-1, 1)), ((-3, 0), (3, 2))])
def test_movedim_negative_dims(src, dst):
    # torch's TorchScript rule indexed its perm with negative dims as they were: movedim(-1, 1)
    # on rank 4 exported Transpose perm [0, -1, 1, 2] ('invalid perm' in the gradient)
    x = torch.randn(2, 3, 4, 3)
    run_both(MoveDim(src, dst), x)


def test_kl_div_nonpositive_targets():
    class KL(nn.Module):
        def forward(self, x, t):
            return F.kl_div(F.log_softmax(x, -1), t, reduction="batchmean")
    x = torch.randn(4, 5)
    t = torch.softmax(torch.randn(4, 5), -1)
    t[0, 1] = 0.0
    t[2, 3] = 0.0
    run_both(KL(), x, t)


class GaussianNLL(nn.Module):
    def __init__(self, var_shape=None, **kwargs):
        super().__init__()
        self.loss, self.var_shape = nn.GaussianNLLLoss(**kwargs), var_shape

    def forward(self, x, t, v):
        return self.loss(x, t, v)


@pytest.mark.parametrize("kwargs,homoscedastic", [({}, False), ({"eps": 0.1, "full": True, "reduction": "sum"}, False),
                                                  ({}, True), ({"reduction": "none"}, False)],
                         ids=["default", "eps-full-sum", "homoscedastic", "none"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
def test_gaussian_nll_var_below_eps(kwargs, homoscedastic, dtype):
    # eager clamps var to eps in place under no_grad: the gradient below eps is var's own,
    # not a clamp's 0 (F.gaussian_nll_loss's body ran unseen by the stop-gradient mode). On
    # 2.14 a clamp at its number bound gives none: the lifted var's clamp must sit below eps in
    # var's own dtype (eps=0.1 in float64 had float32's 0.1 as bound, above it: a var gradient 0)
    x, t = torch.randn(4, 6, dtype=dtype), torch.randn(4, 6, dtype=dtype)
    v = torch.rand(4, 6, dtype=dtype) + 0.5
    v[1] *= 1e-8
    v[2, :3] = 0.0
    if homoscedastic:
        v = v[:, 0]
    run_both(GaussianNLL(**kwargs), x, t, v)


def test_gaussian_nll_negative_var_raises_as_eager():
    x = torch.randn(3, 4)
    # the torch.export path cannot trace the value check (fake tensors have no values): it names
    # the branch instead of capturing a graph without it
    errors, match = (ValueError, ortmod.ExportError) if _export_path() else ValueError, "negative"
    with pytest.raises(errors, match=match):
        ORTModule(GaussianNLL())(x, x.clone(), -torch.ones(3, 4, requires_grad=True))


# ---- dtypes ---------------------------------------------------------------------------------------

class ScalarLosses(nn.Module):
    def forward(self, a, b):
        return F.mse_loss(a, b) + F.kl_div(a, b.abs(), reduction="sum") * 0.5


@pytest.mark.parametrize("shape", [(), (3, 4)], ids=["0-d", "2-d"])
def test_float64_model_keeps_float64(shape):
    """torch's ONNX type promotion takes 0-d float64 values for float32 Python numbers."""
    a, b = torch.randn(shape, dtype=torch.float64), torch.randn(shape, dtype=torch.float64)
    ort = run_both(ScalarLosses(), a, b, calls=2)
    assert ort(a, b).dtype == torch.float64


class MixedDtypes(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("table", torch.zeros(2))    # float32: the model has no one dtype

    def forward(self, a, b):
        return F.mse_loss(a, b)


def test_exported_output_dtype_differing_from_eager_is_refused():
    a, b = torch.randn((), dtype=torch.float64), torch.randn((), dtype=torch.float64)
    if _export_path():     # torch.export's graph has eager's dtypes: it computes in float64
        run_both(MixedDtypes(), a, b)
        return
    with pytest.raises(ortmod.UnsupportedModelError, match="output 0 as FLOAT where eager returns torch.float64"):
        ORTModule(MixedDtypes())(a, b)


def test_empty_batch_gets_empty_and_zero_gradients():
    """torch hands an empty gradient over with a null data pointer: it is still a gradient."""
    x = torch.randn(0, 5)
    run_both(nn.Sequential(nn.LayerNorm(5, eps=1e-3), nn.Linear(5, 3)), x, calls=2)


# ---- group and instance norm: ortmod's decompositions ---------------------------------------------

@pytest.mark.parametrize("module,shape", [
    (nn.GroupNorm(2, 4), (3, 4, 5)), (nn.GroupNorm(3, 6, affine=False), (2, 6, 4, 4)),
    (nn.InstanceNorm1d(3, affine=True), (4, 3, 7)), (nn.InstanceNorm2d(3), (2, 3, 5, 5)),
    (nn.InstanceNorm1d(3), (3, 7))], ids=["group", "group-no-affine", "instance1d", "instance2d", "unbatched"])
def test_group_and_instance_norm(module, shape):
    with torch.no_grad():
        for p in module.parameters():
            p.uniform_(0.5, 1.5)
    run_both(module, torch.randn(shape) * 3 + 1, calls=2,
             make_inputs=lambda call: [torch.randn((shape[0] + call,) + shape[1:]) * 3 + 1])


def test_instance_norm_running_stats():
    m = nn.InstanceNorm2d(3, track_running_stats=True, affine=True)
    with pytest.raises(ortmod.UnsupportedModelError,
                       match="mutates buffer 'running_mean'|InstanceNorm with track_running_stats=True in training"):
        ORTModule(copy.deepcopy(m))(torch.randn(2, 3, 4, 4))
    with torch.no_grad():
        m.running_mean.uniform_(-1, 1)
        m.running_var.uniform_(0.5, 2)
    run_both(m.eval(), torch.randn(2, 3, 4, 4))


# ---- values the trace froze ----------------------------------------------------------------------

class ItemScale(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)
        return h * h.mean().item()


class PythonBranch(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)

    def forward(self, x):
        h = self.a(x)
        if h.sum() > 0:
            return h * 2
        return -h


class SqrtOfLength(nn.Module):
    def forward(self, q, k):
        return (q @ k.transpose(-1, -2)) / math.sqrt(q.size(-1))


def test_item_is_guarded_and_reexported():
    torch.manual_seed(1)
    xs = [torch.randn(3, 4), torch.randn(3, 4) + 2.0, torch.randn(3, 4) - 2.0]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ort = run_both(ItemScale(), calls=3, make_inputs=lambda i: (xs[i],))
    hazards = [w for w in caught if issubclass(w.category, ortmod.capture.errors.TraceHazardWarning)]
    if DebugOptions().capture == "export":
        # torch.export keeps .item() in the graph, read per call without a gradient: nothing is
        # frozen, so nothing to warn of and one export (run_both compared every call with eager)
        assert not hazards, [str(w.message) for w in hazards]
        assert ort._ortmod_export_count == 1
        return
    assert hazards and "test_semantics.py" in str(hazards[0].message), [str(w.message) for w in caught]
    assert ort._ortmod_export_count >= 2      # every new value of .item() is a new export


def test_python_branch_is_guarded():
    torch.manual_seed(2)
    m = PythonBranch()
    # inputs on both sides of the branch
    xs = [torch.full((2, 4), 5.0), torch.full((2, 4), -5.0), torch.full((2, 4), 5.0)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_both(m, calls=3, make_inputs=lambda i: (xs[i] * torch.sign(m.a.weight.sum()),))


def test_number_from_shape_follows_the_length():
    shapes = [(2, 5, 8), (2, 5, 16), (2, 7, 4)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        run_both(SqrtOfLength(), calls=3,
                 make_inputs=lambda i: (torch.randn(*shapes[i]), torch.randn(*shapes[i])))


class HalfTheLength(nn.Module):
    def forward(self, x):
        return x[:, :int(x.size(1) * 0.5)] * 2   # int() of a traced 2.5 froze 2


def test_int_of_a_fraction_is_guarded_by_what_int_gives():
    """The guard compares int(engine value) with what Python's int() gave: the engine's 2.5 is
    still 2, so the graph stays valid (it is not 'a value that differs'); a length whose half
    truncates to another integer re-exports."""
    shapes = [(2, 5), (2, 5), (2, 9)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ort = run_both(HalfTheLength(), calls=3, make_inputs=lambda i: (torch.randn(*shapes[i]),))
    assert ort._ortmod_export_count == 2


def frozen_by_the_trace():
    """Modules whose capture on this path freezes a value Python took from a tensor: a branch on a
    tensor's value on both paths, ``.item()`` on the TorchScript path only (torch.export reads it
    per call in the graph)."""
    return [PythonBranch()] + ([] if DebugOptions().capture == "export" else [ItemScale()])


def test_strict_trace_refuses():
    for module in frozen_by_the_trace():
        ort = ORTModule(module, debug_options=DebugOptions(strict_trace=True))
        with pytest.raises(ortmod.UnsupportedModelError, match=r"test_semantics\.py:\d+"):
            ort(torch.randn(3, 4))


def test_strict_trace_runs_what_is_not_frozen():
    """strict_trace refuses only what the path freezes: where .item() is read per call (torch.export),
    the module runs and matches eager, on values that would each need a new TorchScript export."""
    if DebugOptions().capture != "export":
        pytest.skip("the TorchScript trace freezes .item(): test_strict_trace_refuses")
    m = ItemScale()
    ort = ORTModule(copy.deepcopy(m), debug_options=DebugOptions(strict_trace=True))
    for shift in (0.0, 2.0, -2.0):
        x = torch.randn(3, 4) + shift
        rel_close(f"shift {shift}", ort(x), m(x))
    assert ort._ortmod_export_count == 1


class GroupedQueryAttention(nn.Module):
    def __init__(self, causal):
        super().__init__()
        self.causal = causal
        self.q, self.kv = nn.Linear(8, 8), nn.Linear(8, 4)

    def forward(self, x):
        B, T, _ = x.shape
        q = self.q(x).view(B, T, 4, 2).transpose(1, 2)            # 4 query heads
        k = self.kv(x).view(B, T, 2, 2).transpose(1, 2)           # 2 key/value heads
        return F.scaled_dot_product_attention(q, k, k * 2, is_causal=self.causal, enable_gqa=True)


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_enable_gqa(causal):
    run_both(GroupedQueryAttention(causal), torch.randn(2, 5, 8))


def test_strict_trace_from_the_environment(ortmod_env):
    ortmod_env.setenv("ORTMOD_STRICT_TRACE", "1")
    for module in frozen_by_the_trace():
        with pytest.raises(ortmod.UnsupportedModelError, match="strict_trace"):
            ORTModule(module)(torch.randn(3, 4))


def test_eval_mode_with_grad_enabled_is_differentiated():
    """model.eval() without no_grad (saliency maps, adversarial inputs, validation loops):
    eager records autograd through the eval-mode forward (running stats, no dropout)."""
    torch.manual_seed(3)
    m = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Dropout(0.5), nn.Flatten(),
                      nn.Linear(4 * 5 * 5, 3))
    m.train()
    m(torch.randn(4, 3, 7, 7))          # some running statistics
    m.eval()
    run_both(m, torch.randn(2, 3, 7, 7), calls=2)


class IndexAdd(nn.Module):
    def __init__(self, alpha):
        super().__init__()
        self.alpha = alpha
        self.l = nn.Linear(3, 3)

    def forward(self, x, src):
        index = torch.tensor([0, 2, 0, 4, 2, 2])          # repeated rows add up
        return x.index_add(0, index, self.l(src), alpha=self.alpha)


@pytest.mark.parametrize("alpha", [1, 0.5])
def test_index_add_with_repeated_indices(alpha):
    run_both(IndexAdd(alpha), torch.randn(5, 3), torch.randn(6, 3))


class IndexPutAccumulate(nn.Module):
    def __init__(self, two_dims=False):
        super().__init__()
        self.two_dims = two_dims
        self.l = nn.Linear(3, 3)

    def forward(self, x, src):
        if self.two_dims:                                  # (row, col) pairs, one repeated
            rows, cols = torch.tensor([0, 2, 0, 4, 0, 1]), torch.tensor([1, 1, 1, 0, 2, 1])
            return x.index_put((rows, cols), self.l(src).sum(1), accumulate=True)
        index = torch.tensor([0, 2, 0, 4, 2, 2])          # repeated rows add up
        return x.index_put((index,), self.l(src), accumulate=True)


@pytest.mark.parametrize("two_dims", [False, True], ids=["rows", "pairs"])
def test_index_put_accumulate_with_repeated_indices(two_dims):
    """torch's symbolic scatters into zeros without a reduction and adds: a repeated index kept
    only its last value. ortmod's gives one ScatterND with reduction add."""
    run_both(IndexPutAccumulate(two_dims), torch.randn(5, 3), torch.randn(6, 3))


class MaskedAccumulate(nn.Module):
    def forward(self, x):
        return x.index_put((x > 0,), torch.tensor(1.0), accumulate=True)


def test_index_put_accumulate_with_a_mask_is_refused_by_name():
    """torch's symbolic exports it as masked_fill, which replaces where eager adds (the
    torch.export path's index_put adds, as eager)."""
    if _export_path():
        run_both(MaskedAccumulate(), torch.randn(4, 3))
        return
    with pytest.raises(ortmod.UnsupportedModelError, match="index_put: accumulate=True with a boolean mask"):
        ORTModule(MaskedAccumulate())(torch.randn(4, 3))


class _CountsCalls(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(3, 3)
        self.calls = 0

    def forward(self, x):
        self.calls += 1             # eager: 1, 2, 3, ... ; ortmod runs forward only to export
        return self.lin(x)


@pytest.mark.parametrize("capture", ["torchscript", "export"])
def test_a_forward_changing_a_plain_attribute_is_named(capture):
    # a warning (Swin fits its window to the input in forward, the same every call: harmless),
    # an error under strict_trace
    with pytest.warns(ortmod.capture.errors.TraceHazardWarning, match=r"_CountsCalls.calls \(0 -> \d\)"):
        ORTModule(_CountsCalls(), ortmod.DebugOptions(capture=capture))(torch.randn(2, 3))
    with pytest.raises(ortmod.UnsupportedModelError, match=r"_CountsCalls.calls .*strict_trace is on"):
        ORTModule(_CountsCalls(), ortmod.DebugOptions(capture=capture, strict_trace=True))(torch.randn(2, 3))


# ---- attention: a fully masked row --------------------------------------------------------------

class MaskedSDPA(nn.Module):
    def __init__(self, mask):
        super().__init__()
        self.register_buffer("mask", mask)

    def forward(self, q, k, v):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=self.mask)


@pytest.mark.parametrize("kind", ["bool", "float", "float-learned-shape"])
def test_sdpa_fully_masked_row_gives_zero_as_eager(kind):
    # eager's SDPA gives a row whose keys are all masked 0 (its math path's _safe_softmax and the
    # CPU flash kernel alike), for a float mask of -inf as for a bool one; ortmod gave NaN
    # for the float mask (found by the model fuzzer, seed 40635: nn.MultiheadAttention merges
    # attn_mask and key_padding_mask into one float mask)
    L = 5
    if kind == "bool":
        mask = torch.ones(L, L, dtype=torch.bool)
        mask[1] = False
    else:
        mask = torch.zeros(2, 1, L, L) if kind == "float-learned-shape" else torch.zeros(L, L)
        mask[..., 1, :] = float("-inf")
        mask[..., 3, 2:] = float("-inf")
    q, k, v = (torch.randn(2, 3, L, 4) for _ in range(3))
    run_both(MaskedSDPA(mask), q, k, v)


def test_multihead_attention_with_both_masks_fully_masking_a_row():
    L, B, E = 5, 2, 8
    attn_mask = torch.zeros(L, L, dtype=torch.bool)
    attn_mask[1, [0, 4]] = True
    kpm = torch.zeros(B, L, dtype=torch.bool)
    kpm[1, 1:4] = True          # with attn_mask: query 1 of the second sequence sees no key

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.mha = nn.MultiheadAttention(E, 2, batch_first=True)

        def forward(self, x):
            return self.mha(x, x, x, attn_mask=attn_mask, key_padding_mask=kpm, need_weights=False)[0]

    torch.manual_seed(0)
    run_both(M(), torch.randn(B, L, E))
