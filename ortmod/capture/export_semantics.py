"""While torch.export traces: the eager semantics its IR does not keep (grad mode of in-place
ops, ``_GradModeSemantics``), and the data-dependent decisions real values make (``item``,
branches on tensors), frozen and guarded per call as on the TorchScript path."""
import contextlib
import functools
import threading

import torch

from . import compat
from .compat import pytree

from .rules import ctc as ctc_rules
from .errors import ExportError, UnsupportedModelError
from .fx_passes import _meta_val
from .shape_guard import _ASSERTS, _ITEM_OPS, _free_unbacked
from .errors import _user_line
from .function_apply import _functions
from . import errors, tracing


class _GradModeSemantics(torch.overrides.TorchFunctionMode):
    """While torch.export traces: what its training IR does not say about grad mode. An in-place
    op under ``torch.no_grad()`` on a tensor that requires grad reaches the IR as a plain in-place
    op (no grad-mode region marks it), which would be differentiated where eager autograd ignores
    the change: refused by name, as on the TorchScript path. ``F.gaussian_nll_loss`` does exactly
    that to ``var`` (its clamp to eps): ``var`` is lifted first, the TorchScript path's rule
    (_semantics._gaussian_nll_var_lifted), so the clamp changes nothing. ``F.linear_cross_entropy``
    with chunking ``options`` would call torch's own autograd.Function: it takes torch's
    reference path, as under torch.jit.trace (_semantics.linear_cross_entropy_reference). torch's
    CTC loss, which torch.export cannot trace (``aten._ctc_loss`` has no fake kernel), becomes
    ortmod's op for the engine's CTCLoss node (_export_ctc.traced_ctc_loss), however module code
    calls it."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if getattr(_functions, "inside", 0):       # a user's Function's forward: run in PyTorch
            return func(*args, **kwargs)
        if func in _ctc_functions():
            return ctc_rules.traced_ctc_loss(func, args, kwargs)
        if func is torch.nn.functional.gaussian_nll_loss:
            args, kwargs = tracing._gaussian_nll_var_lifted(args, kwargs)
        if func is getattr(torch.nn.functional, "linear_cross_entropy", None):
            return tracing.linear_cross_entropy_reference(args, kwargs)
        if not torch.is_grad_enabled():
            tracing.refuse_in_place_without_grad(func, args)
        return func(*args, **kwargs)


@functools.lru_cache(maxsize=None)
def _ctc_functions():
    return ctc_rules.traced_functions()


@contextlib.contextmanager
def _real_values_decide():
    """torch's real-tensor propagation (what its draft_export uses), with the parameters' and
    buffers' real values: torch 2.13 gives their fakes uninitialised real tensors (a branch on a
    Linear's output was decided on garbage). Should another torch misdecide still, the guards
    catch it on the first call: the engine's value differs from the decision, and ortmod refuses."""
    def fakify_with_values(fake_mode, mod):
        fakes = fakify(fake_mode, mod)
        state = {**dict(mod.named_parameters(remove_duplicate=False)),
                 **dict(mod.named_buffers(remove_duplicate=False))}
        for name, fake in fakes.items():
            real = state.get(name)
            if real is not None and getattr(fake, "real_tensor", None) is not None:
                fake.real_tensor = real.detach().clone()
        return fakes

    export_trace = compat.export_trace
    fakify = export_trace.fakify_params_buffers
    with export_trace.patched("fakify_params_buffers", fakify_with_values), compat.propagate_real_tensors(), \
            _integer_signbit_as_lt():
        yield


@contextlib.contextmanager
def _integer_signbit_as_lt():
    """torch 2.13's prims.signbit has an integer input's dtype on fake tensors and bool on real
    ones, which real-tensor propagation refuses (MetadataMismatchError; in the trace and in the
    decomposition's re-trace, whose fake tensors keep the real values). Fake tensors with symbolic
    sizes reach it through torch's reference of integer floor division (Wav2Vec2's
    torch.div(lengths, stride, rounding_mode="floor")); there, while real values decide, signbit
    of an integer tensor is computed as x < 0, its meaning (a bool, as eager's). Only the fake
    computation changes: the graph records the op the module called."""
    decomposition_table = compat.decomposition_table()
    signbit = torch.ops.aten.signbit.default
    with _signbit_lock:
        # the table is torch's, process-wide: the first of overlapping exports (another thread's
        # decomposition runs outside _export_lock) patches it, the last puts torch's back
        if _signbit_patch["depth"] == 0:
            _signbit_patch["reference"] = reference = decomposition_table.get(signbit)
            if reference is not None:
                def integer_signbit(x):
                    if isinstance(x, torch.Tensor) and not x.is_floating_point() and x.dtype != torch.bool:
                        return torch.lt(x, 0)
                    return reference(x)
                decomposition_table[signbit] = integer_signbit
        _signbit_patch["depth"] += 1
    try:
        yield
    finally:
        with _signbit_lock:
            _signbit_patch["depth"] -= 1
            if _signbit_patch["depth"] == 0 and _signbit_patch["reference"] is not None:
                decomposition_table[signbit] = _signbit_patch["reference"]


_signbit_lock = threading.Lock()
_signbit_patch = {"depth": 0, "reference": None}


