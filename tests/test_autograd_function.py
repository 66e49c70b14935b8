"""A user's torch.autograd.Function inside ORTModule runs the user's own forward and backward
(ortmod/capture/python_op.py, csrc/ops/callback.c): engine ops around it, eager's exact gradients.

Every test runs on both capture paths (ORTMOD_CAPTURE=torchscript and =export): one
mechanism, FunctionSpec / FunctionRunner / the engine's PythonOp, reached by two front ends
(_pyop.capturing_functions and _capture_export's ortmod::python_op).
"""
import copy

import pytest
import torch
import torch.nn as nn

import ortmod
from ortmod import DebugOptions, ORTModule
from test_semantics import rel_close


@pytest.fixture(autouse=True, params=["torchscript", "export"])
def capture(request, ortmod_env):
    ortmod_env.setenv("ORTMOD_CAPTURE", request.param)
    ortmod_env.delenv("ORTMODULE_FALLBACK_POLICY", raising=False)
    return request.param


def capture_module(capture):
    """The path's own export function (for the tests that build an engine by hand)."""
    if capture == "export":
        from ortmod.capture import export as torch_export
        return torch_export.export
    from ortmod.capture import torchscript, flatten
    return torchscript.export


def exports_of(ort):
    """(capture paths used, exports made): the test ran where it meant to, and how often."""
    return {r.exported.capture for r in ort._ortmod_exports.values()}, ort._ortmod_export_count


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
    """SGD steps of eager and ORTModule: outputs, input and parameter gradients per call, the
    parameters after; returns the ORTModule."""
    eager, ort = copy.deepcopy(model), ORTModule(copy.deepcopy(model), **ort_kwargs)
    opt_e = torch.optim.SGD(eager.parameters(), lr=0.05)
    opt_o = torch.optim.SGD(ort.parameters(), lr=0.05)
    for call in range(calls):
        xs = make_inputs(call)
        xe = [x.detach().clone().requires_grad_(x.requires_grad) for x in xs]
        xo = [x.detach().clone().requires_grad_(x.requires_grad) for x in xs]
        ye, yo = eager(*xe), ort(*xo)
        rel_close(f"call {call} output", yo, ye)
        w = torch.randn_like(ye)
        (ye * w).sum().backward()
        (yo * w).sum().backward()
        for k, (a, b) in enumerate(zip(xe, xo)):
            assert (a.grad is None) == (b.grad is None), f"call {call}: input {k} has a gradient on one side only"
            if a.grad is not None:
                rel_close(f"call {call} grad of input {k}", b.grad, a.grad)
        for (n, pe), (_, po) in zip(eager.named_parameters(), ort.named_parameters()):
            assert (pe.grad is None) == (po.grad is None), f"call {call}: {n} has a gradient on one side only"
            if pe.grad is not None:
                rel_close(f"call {call} grad of {n}", po.grad, pe.grad)
        opt_e.step(); opt_o.step(); opt_e.zero_grad(); opt_o.zero_grad()
    for (n, pe), (_, po) in zip(eager.named_parameters(), ort.named_parameters()):
        rel_close(f"{n} after SGD", po, pe)
    return ort


def test_user_functions_run_their_own_backward(capture):
    torch.manual_seed(0)
    sizes = [5, 9, 5]       # a new batch size re-plans: the output shapes come from the Function
    ScaleAndShift.seen_needs.clear()
    ort = step_parity(Model(), lambda i: (torch.randn(sizes[i], 6), torch.randn(sizes[i], 6)))
    # z does not require grad: the user's backward is told so, as in eager
    assert ScaleAndShift.seen_needs and all(n == (True, False, False) for n in ScaleAndShift.seen_needs)
    # dynamic batch: one export, re-planned (the torch.export path's first holds sizes static,
    # and the new batch size exports once more with it symbolic)
    assert exports_of(ort) == ({capture}, 1 if capture == "torchscript" else 2)
    assert len(ort._ortmod_exports[next(iter(ort._ortmod_exports))].exported.functions) == 3


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


def test_engine_without_a_client_refuses_python_op(capture):
    """The native runner has no Python: a model holding a PythonOp is refused by name."""
    from ortmod.capture import torchscript, flatten
    from ortmod import _C

    class M(nn.Module):
        def forward(self, x):
            return StraightThrough.apply(x)
    exported = capture_module(capture)(M(), flatten.flatten_inputs((torch.randn(2, 3),), {}))
    engine = _C.Engine(exported.onnx_bytes, [False])
    with pytest.raises(_C.UnsupportedOpError, match="PythonOp"):
        engine.forward([torch.randn(2, 3)], False)


