"""Capture on the TorchScript exporter (torch.onnx.export with dynamo=False): the first way a
module's forward becomes the ONNX graph the engine runs, and the fallback of the "auto" mode.

The module is traced through ``flatten``'s wrapper with ortmod's symbolics registered
(``torchscript_registry``), under the stop-gradient and guard modes of ``tracing``; the result is
read with ``onnx_wire`` (not the onnx package: its import costs most of a second) into an
``Exported`` record."""
import contextlib
import io
import itertools
import sys
import warnings

import torch

from . import compat

from .._logging import logger
from .errors import ExportError, UnsupportedModelError
from .onnx_util import ONNX_OPSET
from .flatten import Exported, GraphInput, tensor_layouts, _FlatWrapper, _preserved_state, changed_attributes, check_output_leaves, cuda_devices, plain_attributes, warn_attribute_changes
from . import onnx_wire, packed, python_op as pyop, torchscript_registry, tracing
from .onnx_wire import data_type_name



def _batchnorm_buffers(module):
    """Buffers that eager BatchNorm updates during a training forward, per BN module name."""
    out = {}
    for name, m in module.named_modules():
        if isinstance(m, compat.BatchNormBase) and m.training and m.track_running_stats:
            prefix = name + "." if name else ""
            if m.momentum is None:
                raise UnsupportedModelError(
                    f"BatchNorm '{name}' has momentum=None (cumulative moving average): its update "
                    "factor 1/num_batches_tracked changes every step and would be frozen into the "
                    "exported graph; set a momentum (e.g. 0.1)")
            out[name] = [prefix + "running_mean", prefix + "running_var", prefix + "num_batches_tracked"]
    return out


def _add_batchnorm_outputs(model, state_names):
    """The running-stat outputs of training-mode BatchNormalization nodes, to become graph outputs.

    ``model``: the exported graph (ortmod.capture.onnx_wire.Model). Returns [(graph output index, state
    name)], the BN module prefixes whose stats update, and the outputs to add to the graph
    ([(name, elem_type, dim params)], for Model.with_outputs).
    """
    input_types = {gi.name: gi.elem_type for gi in model.graph.input}
    outputs = [o.name for o in model.graph.output]
    added = []
    updates, prefixes, updated = [], [], {}
    for node in model.graph.node:
        if node.op_type != "BatchNormalization" or node.domain not in ("", "ai.onnx"):
            continue
        if not node.ints.get("training_mode") or len(node.input) < 5:
            continue
        for k in (3, 4):
            src = node.input[k]
            if src not in state_names:
                break                      # stats not from buffers (track_running_stats=False)
            if len(node.output) <= k - 2 or not node.output[k - 2]:
                raise UnsupportedModelError(
                    f"BatchNormalization node '{node.name}' in training mode has no running-stat output")
            if src in updated:
                raise UnsupportedModelError(
                    f"buffer '{state_names[src]}' is updated by two BatchNormalization nodes "
                    f"('{updated[src]}' and '{node.name}'): a BatchNorm module called more than once "
                    "per forward is not supported")
            updated[src] = node.name
            out_name = node.output[k - 2]
            if out_name not in outputs:
                outputs.append(out_name)
                added.append((out_name, input_types[src], [f"{out_name}_dim0"]))
            updates.append((outputs.index(out_name), state_names[src]))
        else:
            name = state_names[node.input[3]]
            prefixes.append(name[:-len("running_mean")])
    return updates, prefixes, added


# Symbolics for aten ops the TorchScript exporter lacks but models use on their way to
# the loss, emitted as ops the engine has (as ORT registers its own custom symbolics).

def _diff_symbolic(g, input, n, dim, prepend, append):
    """torch.diff (n=1): Slice(x, 1:) - Slice(x, :-1) along dim, after Concat of
    prepend/append. transformers' masking utilities call it on position ids."""
    from .compat import symbolic_helper as sh
    n, dim = sh.maybe_get_const(n, "i"), sh.maybe_get_const(dim, "i")
    if n != 1 or not isinstance(dim, int):
        return sh.unimplemented("aten::diff", "only n=1 with a constant dim")
    parts = [t for t in (prepend, input, append) if not sh.is_none(t)]
    x = g.op("Concat", *parts, axis_i=dim) if len(parts) > 1 else input

    def const(v):
        return g.op("Constant", value_t=torch.tensor([v], dtype=torch.int64))

    axis = const(dim)
    hi = g.op("Slice", x, const(1), const(2 ** 62), axis)
    lo = g.op("Slice", x, const(0), const(-1), axis)
    return g.op("Sub", hi, lo)


