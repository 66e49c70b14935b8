"""A user's torch.autograd.Function inside ORTModule runs the user's own forward and backward
(ortmod/_pyop.py, csrc/ops/callback.c): engine ops around it, eager's exact gradients."""
import copy

import pytest
import torch
import torch.nn as nn

import ortmod
from ortmod import DebugOptions, ORTModule
from test_semantics import rel_close


class GradReverse(torch.autograd.Function):
    """Identity forward, gradient times -alpha (domain-adversarial training)."""

    @staticmethod
    def forward(ctx, x, alpha):
        ctx.alpha = alpha
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return -ctx.alpha * g, None


class StraightThrough(torch.autograd.Function):
    """round() forward; the gradient passes where |x| < 2 (a clipped straight-through estimator)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return torch.round(x)

    @staticmethod
    def backward(ctx, g):
        x, = ctx.saved_tensors
        return g * (x.abs() < 2).to(g.dtype)


class ScaleAndShift(torch.autograd.Function):
    """Two tensor inputs (the second may not require grad), two outputs, a constant; backward
    honours needs_input_grad."""
    seen_needs = []

    @staticmethod
    def forward(ctx, x, y, k):
        ctx.save_for_backward(x, y)
        ctx.k = k
        return x * y * k, x + k

    @staticmethod
    def backward(ctx, ga, gb):
        x, y = ctx.saved_tensors
        ScaleAndShift.seen_needs.append(tuple(ctx.needs_input_grad))
        gx = (ga * y * ctx.k if ga is not None else 0) + (gb if gb is not None else 0)
        gy = ga * x * ctx.k if ctx.needs_input_grad[1] and ga is not None else None
        return gx, gy, None


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c = nn.Linear(6, 6), nn.Linear(6, 6), nn.Linear(6, 3)

    def forward(self, x, z):
        h = torch.tanh(self.a(x))
        h = StraightThrough.apply(GradReverse.apply(h, 0.7) * 3) / 3
        s, t = ScaleAndShift.apply(self.b(h), z, 0.5)
        return self.c(s + t * t)


def step_parity(model, make_inputs, calls=3, **ort_kwargs):
    eager, ort = copy.deepcopy(model), ORTModule(copy.deepcopy(model), **ort_kwargs)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.05)
    opt_o = torch.optim.SGD(ort.parameters(), lr=0.05)
    for call in range(calls):
        xs = make_inputs(call)
        ye, yo = eager(*xs), ort(*xs)
        rel_close(f"call {call} output", yo, ye)
        w = torch.randn_like(ye)
        (ye * w).sum().backward()
        (yo * w).sum().backward()
        for (n, pe), (_, po) in zip(eager.named_parameters(), ort.named_parameters()):
            rel_close(f"call {call} grad of {n}", po.grad, pe.grad)
        opt_e.step(); opt_o.step(); opt_e.zero_grad(); opt_o.zero_grad()
    for (n, pe), (_, po) in zip(eager.named_parameters(), ort.named_parameters()):
        rel_close(f"{n} after SGD", po, pe)
    return ort


def test_user_functions_run_their_own_backward():
    torch.manual_seed(0)
    sizes = [5, 9, 5]       # a new batch size re-plans: the output shapes come from the Function
    ScaleAndShift.seen_needs.clear()
    step_parity(Model(), lambda i: (torch.randn(sizes[i], 6), torch.randn(sizes[i], 6)))
    # z does not require grad: the user's backward is told so, as in eager
    assert ScaleAndShift.seen_needs and all(n == (True, False, False) for n in ScaleAndShift.seen_needs)


def test_inputs_that_require_grad_reach_the_function():
    class M(nn.Module):
        def forward(self, x):
            return GradReverse.apply(x * 2, 0.25)
    x = torch.randn(4, 3, requires_grad=True)
    xo = x.detach().clone().requires_grad_()
    ORTModule(M())(xo).sum().backward()
    M()(x).sum().backward()
    rel_close("input grad", xo.grad, x.grad)


def test_two_forwards_before_backward():
    torch.manual_seed(1)
    m = Model()
    ort = ORTModule(copy.deepcopy(m))
    x1, x2, z = torch.randn(4, 6), torch.randn(4, 6), torch.randn(4, 6)
    lo = ort(x1, z).sum() + 2 * ort(x2, z).sum()
    le = m(x1, z).sum() + 2 * m(x2, z).sum()
    lo.backward(); le.backward()
    for (n, pe), (_, po) in zip(m.named_parameters(), ort.named_parameters()):
        rel_close(f"grad of {n}", po.grad, pe.grad)


def test_inference_runs_the_forward():
    m = Model().eval()
    ort = ORTModule(copy.deepcopy(m)).eval()
    x, z = torch.randn(3, 6), torch.randn(3, 6)
    with torch.no_grad():
        rel_close("eval output", ort(x, z), m(x, z))


def test_inline_when_asked():
    """inline_autograd_functions: the engine differentiates the forward (identity), so a
    gradient reversal does not reverse: the documented difference, asked for by the user."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(3, 3)

        def forward(self, x):
            return GradReverse.apply(self.a(x), 1.0)
    m = M()
    ort = ORTModule(copy.deepcopy(m), debug_options=DebugOptions(inline_autograd_functions=True))
    x = torch.randn(2, 3)
    ort(x).sum().backward()
    m(x).sum().backward()
    rel_close("inlined grad", ort._original_module.a.weight.grad, -m.a.weight.grad)