@pytest.mark.parametrize("shapes,match", [
    (lambda outs: [], r"the PythonOp shape callback gave 0 shapes for \d+ outputs"),
    (lambda outs: [[1] * 9 for _ in outs], r"PythonOp output 0 has rank 9 \(at most 8\)"),
])
def test_a_bad_shape_callback_is_an_error_that_says_what(shapes, match, capture):
    """The binding's own errors from a PythonOp's shape callback (om_status_newf's messages)."""
    from ortmod.capture import torchscript, flatten
    from ortmod import _C

    class M(nn.Module):
        def forward(self, x):
            return StraightThrough.apply(x)
    exported = capture_module(capture)(M(), flatten.flatten_inputs((torch.randn(2, 3),), {}))
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


def test_inlined_function_values_are_guarded(capture):
    """Inlined, a Function's forward is part of the graph: a .item() in it is frozen and guarded
    (TorchScript), or computed in the graph (torch.export: an unbacked number, nothing frozen)."""
    class Scale(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * x.abs().sum().item()     # sum: max is not yet reviewed on the torch.export path

        @staticmethod
        def backward(ctx, g):
            return g

    class M(nn.Module):
        def forward(self, x):
            return Scale.apply(x)
    ort = ORTModule(M(), debug_options=DebugOptions(inline_autograd_functions=True))
    if capture == "torchscript":
        with pytest.warns(ortmod.capture.errors.TraceHazardWarning):
            a = ort(torch.ones(3))
    else:
        a = ort(torch.ones(3))
    b = ort(torch.full((3,), 2.0))                  # another sum: re-exported, not stale
    rel_close("first", a, torch.full((3,), 3.0))
    rel_close("second", b, torch.full((3,), 12.0))


# ---- semantics that both capture paths keep -----------------------------------------------------

class MaxAlongRows(torch.autograd.Function):
    """Row maxima (differentiable), their doubles marked non-differentiable, the argmax (integer)."""

    @staticmethod
    def forward(ctx, x):
        v, i = x.max(dim=1)
        ctx.save_for_backward(i)
        ctx.shape = x.shape
        d = v * 2
        ctx.mark_non_differentiable(d)
        return v, d, i

    @staticmethod
    def backward(ctx, gv, gd, gi):
        i, = ctx.saved_tensors
        return gv.new_zeros(ctx.shape).scatter(1, i[:, None], gv[:, None])


def test_non_differentiable_and_integer_outputs(capture):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(5, 5)

        def forward(self, x):
            v, d, i = MaxAlongRows.apply(torch.tanh(self.l(x)))
            return v * 3, d + 1, i

    eager = M()
    ort = ORTModule(copy.deepcopy(eager))
    x = torch.randn(4, 5)
    ye, yo = eager(x), ort(x)
    # eager: d has no history (mark_non_differentiable), i is an integer tensor
    assert [y.requires_grad for y in yo] == [y.requires_grad for y in ye] == [True, False, False]
    assert torch.equal(yo[2], ye[2])
    w = torch.randn(4)
    ((ye[0] * w).sum() + ye[1].sum()).backward()
    ((yo[0] * w).sum() + yo[1].sum()).backward()
    for (n, pe), (_, po) in zip(eager.named_parameters(), ort.named_parameters()):
        rel_close(f"grad of {n}", po.grad, pe.grad)
    assert exports_of(ort)[0] == {capture}


class Scaled(torch.autograd.Function):
    seen_needs = []

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x * w

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        Scaled.seen_needs.append(tuple(ctx.needs_input_grad))
        return g * w, (g * x).sum(0)


def test_function_under_no_grad_gets_no_gradient(capture):
    """Called inside the forward's own torch.no_grad(), a Function's outputs have no history in
    eager: no gradient flows back through it (the TorchScript path used to let one through)."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(4, 4)
            self.w = nn.Parameter(torch.randn(4))

        def forward(self, x):
            h = self.l(x)
            with torch.no_grad():
                y = Scaled.apply(h, self.w)
            return h * y + Scaled.apply(h, self.w * 0.5)

    Scaled.seen_needs.clear()
    step_parity(M(), lambda i: (torch.randn(3 + i, 4),))
    # one backward per step and side: the call under no_grad gets none
    assert Scaled.seen_needs == [(True, True)] * 6


def test_two_calls_of_one_function_keep_their_own_ctx(capture):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(4, 4), nn.Linear(4, 2)

        def forward(self, x):
            h = GradReverse.apply(self.a(x), 0.5)
            return self.b(GradReverse.apply(torch.tanh(h), 2.0))

    ort = step_parity(M(), lambda i: (torch.randn(5, 4),))
    functions = next(iter(ort._ortmod_exports.values())).exported.functions
    assert [f.constants for f in functions] == [[0.5], [2.0]]


class MatMulT(torch.autograd.Function):
    """x @ w.T with a hand-written backward."""

    @staticmethod
    def forward(ctx, x, w):
        ctx.save_for_backward(x, w)
        return x @ w.t()

    @staticmethod
    def backward(ctx, g):
        x, w = ctx.saved_tensors
        return g @ w, g.t() @ x


def test_parameter_and_input_passed_to_the_function(capture):
    """A parameter given straight to apply and an input that requires grad get eager's
    gradients; the batch size changes between calls."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(3, 4))
            self.l = nn.Linear(3, 2)

        def forward(self, x):
            return self.l(torch.relu(MatMulT.apply(x, self.w)))

    step_parity(M(), lambda i: (torch.randn((5, 8, 5)[i], 4, requires_grad=True),))


class ScaleBy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, n, how):
        ctx.n = n
        return x * n if how == "mul" else x / n

    @staticmethod
    def backward(ctx, g):
        return g * ctx.n, None, None