# ONNX element type and torch dtype of a TorchScript scalar type (what value.type().scalarType() says).
_FLOAT_TYPES = {"Float": (1, torch.float32), "Double": (11, torch.float64), "Half": (10, torch.float16),
                "BFloat16": (16, torch.bfloat16)}


def _repeat_heads(g, query, kv, rank, const):
    """kv (..., Hkv, S, E) -> (..., Hq, S, E), each head repeated Hq / Hkv times in a row
    (repeat_interleave on dim -3, as F.scaled_dot_product_attention(enable_gqa=True) does)."""
    i64 = torch.int64
    shape_q, shape_k = g.op("Shape", query), g.op("Shape", kv)

    def dims(shape, lo, hi):
        return g.op("Slice", shape, const([lo], i64), const([hi], i64))
    lead, hkv, tail = dims(shape_k, 0, rank - 3), dims(shape_k, rank - 3, rank - 2), dims(shape_k, rank - 2, rank)
    hq = dims(shape_q, rank - 3, rank - 2)
    rep = g.op("Div", hq, hkv)
    wide = g.op("Expand", g.op("Unsqueeze", kv, const([rank - 2], i64)),
                g.op("Concat", lead, hkv, rep, tail, axis_i=0))
    return g.op("Reshape", wide, g.op("Concat", lead, hq, tail, axis_i=0))


def _sdpa_symbolic(g, query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                   enable_gqa=False):
    """F.scaled_dot_product_attention as torch's own opset-14 symbolic emits it (the node chain
    the engine's attention fusion matches), but typed in the query's dtype throughout. torch's
    builds the scale, the causal mask and a boolean mask's -inf/0 from float32 constants, and
    for fp16/bf16 queries its type promotion then casts the scores (and, downstream, whole
    layers' weights) to float32 — with an invalid Cast (to=15) for bf16."""
    from .compat import symbolic_helper as sh
    dropout_p = sh.maybe_get_const(dropout_p, "f")
    is_causal = sh.maybe_get_const(is_causal, "b")
    enable_gqa = sh.maybe_get_const(enable_gqa, "b")
    scale = None if sh.is_none(scale) else sh.maybe_get_const(scale, "f")
    qtype = query.type().scalarType() if query.type() is not None else None
    if qtype not in _FLOAT_TYPES or not isinstance(enable_gqa, bool) or not isinstance(dropout_p, float) \
            or not isinstance(is_causal, bool) or (scale is not None and not isinstance(scale, float)):
        return sh.unimplemented("aten::scaled_dot_product_attention",
                                 "a float query, constant dropout_p / is_causal / scale / enable_gqa")
    onnx_type, dtype = _FLOAT_TYPES[qtype]

    def const(v, dt=dtype):
        return g.op("Constant", value_t=torch.tensor(v, dtype=dt))

    if enable_gqa:   # grouped-query attention: each key/value head serves Hq / Hkv query heads
        rank = sh.get_tensor_rank(key)
        if rank is None or rank < 3:
            return sh.unimplemented("aten::scaled_dot_product_attention", "enable_gqa with a key of known rank >= 3")
        key, value = (_repeat_heads(g, query, t, rank, const) for t in (key, value))

    if scale is None:   # 1/sqrt(E) from the query's last dim: in fp64 for fp64 queries (torch's is a
        # double), in fp32 otherwise, then in the query's dtype
        shape = g.op("Shape", query)
        last = g.op("Slice", shape, const([-1], torch.int64), const([2 ** 62], torch.int64))
        wide, wide_type = (torch.float64, 11) if dtype == torch.float64 else (torch.float32, 1)
        e = g.op("Cast", last, to_i=wide_type)
        s = g.op("Cast", g.op("Div", const([1.0], wide), g.op("Sqrt", e)), to_i=onnx_type)
    else:
        s = const(scale)
    rank = sh.get_tensor_rank(key)
    if rank is None:
        return sh.unimplemented("aten::scaled_dot_product_attention", "a key of unknown rank")
    perm = list(range(rank))
    perm[-1], perm[-2] = perm[-2], perm[-1]
    scores = g.op("MatMul", g.op("Mul", query, s), g.op("Transpose", key, perm_i=perm))
    zero, neg_inf = const([0.0]), const([-float("inf")])
    guard_nan = False
    if is_causal:   # ones(L, S).tril() == 0 -> -inf, as torch's symbolic builds it
        shape_q, shape_k = g.op("Shape", query), g.op("Shape", key)
        size = g.op("Concat", g.op("Slice", shape_q, const([-2], torch.int64), const([-1], torch.int64)),
                    g.op("Slice", shape_k, const([-2], torch.int64), const([-1], torch.int64)), axis_i=0)
        tril = g.op("Trilu", g.op("Expand", const([1.0]), size), upper_i=0)
        scores = g.op("Add", scores, g.op("Where", g.op("Equal", tril, zero), neg_inf, zero))
    elif not sh.is_none(attn_mask):
        mtype = attn_mask.type().scalarType() if attn_mask.type() is not None else None
        # a fully masked row (all False, or all -inf in a float mask) gives NaN in the softmax:
        # 0, as torch's kernels give (math: _safe_softmax, the CPU flash kernel likewise)
        guard_nan = True
        if mtype == "Bool":
            attn_mask = g.op("Where", attn_mask, zero, neg_inf)
        elif mtype != qtype:
            attn_mask = g.op("Cast", attn_mask, to_i=onnx_type)
        scores = g.op("Add", scores, attn_mask)
    weights = g.op("Softmax", scores, axis_i=-1)
    if guard_nan:
        weights = g.op("Where", g.op("IsNaN", weights), zero, weights)
    if dropout_p != 0:
        # training_mode given: ONNX's default (false) would drop nothing; F.sdpa applies dropout_p
        # whenever it is nonzero, whatever the module's mode
        weights = g.op("Dropout", weights, const(dropout_p, torch.float32), const(True, torch.bool))
    return g.op("MatMul", weights, value)