def test_user_exception_propagates():
    class Fails(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, g):
            raise ValueError("backward says no")

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(3, 3)

        def forward(self, x):
            return Fails.apply(self.a(x))
    y = ORTModule(M())(torch.randn(2, 3)).sum()
    with pytest.raises(ValueError, match="backward says no"):
        y.backward()


def test_reentrant_checkpoint_is_refused_by_name():
    import torch.utils.checkpoint as cp

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(3, 3)

        def forward(self, x):
            return cp.checkpoint(self.a, x, use_reentrant=True)
    with pytest.raises(ortmod.UnsupportedModelError, match="CheckpointFunction"):
        ORTModule(M())(torch.randn(2, 3, requires_grad=True))


def test_engine_without_a_client_refuses_python_op():
    """The native runner has no Python: a model holding a PythonOp is refused by name."""
    from ortmod import _C, _capture

    class M(nn.Module):
        def forward(self, x):
            return StraightThrough.apply(x)
    exported = _capture.export(M(), _capture.flatten_inputs((torch.randn(2, 3),), {}))
    engine = _C.Engine(exported.onnx_bytes, [False])
    with pytest.raises(_C.UnsupportedOpError, match="PythonOp"):
        engine.forward([torch.randn(2, 3)], False)


@pytest.mark.parametrize("shapes,match", [
    (lambda outs: [], r"the PythonOp shape callback gave 0 shapes for \d+ outputs"),
    (lambda outs: [[1] * 9 for _ in outs], r"PythonOp output 0 has rank 9 \(at most 8\)"),
])
def test_a_bad_shape_callback_is_an_error_that_says_what(shapes, match):
    """The binding's own errors from a PythonOp's shape callback (om_status_newf's messages)."""
    from ortmod import _C, _capture

    class M(nn.Module):
        def forward(self, x):
            return StraightThrough.apply(x)
    exported = _capture.export(M(), _capture.flatten_inputs((torch.randn(2, 3),), {}))
    engine = _C.Engine(exported.onnx_bytes, [False], callback=lambda phase, fid, ins, outs: shapes(outs))
    with pytest.raises(_C.EngineError, match=match):
        engine.forward([torch.randn(2, 3)], False)


def test_inside_a_transformers_model():
    transformers = pytest.importorskip("transformers")

    class ReversedGelu(nn.Module):
        """GPT-2's MLP activation through both Functions: the model trains with their gradients."""
        def forward(self, x):
            return StraightThrough.apply(GradReverse.apply(torch.nn.functional.gelu(x), 0.3) * 4) / 4

    torch.manual_seed(0)
    cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=2, vocab_size=50, n_positions=16,
                                  resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    model = transformers.GPT2LMHeadModel(cfg)
    for block in model.transformer.h:
        block.mlp.act = ReversedGelu()

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.m = model

        def forward(self, ids):
            return self.m(input_ids=ids, labels=ids).loss

    g = torch.Generator().manual_seed(3)
    batches = [torch.randint(0, 50, (2, n), generator=g) for n in (12, 12, 9)]
    eager, ort = LM(), ORTModule(copy.deepcopy(LM()))
    ort._original_module.load_state_dict(eager.state_dict())
    for ids in batches:
        le, lo = eager(ids), ort(ids)
        rel_close("loss", lo, le)
        le.backward(); lo.backward()
        for (n, pe), (_, po) in zip(eager.named_parameters(), ort.named_parameters()):
            rel_close(f"grad of {n}", po.grad, pe.grad, rtol=1e-3)
            pe.grad = po.grad = None


def test_inlined_function_values_are_guarded():
    """Inlined, a Function's forward is part of the graph: a .item() in it is frozen and guarded."""
    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * x.abs().max().item()

        @staticmethod
        def backward(ctx, g):
            return g

    class M(nn.Module):
        def forward(self, x):
            return Scale.apply(x)
    ort = ORTModule(M(), debug_options=DebugOptions(inline_autograd_functions=True))
    with pytest.warns(ortmod._semantics.TraceHazardWarning):
        a = ort(torch.ones(3))
    b = ort(torch.full((3,), 2.0))                  # another max: re-exported, not stale
    rel_close("first", a, torch.ones(3))
    rel_close("second", b, torch.full((3,), 4.0))