def test_a_size_as_a_non_tensor_argument(capture):
    """x.shape[0] given to a Function: eager gives it the number of this call (the torch.export
    path specialises the size and exports again for another one)."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.l = nn.Linear(3, 3)

        def forward(self, x):
            return ScaleBy.apply(self.l(x), x.shape[0], "mul")

    step_parity(M(), lambda i: (torch.randn((2, 5, 2)[i], 3),))


def test_only_the_users_function_computes_in_torch(capture):
    """The engine does the math: in a warm step, torch runs only what the user's Functions run
    (and the runner's copies of their arguments and results)."""
    from test_dispatch_guard import ALLOWED, OpRecorder
    model = ORTModule(Model())
    x, z = torch.randn(4, 6), torch.randn(4, 6)
    grad = torch.randn(4, 3)
    model(x, z).backward(grad)
    model.zero_grad(set_to_none=True)       # AccumulateGrad's add is torch's job, not looked at here
    with OpRecorder() as rec:
        model(x, z).backward(grad)
    with OpRecorder() as own:       # the Functions by themselves, eager
        h = torch.randn(4, 6, requires_grad=True)
        s, t = ScaleAndShift.apply(StraightThrough.apply(GradReverse.apply(h, 0.7)), torch.randn(4, 6), 0.5)
        torch.autograd.grad((s, t), h, (torch.ones_like(s), torch.ones_like(t)))
    users = {f.overloadpacket.__name__ for f in own.ops}
    moves = {"clone", "copy_", "zero_"}
    torch_did = {f.overloadpacket.__name__ for f in rec.ops} - ALLOWED
    assert torch_did - users - moves == set(), f"torch computed {sorted(torch_did - users - moves)}"
    assert {"round", "abs"} <= torch_did        # the user's own forward and backward did run


# ---- refused by name ----------------------------------------------------------------------------

class Dirty(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x.mul_(2)
        ctx.mark_dirty(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g * 2


def test_in_place_change_of_an_argument_is_refused(capture):
    """Eager changes the caller's tensor; ortmod runs a Function on copies and would not."""
    class M(nn.Module):
        def forward(self, x):
            h = x + 1
            return h + Dirty.apply(h)
    with pytest.raises(RuntimeError, match=r"Dirty .*in place \(ctx.mark_dirty\)"):
        ORTModule(M())(torch.randn(2, 3))


def test_keyword_and_container_arguments_are_refused(capture):
    class Kw(nn.Module):
        def forward(self, x):
            return GradReverse.apply(x, alpha=0.5)

    class Boxed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, pair):
            return x * pair[0]

        @staticmethod
        def backward(ctx, g):
            return g, None

    class InBox(nn.Module):
        def forward(self, x):
            return Boxed.apply(x, [x * 2])

    x = torch.randn(2, 3, requires_grad=True)
    try:
        Kw()(x)
    except TypeError:       # torch 2.11's Function.apply takes no keyword arguments: eager's error,
        # or ortmod's naming them where its capture sees the call first (the torch.export path)
        with pytest.raises((TypeError, ortmod.UnsupportedModelError), match="keyword arguments"):
            ORTModule(Kw())(x)
    else:
        with pytest.raises(ortmod.UnsupportedModelError, match="GradReverse.apply is called with keyword arguments"):
            ORTModule(Kw())(x)
    with pytest.raises(ortmod.UnsupportedModelError, match="Boxed.apply .* takes a tensor inside a container"):
        ORTModule(InBox())(x)


def test_output_size_from_tensor_values_is_refused_on_the_export_path(capture):
    """torch.export plans a Function's outputs from its fake run: a size that depends on values
    (nonzero) has none to give. The TorchScript path traced the real call and checks each
    call's size against the plan instead (see FunctionRunner._forward)."""
    class Positive(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x[x > 0]

        @staticmethod
        def backward(ctx, g):
            raise AssertionError("not reached")

    class M(nn.Module):
        def forward(self, x):
            return Positive.apply(x)
    if capture == "torchscript":
        pytest.skip("TorchScript traces the real call; only torch.export plans from fake tensors")
    with pytest.raises(ortmod.UnsupportedModelError, match="Positive .*size depends on tensor values"):
        ORTModule(M())(torch.randn(5))