_SYMBOLICS_REGISTERED = False


def _register_symbolics():
    global _SYMBOLICS_REGISTERED
    if not _SYMBOLICS_REGISTERED:
        torch.onnx.register_custom_op_symbolic("aten::diff", _diff_symbolic, 9)
        _SYMBOLICS_REGISTERED = True


@contextlib.contextmanager
def _export_symbolics():
    """Symbolics that replace torch's own, registered only while ortmod exports (a user's
    torch.onnx.export in the same process keeps torch's)."""
    _register_symbolics()
    torch.onnx.register_custom_op_symbolic("aten::scaled_dot_product_attention", _sdpa_symbolic, 14)
    try:
        yield
    finally:
        torch.onnx.unregister_custom_op_symbolic("aten::scaled_dot_product_attention", 14)


@contextlib.contextmanager
def _onnxscript_functions_when_used(parsed):
    """torch's TorchScript exporter adds the onnx-script functions of custom ops to every model it
    writes (onnx_proto_utils._add_onnxscript_fn), importing the onnx package to look for them: most
    of a second of a process's first export. While ortmod exports, the bytes are looked at first
    (capture.onnx_wire) and torch's own step runs, import and all, only when a node's op has a
    function group in torch's registry (what that step looks up). ``parsed`` gets the model read
    on the way ("model": an ortmod.capture.onnx_wire.Model, for export() to reuse)."""
    try:
        registration = compat.ts_registration.module()
        original = compat.ts_proto_utils.add_onnxscript_fn
    except compat.TorchFeatureMissing:     # another torch: its own step runs as it is
        yield
        return

    def used(graph):
        for node in graph.node:
            if (node.domain and node.domain not in ("aten", "prim", "onnx")
                    and registration.registry.get_function_group(f"{node.domain}::{node.op_type}") is not None):
                return True
            if any(used(sub) for sub in node.subgraphs):
                return True
        return False

    def add_onnxscript_fn(model_bytes, custom_opsets):
        try:
            model = onnx_wire.parse_model(model_bytes)
        except ValueError:
            return original(model_bytes, custom_opsets)     # torch reads it (and says what is wrong)
        if used(model.graph):
            return original(model_bytes, custom_opsets)
        parsed["model"] = model
        return model_bytes

    with compat.ts_proto_utils.patched("add_onnxscript_fn", add_onnxscript_fn):
        yield


def _parameter_versions(module):
    return [(n, p, p._version) for n, p in module.named_parameters(remove_duplicate=True)]


def _one_floating_dtype(module, tensors):
    """The floating dtype of every floating input, parameter and buffer, if they share one."""
    dtypes = {t.dtype for t in itertools.chain(tensors, module.parameters(), module.buffers())
              if t.is_floating_point()}
    return dtypes.pop() if len(dtypes) == 1 else None