def _real_value(value, ep):
    """The value an ``item`` node took: a constant when the real value specialised it, else its
    unbacked symbol's real value (pinned to one value by the export's ranges)."""
    if isinstance(value, (bool, int, float)):
        return value
    expr = value.node.expr
    if not expr.free_symbols:       # specialised to a constant
        return {torch.SymBool: bool, torch.SymFloat: float}.get(type(value), int)(expr)
    shape_env = value.node.shape_env
    real = getattr(shape_env, "real_tensor_prop_unbacked_vals", {}) or {}
    if expr in real:
        v = real[expr]
    else:
        vr = ep.range_constraints.get(expr)
        if vr is None or vr.lower != vr.upper:
            return None
        v = vr.lower
    if isinstance(value, torch.SymBool):
        return bool(v)
    return float(v) if isinstance(value, torch.SymFloat) else int(v)


def _decided_or_asserted(val, asserted):
    decided = isinstance(val, (bool, int, float)) or (
        isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)) and not val.node.expr.free_symbols)
    # else a number the graph computes with symbolically: nothing was decided
    return decided or bool(_free_unbacked(val) & asserted)


def _freeze_decisions(module, ep, n_user_out, strict_trace):
    """The guards of an export whose data-dependent branches real values decided: each ``item``
    node that a decision rests on (a constant result, or an unbacked symbol some runtime assertion
    constrains) has its input tensor added as a user output after the module's own; returns the
    _semantics.Guard list (output indices counted over the module's outputs)."""
    import re
    from torch.export.graph_signature import OutputKind, OutputSpec, TensorArgument
    asserted = set()
    for node in ep.graph.nodes:
        if node.op == "call_function" and getattr(node.target, "__name__", "").startswith(_ASSERTS):
            if isinstance(node.args[0], torch.fx.Node):
                asserted |= _free_unbacked(node.args[0].meta.get("val"))
    picked = []
    items = [node for node in ep.graph.nodes if node.op == "call_function" and isinstance(node.target, compat.OpOverload)
             and node.target.name().split(".")[0] in _ITEM_OPS]
    # torch 2.11 leaves a branch's Python bool read from a tensor as an unbacked SymBool (Eq(u0, 1))
    # with no runtime assertion on it: where nothing else ties the decision to a value, each such
    # bool is guarded (a bool only decides; a guard too many costs an export, never a result)
    tied = [n for n in items if _decided_or_asserted(n.meta.get("val"), asserted)]
    bools = [n for n in items if isinstance(n.meta.get("val"), torch.SymBool)]
    for node in tied or bools:
        val = node.meta.get("val")
        value = _real_value(val, ep)
        source = node.args[0]
        stack = node.meta.get("stack_trace") or ""
        where = _user_line(stack)
        # read by library code (torch's own module checks, transformers' mask checks): guarded
        # the same, but the user hears of it only when it changes (as on the TorchScript path)
        innermost = re.findall(r'File "([^"]+)", line \d+', stack)
        internal = not innermost or errors._is_library(innermost[-1])
        if value is None or not isinstance(source, torch.fx.Node):
            raise UnsupportedModelError(
                f"{type(module).__name__}: a branch on a tensor's value{f' (at {where})' if where else ''} "
                "could not be tied to one value for the torch.export capture path; ORTMOD_CAPTURE=torchscript "
                "guards it with the TorchScript exporter")
        picked.append((source, value, where, internal))
    if not picked:
        raise ExportError(f"torch.export capture of {type(module).__name__}: a data-dependent branch was "
                          "decided by real values, but no value read from a tensor was found to guard")
    guards = [tracing.Guard(n_user_out + k, value, "a value read from a tensor", where or "<unknown>",
                               internal=internal)
              for k, (_, value, where, internal) in enumerate(picked)]
    hazards = [g.describe() for g in guards if not g.internal]
    if hazards and strict_trace:
        raise UnsupportedModelError(
            f"the export of {type(module).__name__} decided branches on tensor values: " + "; ".join(hazards)
            + " (strict_trace is on: compute them with tensor ops, or turn strict_trace off to let ortmod "
            "guard them)")
    # the guarded tensors become user outputs, after the module's own (graph and signature alike)
    out_node = next(n for n in ep.graph.nodes if n.op == "output")
    outs = list(out_node.args[0])
    specs = ep.graph_signature.output_specs
    last_user = max(i for i, s in enumerate(specs) if s.kind == OutputKind.USER_OUTPUT)
    for k, (source, *_) in enumerate(picked):
        outs.insert(last_user + 1 + k, source)
        specs.insert(last_user + 1 + k, OutputSpec(kind=OutputKind.USER_OUTPUT,
                                                   arg=TensorArgument(name=source.name), target=None))
    out_node.args = (tuple(outs),) + tuple(out_node.args[1:])
    # the guards check what the runtime assertions on those values did: the assertions go, and
    # with them the item nodes and the symbolic arithmetic that only fed them
    for node in list(ep.graph.nodes):
        if node.op == "call_function" and getattr(node.target, "__name__", "").startswith(_ASSERTS):
            cond = _meta_val(node.args[0])
            if cond is None or not isinstance(cond, torch.SymBool) or _free_unbacked(cond) or \
                    not cond.node.expr.free_symbols:
                ep.graph.erase_node(node)
    ep.graph.eliminate_dead_code()
    ep.graph_module.recompile()
    # the call signature's output structure too: decomposition calls the program through it
    for entry in ep.module_call_graph:
        if entry.fqn == "" and entry.signature is not None:
            entry.signature.outputs.extend(TensorArgument(name=source.name) for source, *_ in picked)
            entry.signature.out_spec = pytree.tree_structure(
                tuple(range(n_user_out + len(picked))))
    return guards