def _trace_to_onnx(module, wrapper, tensors, input_names, output_names, dynamic_axes, inline_functions,
                   parsed=None):
    """One torch.onnx.export of ``wrapper``; returns (bytes buffer, guard recorder, function
    recorder, caught tracer warnings). ``parsed`` (a dict) gets the written model as
    capture.onnx_wire read it, under "model", where it was read on the way."""
    from torch.onnx import TrainingMode
    f = io.BytesIO()
    # an error being handled by the caller is not this export's: the walk below stops there
    outer = sys.exc_info()[1]
    recorder = wrapper.guards = tracing.TraceGuards()
    functions = pyop.FunctionRecorder(inline_all=inline_functions)
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("always", torch.jit.TracerWarning)
            with _export_symbolics(), _onnxscript_functions_when_used({} if parsed is None else parsed), \
                    torchscript_registry.semantic_export(ONNX_OPSET, torch.is_grad_enabled(),
                                               _one_floating_dtype(module, tensors)), \
                    tracing.recording_guards(recorder), pyop.capturing_functions(functions, ONNX_OPSET):
                torch.onnx.export(
                    wrapper, tensors, f,
                    dynamo=False,
                    training=TrainingMode.TRAINING if module.training else TrainingMode.EVAL,
                    do_constant_folding=False,
                    export_params=False,
                    keep_initializers_as_inputs=True,
                    opset_version=ONNX_OPSET,
                    input_names=input_names,
                    output_names=output_names,
                    dynamic_axes=dynamic_axes,
                    autograd_inlining=inline_functions,
                )
    except UnsupportedModelError:
        raise
    except Exception as e:
        cause = e
        while cause is not None and cause is not outer and not isinstance(cause, UnsupportedModelError):
            cause = cause.__cause__ or cause.__context__
        if cause is not None and cause is not outer:
            raise cause from e
        first = str(e).strip().split("\n", 1)[0]
        first = first[:500] + (" ..." if len(first) > 500 else "")
        raise ExportError(f"torch.onnx.export failed for {type(module).__name__}: "
                          f"{type(e).__name__}: {first} (full error in __cause__)") from e
    finally:
        wrapper.guards = None
    return f, recorder, functions, caught


@packed.tracing_packed_sequences()   # the pack -> RNN -> pad pair as eager means it; the rest refused by name
def export(module, flat, strict_trace=False, inline_functions=False, dynamic=None):
    """Export ``module`` called as ``flat`` describes; return ONNX bytes and the input/output mapping.

    ``strict_trace``: a value the trace froze (see ortmod._semantics) is an error instead of a
    guarded graph and a warning. ``inline_functions``: a custom autograd.Function's forward is
    inlined and differentiated by the engine, instead of running the user's forward and backward
    (capture.python_op). ``dynamic``: the (tensor input, dim) pairs declared dynamic (None: all).

    ``Exported.static_dims`` lists the input dims whose traced size the graph holds only for.

    The exported graph is read with capture.onnx_wire, not the onnx package: its import would
    cost most of a second of the first call."""

    wrapper = _FlatWrapper(module, flat)
    # torch.onnx.export puts the wrapper back in the mode it found it in, recursively: a new
    # module is in training mode, which would turn an eval-mode module to training after one
    # export (a retried export then traced BatchNorm in training mode)
    wrapper.train(module.training)
    tensor_indices = flat.tensor_indices()
    tensors = tuple(flat.leaves[i] for i in tensor_indices)
    input_names = [f"input_{k}" for k in range(len(tensors))]
    bn_buffers = _batchnorm_buffers(module)
    expected_mutations = {n for names in bn_buffers.values() for n in names}

    attributes = plain_attributes(module)
    with _preserved_state(module, cuda_devices(module, flat)) as saved_buffers:
        outs = _eager_run(module, wrapper, tensors, saved_buffers, expected_mutations)
        output_names = [f"output_{j}" for j in range(len(outs))]
        f, recorder, functions, caught, parsed, dims, static = _trace_with_dims(
            module, wrapper, tensors, input_names, output_names, outs, dynamic, inline_functions)
    onnx_bytes = f.getvalue()
    guards = [tracing.Guard(len(outs) + k, value, kind, where, internal)
              for k, (_, kind, value, where, internal) in enumerate(recorder.records)]
    recorder.reset()
    unguarded = tracing.unguarded_tracer_warnings(caught, {g.where for g in guards})
    warn_attribute_changes(module, changed_attributes(attributes), strict_trace)
    hazards = list(dict.fromkeys([g.describe() for g in guards if not g.internal] + unguarded))
    if hazards and strict_trace:
        raise UnsupportedModelError(
            f"the trace of {type(module).__name__} froze values that Python computed from tensors: "
            + "; ".join(hazards) + " (strict_trace is on: compute them with tensor ops, or turn strict_trace "
            "off to let ortmod guard them)")

    state_names = _state_names(wrapper)
    model = parsed.get("model")
    try:
        if model is None or model.data != onnx_bytes:
            model = onnx_wire.parse_model(onnx_bytes)
    except ValueError as e:
        raise ExportError(f"ortmod could not read the graph torch.onnx.export wrote for {type(module).__name__}: "
                          f"{e}") from e
    if len(model.graph.output) != len(outs) + len(guards):
        raise RuntimeError(f"ortmod: the exported graph has {len(model.graph.output)} outputs, expected "
                           f"{len(outs)} from the module and {len(guards)} guards")
    _check_output_dtypes(module, model, outs)
    graph_inputs = _graph_inputs(model, input_names, state_names, tensor_indices)

    updates, bn_prefixes, added = _add_batchnorm_outputs(model, state_names)
    for name, _, _ in added:
        model.graph.output.append(onnx_wire.Value(name, 0))
    output_deps = _output_dependencies(model)
    counters = []
    if added:
        onnx_bytes = model.with_outputs(added)
    if updates:
        for prefix in bn_prefixes:
            counter = prefix + "num_batches_tracked"
            owner = module.get_submodule(prefix[:-1]) if prefix else module
            if getattr(owner, "num_batches_tracked", None) is not None:
                counters.append(counter)
    return Exported(onnx_bytes, graph_inputs, wrapper.out_spec, wrapper.out_leaves,
                    wrapper.out_tensor_positions, updates, counters, output_deps,
                    guards=guards, shape_specialized=bool(unguarded) or recorder.shapes_frozen, hazards=hazards,
                    static_dims=tuple((k, d, tensors[k].shape[d]) for k, d in (dims if unguarded or recorder.shapes_frozen else static)),
                    eager_shapes=tuple(tuple(t.shape) for t in outs),
                    layouts=tensor_layouts(tensors) if recorder.reads_layout else None,
                    functions=list(functions.specs))


def _eager_run(module, wrapper, tensors, saved_buffers, expected_mutations):
    """The call's outputs, from one eager run before the trace, to learn the output structure and
    ranks (all output dimensions are declared dynamic, and dynamic_axes needs the ranks); what
    forward mutates in place, which a traced graph cannot reproduce, is refused."""
    versions = _parameter_versions(module)
    with torch.no_grad():
        outs = wrapper(*tensors)
    for name, p, version in versions:
        if p._version != version:
            raise UnsupportedModelError(
                f"forward mutates parameter '{name}' in place; a traced graph cannot reproduce that "
                "(e.g. nn.Embedding(max_norm=...) renormalises its weight on every call)")
    if not outs:
        raise UnsupportedModelError("the module returned no tensors; there is nothing to run")
    check_output_leaves(wrapper)
    # A buffer that forward mutates in place (other than BatchNorm's statistics, which
    # are handled below) would be frozen by tracing: refuse instead of going stale.
    buffer_names = {id(b): n for n, b in module.named_buffers(remove_duplicate=False)}
    for b, before in saved_buffers:
        if not torch.equal(b, before):
            name = buffer_names.get(id(b), "?")
            if name not in expected_mutations:
                raise UnsupportedModelError(
                    f"forward mutates buffer '{name}' in place; a traced graph cannot reproduce "
                    "that (only BatchNorm running statistics are supported)")
    return outs


def _trace_with_dims(module, wrapper, tensors, input_names, output_names, outs, dynamic, inline_functions):
    """_trace_to_onnx's results, the parsed graph, every input dim and the static ones. Input dims
    are declared dynamic where they may vary (all, until a call showed which do); an export that
    needs a static size (InstanceNorm's channels, an adaptive pool's input) is done again with
    static input dims, which the graph then holds only for."""
    dims = [(k, d) for k, t in enumerate(tensors) for d in range(t.dim())]
    wanted = dims if dynamic is None else [kd for kd in dims if kd in dynamic]
    attempts = [wanted, []] if wanted else [[]]
    parsed = {}
    for n, dyn in enumerate(attempts):
        parsed.clear()
        dynamic_axes = {name: {} for name in input_names}
        for k, d in dyn:
            dynamic_axes[input_names[k]][d] = f"{input_names[k]}_dim{d}"
        for name, t in zip(output_names, outs):
            dynamic_axes[name] = {d: f"{name}_dim{d}" for d in range(t.dim())}
        try:
            f, recorder, functions, caught = _trace_to_onnx(
                module, wrapper, tensors, input_names, output_names, dynamic_axes, inline_functions, parsed)
            break
        except ExportError as e:
            if n + 1 == len(attempts):
                raise
            logger.info("export with dynamic dims failed (%s); exporting with static input dims", e)
    static = [kd for kd in dims if kd not in dyn]
    return f, recorder, functions, caught, parsed, dims, static


def _state_names(wrapper):
    """Graph input name -> state_dict name of the module's parameters and buffers (named under the
    wrapper; a tied tensor appears once, under one name)."""
    state_names = {}
    for name, _ in wrapper.named_parameters(remove_duplicate=False):
        state_names[name] = name[len(_FlatWrapper.PREFIX):]
    for name, _ in wrapper.named_buffers(remove_duplicate=False):
        state_names[name] = name[len(_FlatWrapper.PREFIX):]
    return state_names


def _graph_inputs(model, input_names, state_names, tensor_indices):
    """Every graph input mapped to its source: a call input (its leaf) or a parameter/buffer."""
    initializers = {init.name for init in model.graph.initializer}
    graph_inputs = {}
    for gi in model.graph.input:
        if gi.name in input_names:
            graph_inputs[gi.name] = GraphInput(gi.name, "input",
                                               leaf_index=tensor_indices[input_names.index(gi.name)])
        elif gi.name in state_names:
            graph_inputs[gi.name] = GraphInput(gi.name, "state", state_name=state_names[gi.name])
        elif gi.name in initializers:
            continue  # an initializer listed as input has its value in the graph
        else:
            raise RuntimeError(f"ortmod: exported graph input '{gi.name}' is neither a call input "
                               f"nor a parameter/buffer of the module")
    return graph_inputs


def _check_output_dtypes(module, model, outs):
    """The exported graph must return what eager returned: an exporter that typed an output
    otherwise (its implicit promotion) would hand back another dtype, silently."""
    from .compat import ts_type_utils as _type_utils
    for j, (out, t) in enumerate(zip(model.graph.output, outs)):
        elem = out.elem_type
        if not elem:
            continue    # untyped: the engine infers it from the graph
        want = _type_utils.JitScalarType.from_dtype(t.dtype).onnx_type()
        if int(want) != elem:
            raise UnsupportedModelError(
                f"the export of {type(module).__name__} computes output {j} as "
                f"{data_type_name(elem)} where eager returns {t.dtype} (torch's ONNX "
                "type promotion changed it); cast inside forward to make the dtype explicit")


def _subgraphs(node):
    """The graphs of a node's graph-valued attributes: an ortmod.capture.onnx_wire.Node has them listed,
    an onnx NodeProto (the torch.export path) in its attributes."""
    subs = getattr(node, "subgraphs", None)
    if subs is None:
        subs = [g for attr in node.attribute for g in list(attr.graphs) + ([attr.g] if attr.HasField("g") else [])]
    return subs


def _output_dependencies(model):
    """For each graph output, the frozenset of graph input names it is computed from (``model``:
    an ortmod.capture.onnx_wire.Model or an onnx ModelProto)."""
    deps = {gi.name: frozenset((gi.name,)) for gi in model.graph.input}
    empty = frozenset()

    def walk_outer(sub):               # If/Loop/Scan bodies may read outer values
        out = set()
        for node in sub.node:
            for i in node.input:
                out |= deps.get(i, empty)
            for g in _subgraphs(node):
                out |= walk_outer(g)
        return out

    for node in model.graph.node:
        if node.op_type == "StopGradient" and node.domain == "ortmod":
            for o in node.output:           # no gradient reaches any input through it
                if o:
                    deps[o] = empty
            continue
        src = set()
        for i in node.input:
            if i:
                src |= deps.get(i, empty)
        for sub in _subgraphs(node):
            src |= walk_outer(sub)
        fs = frozenset(src)
        for o in node.output:
            if o:
                deps[o] = fs
    return [deps.get(o.name, empty) for o in model.graph.output]
