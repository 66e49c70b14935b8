"""Capture on torch.export: the second way a module's forward becomes the ONNX graph the engine runs.

The TorchScript exporter (``ortmod/capture/torchscript.py``) is deprecated and will be removed from torch.
This path captures with ``torch.export.export`` (non-strict: the forward runs in Python on fake
tensors, with symbolic sizes) and translates the ExportedProgram to ONNX with torch's own
torch.export -> ONNX translator (onnxscript's torchlib), with ortmod's rules where torchlib's do not
mean what eager training means. The result is the same ``flatten.Exported`` record, so the C
importer stays the one way into the engine.

Training semantics, as on the TorchScript path:

* **Stop-gradient.** The training IR keeps ``aten.detach`` and marks ``torch.no_grad()`` regions
  (``wrap_with_set_grad_enabled(False, ...)``); decomposition would turn both into plain aliases.
  Before decomposition, each becomes the opaque custom op ``ortmod::stop_gradient`` (the inputs of
  a no-grad region go through it), translated to the engine's ``ortmod::StopGradient``.
* **BatchNorm in training.** torchlib exports ``_native_batch_norm_legit_functional`` in inference
  form whatever ``training`` says (and drops the running-stat update); ortmod's rule emits
  ``BatchNormalization(training_mode=1)`` with its running-stat outputs.
* **Buffer mutations** are explicit in the graph signature (``BUFFER_MUTATION`` outputs): they
  become extra graph outputs copied into the module's buffers after each forward (running stats,
  ``num_batches_tracked``, any buffer forward updates). A forward that mutates a parameter or an
  input is refused.
* **Dropout** decomposes to ``native_dropout(x, p, train)`` -> ONNX ``Dropout(x, p, train)``: the
  engine's Dropout, random and different each step.
* **Dynamic sizes**, as torch.compile's automatic dynamic shapes: the first export holds every
  input dim static (a static trace is several times faster than a symbolic one: GPT-2's first
  call 7.7 s -> see bench/first_call.py); a call with another size there exports again with the
  dims that varied as torch.export's symbolic shapes (``Dim.AUTO``), traced size-obliviously (a
  size 1 is not specialised), so that export serves the later sizes its guards admit. What the
  export specialised (a dim fixed to its traced size, two dims made equal, a range, a runtime
  assertion or a guard on sizes) is checked on every call by ``ShapeGuard``: a call it rejects
  is exported again, never run on a stale graph.
* **Custom autograd.Function** runs its own forward and backward, by the TorchScript path's
  mechanism (ortmod/capture/python_op.py). torch.export would inline its forward and lose its backward: while
  it traces, a user's ``Function.apply`` becomes the opaque op ``ortmod::python_op`` (kept through
  decomposition), translated to the engine's ``ortmod::PythonOp`` node that the TorchScript path
  emits. ``inline_autograd_functions`` lets torch.export inline it, as asked. torch's own
  Functions are the engine's to compute: ``F.linear_cross_entropy``'s chunked op is traced as
  torch's reference path (tracing.linear_cross_entropy_reference), as under torch.jit.trace;
  any other is refused by name.

Every ONNX op of the result must be one the engine implements; the engine refuses others at
import, by name.

This module is the driver; its pieces: ``fx_passes`` (graph surgery), ``function_apply``
(Function.apply and custom ops), ``shape_guard``, ``export_semantics`` (grad mode, data-dependent
decisions), ``export_registry`` (the rules), ``audit`` (the reviewed ops and their checks).
"""
import contextlib
import itertools
import threading
import time
import warnings

import torch

from . import compat

from . import torchscript, flatten, packed, python_op as pyop, tracing
from .rules import ctc as ctc_rules, rnn_onnxscript
from .flatten import Exported, GraphInput, _FlatWrapper
from .errors import ExportError, UnsupportedModelError
from .._logging import logger
from .fx_passes import _check_output_kinds, _insert_stop_gradients, _lower_cast_like, _meta_val, _splits_to_slices, _state_name, _views_to_view_copies
from .export_registry import _registry
from .shape_guard import _data_dependent, _shape_guard
from .export_semantics import _GradModeSemantics, _freeze_decisions, _integer_signbit_as_lt, _real_values_decide
from .onnx_util import ONNX_OPSET
from .function_apply import _function_records, _intercepting_apply
from .audit import _audit, _check_ops
from .rules import onnxscript as onnxscript_rules


def _prepare(ep, registry):
    """torch's own preparation of a program for the ONNX translator (compat.prepare_for_onnx),
    with _views_to_view_copies between decomposition and the type-promotion pass that runs the
    graph again."""
    # eager's clamp by a number and by a tensor differ at the bound from 2.14 (compat.clamp_semantics):
    # a number the type-promotion pass makes a tensor becomes a number again
    numbers_differ = len(set(compat.clamp_semantics())) > 1

    def each_graph(gm, fn):
        for sub in gm.modules():
            if isinstance(sub, torch.fx.GraphModule):
                fn(sub)

    def after_decomposition(gm):
        each_graph(gm, _views_to_view_copies)
        each_graph(gm, onnxscript_rules.mark_channels_last_nearest)
        if numbers_differ:
            each_graph(gm, onnxscript_rules.mark_number_clamps)

    def after_promotion(gm):
        if numbers_differ:
            each_graph(gm, onnxscript_rules.number_clamps_back)
    return compat.prepare_for_onnx(ep, registry, after_decomposition, after_promotion)


def _reads_layout(module, ep, tensors):
    """Whether the program holds a kernel eager picks by memory layout (then the export holds for
    the call's layouts only); refuses where torch.export's traced strides cannot say which."""
    graphs = [gm for gm in ep.graph_module.modules() if isinstance(gm, torch.fx.GraphModule)]
    if any(t.dim() == 5 and not t.is_contiguous() and t.is_contiguous(memory_format=torch.channels_last_3d)
           for t in tensors) and any(onnxscript_rules.reads_layout(gm, ranks=(3,)) for gm in graphs):
        # torch.export's traced strides do not follow eager's kernels there (a Conv3d of a
        # channels-last-3d input is channels-last in eager, contiguous in the trace)
        raise UnsupportedModelError(
            f"{type(module).__name__}: 3-d nearest upsampling in a model called with a channels-last-3d input: eager "
            "picks the kernel's index arithmetic by the layout the ops before give it, which torch.export's trace "
            "does not follow for 3-d tensors; ORTMOD_CAPTURE=torchscript captures with the TorchScript exporter, "
            "which reads eager's own strides")
    return any(onnxscript_rules.reads_layout(gm) for gm in graphs)


_export_lock = threading.Lock()

# torch dtype -> ONNX element type
_ONNX_TYPES = {torch.float32: 1, torch.uint8: 2, torch.int8: 3, torch.int16: 5, torch.int32: 6, torch.int64: 7,
               torch.bool: 9, torch.float16: 10, torch.float64: 11, torch.bfloat16: 16}


# ---------------------------------------------------------------------------------------------
# the export


class _ExportWrapper(_FlatWrapper):
    """_FlatWrapper for torch.export. Non-strict export restores the state a traced forward
    changes on the module (even in a dict it holds) and warns of a tensor assigned to it, so the
    output structure and the guarded numbers go into a process-wide table under the wrapper's
    number, and nothing of the call is kept on the wrapper (the TorchScript path's eager_out)."""

    _tokens = itertools.count()
    _seen = {}

    def __init__(self, module, flat):
        super().__init__(module, flat)
        self.__dict__["_token"] = next(self._tokens)
        self.guards = tracing.TraceGuards()

    def expand(self, out):
        # no eager run comes first: a number torch.export traced symbolically (``x.shape[0]``, an
        # int eager returns) is eager's number by its value for this call, guarded as the
        # TorchScript path guards the 0-d tensor its trace makes of one
        return flatten.expand_objects(out, guards=self.guards, number=_symbolic_number)

    def forward(self, *tensors):
        # taken inside the trace, where torch has put its fakes in for the parameters (an RNN's
        # _flat_weights holds them too): what forward itself sets is what changes from here
        attributes = _user_attributes(self.module)
        plain = flatten.plain_attributes(self.module)
        outs = super().forward(*tensors)
        # (plain attributes forward changed are read here: torch.export puts them back after)
        _ExportWrapper._seen[self._token] = (self.out_spec, self.out_leaves, self.out_tensor_positions,
                                             [(kind, value, where, internal)
                                              for _, kind, value, where, internal in self.guards.records],
                                             _set_to_trace_values(self.module, attributes),
                                             flatten.changed_attributes(plain))
        return outs

    def take_structure(self):
        """The output structure of the last trace; returns its guarded numbers ((kind, value,
        where, internal) per extra output after the module's tensors), the module's attributes
        that held values of the trace when forward returned, and the plain attributes forward
        changed (_capture.changed_attributes)."""
        seen = _ExportWrapper._seen.pop(self._token, None)
        self.guards.reset()         # no traced tensor kept alive
        if seen is None:
            return [], [], []
        self.out_spec, self.out_leaves, self.out_tensor_positions, numbers, assigned, changed = seen
        return numbers, assigned, changed


# per symbolic number type: the dtype of its 0-d tensor in the graph and the Python type eager has
_SYMBOLIC_TYPES = {torch.SymInt: (torch.int64, int), torch.SymFloat: (torch.float64, float),
                   torch.SymBool: (torch.bool, bool)}


def _symbolic_number(value, reference=None):
    """torch.export's stand-in for a Python number computed from sizes (a SymInt for
    ``x.shape[0]``, whose value the user's int would be): (eager's number, the symbolic value as a
    0-d tensor of the graph) where ``value`` is one; else None. Its value for the traced call is
    its symbols' hint, read without the guard that int() would add (it would make the size
    static)."""
    if type(value) not in _SYMBOLIC_TYPES:
        return None
    dtype, python_type = _SYMBOLIC_TYPES[type(value)]
    hint = value.node.hint if value.node.has_hint() else None
    if hint is None:
        raise UnsupportedModelError(
            f"the module returns a {type(value).__name__.replace('Sym', '').lower()} computed from a tensor's "
            f"value ({value.node.expr}) that the torch.export capture path cannot give back as a number; "
            "return it as a tensor, or use ORTMOD_CAPTURE=torchscript, which guards it")
    return python_type(hint), torch.scalar_tensor(value, dtype=dtype)


def available():
    """Whether this torch has what this path uses (torch.export and its ONNX translator)."""
    try:
        compat.onnx_core.module(), compat.onnx_registration.module()
        import onnxscript  # noqa: F401
    except (ImportError, compat.TorchFeatureMissing):
        return False
    return hasattr(torch, "export")


def export(module, flat, strict_trace=False, inline_functions=False, dynamic=None):
    """Export ``module`` called as ``flat`` describes with torch.export; the same record as
    ``_capture.export``. ``dynamic``: the (tensor input, dim) pairs exported as symbolic sizes
    (None: none; ``Exported.static_dims`` lists the others, and a call that changes one of them
    exports again with it dynamic)."""
    packed.refuse_packed_arguments(flat)
    recorder = pyop.FunctionRecorder(inline_all=inline_functions)
    try:    # packed sequences: refused by name, not torch's failure deep in the trace
        with packed.refusing_packed_sequences(), _function_records(recorder):
            return _export(module, flat, recorder, strict_trace, dynamic or frozenset())
    except UnsupportedModelError as e:
        if str(e) == packed.MESSAGE:
            _eager_error_first(module, flat)
        raise


def _eager_error_first(module, flat):
    """A call eager refuses (a packed sequence's length 0) raises eager's error rather than this
    path's refusal, which the default capture would answer by trying the TorchScript path: the
    forward runs once in eager, its state kept as it was."""
    tensors = tuple(flat.leaves[i] for i in flat.tensor_indices())
    with flatten._preserved_state(module, flatten.cuda_devices(module, flat)), torch.no_grad():
        _FlatWrapper(module, flat)(*tensors)


def _without_grad(t):
    if not (t.is_leaf or t.retains_grad) or t.grad is None:
        return t
    return t.detach().requires_grad_(t.requires_grad)


def _export(module, flat, recorder, strict_trace, dynamic):
    t0 = time.perf_counter()
    _core, onnx_ir = _translator()
    timings = {"imports": time.perf_counter() - t0}
    # BatchNorm(momentum=None) in training: refused by name, as on the TorchScript path (its
    # factor 1/num_batches_tracked is a Python number read from a buffer, on which torch.export
    # fails with a data-dependent guard)
    torchscript._batchnorm_buffers(module)
    wrapper = _ExportWrapper(module, flat)
    tensor_indices = flat.tensor_indices()
    # the call's tensors without their .grad: torch.export guards on a gradient an input
    # carries (one left by an earlier backward), and its decomposition re-trace, on fresh fake
    # inputs without one, then fails ('NoneType' object has no attribute 'size')
    tensors = tuple(_without_grad(flat.leaves[i]) for i in tensor_indices)
    ep, frozen, guard = _trace_program(module, flat, wrapper, tensors, recorder, dynamic)
    timings["torch.export"] = time.perf_counter() - t0 - timings["imports"]
    numbers = _call_structure(module, wrapper, strict_trace)
    n_tensors = len(wrapper.out_tensor_positions)
    guards, n_user_out = _guards(module, ep, n_tensors, numbers, frozen, strict_trace)
    t1 = time.perf_counter()
    registry = _registry()
    timings["registry"] = time.perf_counter() - t1
    ep, mutations, reads_layout = _decompose(module, ep, registry, tensors, n_tensors + len(guards), frozen, timings)
    proto, state_kinds = _to_onnx(module, ep, registry, _core, onnx_ir, len(tensors), timings)
    outs_meta = _output_vals(ep, n_user_out)
    _check_output_dtypes(module, proto, outs_meta)

    _drop_unread_state(proto, state_kinds)
    graph_inputs = {}
    for gi in proto.graph.input:
        if gi.name in state_kinds:
            graph_inputs[gi.name] = GraphInput(gi.name, "state", state_name=_state_name(gi.name))
        else:
            k = int(gi.name[len("input_"):])
            graph_inputs[gi.name] = GraphInput(gi.name, "input", leaf_index=tensor_indices[k])
    if len(proto.graph.output) != n_tensors + len(guards) + len(mutations):
        raise ExportError(f"the ONNX translation has {len(proto.graph.output)} outputs, expected "
                          f"{n_tensors}, {len(guards)} guards and {len(mutations)} buffer updates")
    updates = [(n_tensors + len(guards) + k, _state_name(s.target)) for k, s in enumerate(mutations)]
    output_deps = torchscript._output_dependencies(proto)
    onnx_bytes = proto.SerializeToString()
    timings["total"] = time.perf_counter() - t0
    exported = Exported(onnx_bytes, graph_inputs, wrapper.out_spec, wrapper.out_leaves,
                        wrapper.out_tensor_positions, updates, [], output_deps, guards=guards,
                        hazards=list(dict.fromkeys(g.describe() for g in guards if not g.internal)),
                        functions=list(recorder.specs))
    exported.shape_guard = guard
    exported.layouts = flatten.tensor_layouts(tensors) if reads_layout else None
    exported.static_dims = tuple((k, d, t.shape[d]) for k, t in enumerate(tensors) for d in range(t.dim())
                                 if (k, d) not in dynamic)
    exported.capture = "export"
    exported.timings = timings
    return exported


def _translator():
    """torch's exported-program-to-ONNX translator and onnx_ir (ExportError where missing)."""
    try:    # once per process, with torch.export's own (torch._dynamo) below: ~3 s of a first call
        import onnx
        _core = compat.onnx_core
        _core.module()
        import onnx_ir
    except (ImportError, compat.TorchFeatureMissing) as e:
        raise ExportError(f"the torch.export capture path needs torch's ONNX translator and onnxscript: {e}") from e
    return _core, onnx_ir


def _trace_program(module, flat, wrapper, tensors, recorder, dynamic):
    """(the exported program, whether real values decided data-dependent branches, its ShapeGuard)."""
    dims = tuple({d: torch.export.Dim.AUTO for d in range(t.dim()) if (k, d) in dynamic}
                 for k, t in enumerate(tensors))

    def trace(inputs, real_values, size_oblivious):
        # size-oblivious, as torch.onnx exports dynamic shapes: torch.export otherwise
        # specialises a dim whose sample size is 0 or 1 ("0/1 specialization") and excludes
        # 0 and 1 from one traced at another size, so batches of 1 and of n would export in
        # turn; where the graph does depend on a size being 1, its guard says so (ShapeGuard)
        with _intercepting_apply(recorder), rnn_onnxscript.static_projection_lengths(module), \
                (_real_values_decide() if real_values else contextlib.nullcontext()), _GradModeSemantics(), \
                compat.size_oblivious(size_oblivious):
            return torch.export.export(wrapper, inputs, dynamic_shapes=(dims,), strict=False)

    def capture(size_oblivious):
        """The exported program, and whether real values decided data-dependent branches."""
        recorder.calls.clear()
        try:
            return trace(tensors, False, size_oblivious), False
        except UnsupportedModelError:
            raise
        except Exception as e:
            if not _data_dependent(e):
                raise _export_error(module, "torch.export.export", e) from e
        # Python branched on a tensor's value (`if torch.equal(mask, causal):`): export again,
        # deciding such branches with the call's real values; each decision is then guarded
        # (_freeze_decisions), as the TorchScript path guards what its trace froze
        recorder.calls.clear()
        # the real tensors are copied beside the fake ones, which an input whose elements
        # share memory (an expand()ed one) cannot be: those go in as dense copies, same values
        real = tuple(t.contiguous() if compat.has_internal_overlap(t) == 1 else t for t in tensors)
        try:
            return trace(real, True, size_oblivious), True
        except UnsupportedModelError:
            raise
        except Exception as e2:
            raise _export_error(module, "torch.export.export", e2) from e2

    attributes = _attribute_names(module)
    with _export_lock, flatten._preserved_state(module, flatten.cuda_devices(module, flat)), \
            _removing_trace_values(module, attributes):
        # Size-oblivious tracing takes a dynamic size for one that is not 1 where it decides
        # something by it, which a size 1 in the sample can contradict (a size 1 dim broadcast
        # against another dynamic one): then the trace fails, or the export does not hold for
        # its own sample, and it is traced again with torch's 0/1 specialisation.
        ep = None
        if dynamic:
            try:
                ep, frozen = capture(size_oblivious=True)
                guard = _shape_guard(ep, len(tensors))
            except ExportError as e:
                logger.info("size-oblivious export failed (%s); exporting with 0/1 specialisation", e)
            else:
                if not guard.holds(tuple(tuple(t.shape) for t in tensors)):
                    ep = None
        if ep is None:
            ep, frozen = capture(size_oblivious=False)
            guard = _shape_guard(ep, len(tensors))
    return ep, frozen, guard


def _call_structure(module, wrapper, strict_trace):
    """What the trace recorded of the call besides its graph, checked: the guarded numbers."""
    numbers, assigned, changed = wrapper.take_structure()
    flatten.warn_attribute_changes(module, changed, strict_trace)
    if assigned:
        # eager leaves each call's value there; ortmod runs forward only when it exports
        raise UnsupportedModelError(
            f"{type(module).__name__}.forward sets {', '.join(assigned)} to a value computed in the call (a "
            "tensor, or a number from a size): eager leaves each call's value there, but ortmod runs forward "
            "only when it exports, so the attribute would not follow later calls; return the value as an "
            "output instead")
    if not wrapper.out_tensor_positions:
        raise UnsupportedModelError("the module returned no tensors; there is nothing to run")
    flatten.check_output_leaves(wrapper)
    return numbers


def _guards(module, ep, n_tensors, numbers, frozen, strict_trace):
    """(the program's guards, its user outputs' count); its graphs rewritten for the translation."""
    from torch.export.graph_signature import OutputKind
    sig = ep.graph_signature
    _check_output_kinds(sig)
    n_user_out = sum(1 for s in sig.output_specs if s.kind == OutputKind.USER_OUTPUT)
    # the module's tensors, then its guarded numbers (the wrapper's), then what real values decided
    if n_user_out != n_tensors + len(numbers):
        raise ExportError(f"the exported program has {n_user_out} outputs, expected {n_tensors} tensors and "
                          f"{len(numbers)} guarded numbers")
    guards = [tracing.Guard(n_tensors + k, value, kind, where, internal)
              for k, (kind, value, where, internal) in enumerate(numbers)]
    if frozen:
        guards += _freeze_decisions(module, ep, n_user_out, strict_trace)
    _insert_stop_gradients(ep.graph_module)
    for gm in ep.graph_module.modules():
        if isinstance(gm, torch.fx.GraphModule) and gm is not ep.graph_module:
            _insert_stop_gradients(gm)
    for gm in ep.graph_module.modules():
        if isinstance(gm, torch.fx.GraphModule):
            onnxscript_rules.unbatched_nll_loss_forward(gm)
            onnxscript_rules.unbatched_cross_entropy_loss(gm)
            onnxscript_rules.keep_whole(gm)
            ctc_rules.masked_targets(gm)
    return guards, n_user_out


def _decompose(module, ep, registry, tensors, n_outputs, frozen, timings):
    """(the decomposed program, its buffer mutations, whether it reads the inputs' layouts);
    the mutations become user outputs after the module's ``n_outputs`` (tensors and guards)."""
    from torch.export.graph_signature import OutputKind
    t1 = time.perf_counter()
    try:
        # an export that real values decided carries them into decomposition's re-trace too
        with _integer_signbit_as_lt() if frozen else contextlib.nullcontext(), _without_torch_deprecations():
            ep = _prepare(ep, registry)
    except Exception as e:
        raise _export_error(module, "decomposing the exported program", e) from e
    timings["decompose"] = time.perf_counter() - t1
    reads_layout = _reads_layout(module, ep, tensors)
    # again on the decomposed program: the training IR keeps in-place ops as they are, and only
    # decomposition's functionalization names what they mutate (nn.Embedding(max_norm=...)
    # renormalizes its weight in place through a detach(): no mutation before, a
    # PARAMETER_MUTATION after, which the outputs kept below would drop without a word)
    _check_output_kinds(ep.graph_signature)
    for gm in ep.graph_module.modules():
        if isinstance(gm, torch.fx.GraphModule):
            _splits_to_slices(gm)
    _audit(module, ep)
    # Mutated buffers: torch's translator drops them ("TODO: decide if we should keep mutated
    # buffers"); as user outputs they stay, after the module's own, in signature order.
    sig = ep.graph_signature
    mutations = [s for s in sig.output_specs if s.kind == OutputKind.BUFFER_MUTATION]
    user_specs = [s for s in sig.output_specs if s.kind == OutputKind.USER_OUTPUT]
    if len(user_specs) != n_outputs:
        raise ExportError("decomposition changed the exported program's outputs")
    for s in mutations:
        s.kind = OutputKind.USER_OUTPUT
    sig.output_specs[:] = user_specs + mutations
    return ep, mutations, reads_layout


def _to_onnx(module, ep, registry, _core, onnx_ir, n_inputs, timings):
    """(the ONNX model of the decomposed program, checked, as a proto; the kind of each state input
    by name). The call's inputs are ``input_<k>``, parameters and buffers graph inputs too."""
    from torch.export.graph_signature import InputKind
    t1 = time.perf_counter()
    try:
        with _without_torch_deprecations():
            program = _core.exported_program_to_onnx_program(ep, registry=registry)
    except Exception as e:
        raise _export_error(module, "translating the exported program to ONNX", e) from e
    timings["translate"] = time.perf_counter() - t1
    model_ir = program.model
    # torch's translator declares the default domain at torchlib's opset (18) whatever the
    # registry's, and torch.onnx.export converts afterwards; the rules here are opset 20's (Gelu
    # is 20's), the version the TorchScript path exports and the engine reads. Declared so, a
    # saved graph (save_onnx, the runner) is valid ONNX.
    model_ir.opset_imports[""] = ONNX_OPSET
    # Parameters and buffers are graph inputs, read where torch keeps them (state_dict names);
    # lifted constants stay initializers.
    state_kinds = {}
    for s in ep.graph_signature.input_specs:
        if s.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            state_kinds[s.target] = s.kind
    graph = model_ir.graph
    for name in list(graph.initializers):
        if name in state_kinds:
            value = graph.initializers.pop(name)
            value.const_value = None
            graph.inputs.append(value)
    user_inputs = [v.name for v in graph.inputs if v.name not in state_kinds]
    if len(user_inputs) != n_inputs:
        raise ExportError(f"the ONNX translation has {len(user_inputs)} call inputs, expected {n_inputs}")
    renames = {}
    for k, v in enumerate(list(graph.inputs)):
        if v.name not in state_kinds:
            renames[v.name] = f"input_{user_inputs.index(v.name)}"
    for v in graph.inputs:
        if v.name in renames:
            v.name = renames[v.name]
    proto = onnx_ir.serde.serialize_model(model_ir)
    _lower_cast_like(proto)
    _check_ops(module, proto)
    return proto, state_kinds


@contextlib.contextmanager
def _without_torch_deprecations():
    """torch's own deprecation warnings while it decomposes and translates (run_decompositions
    deep-copies pytree specs, and each LeafSpec copied warns): nothing the user can act on, and
    the TorchScript path's capture ignores the same categories."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        warnings.simplefilter("ignore", FutureWarning)
        yield


def _attribute_names(module):
    """The names in each submodule's __dict__, before the trace."""
    return {id(m): set(m.__dict__) for m in module.modules()}


def _is_trace_value(v):
    return isinstance(v, flatten._SYMBOLIC_NUMBERS) or (isinstance(v, torch.Tensor) and compat.is_fake(v))


def _user_attributes(module):
    """{(submodule name, attribute): (value, whether it holds a value the trace computed)} for the
    attributes of the module and its submodules that are not nn.Module's own. The parameters and
    buffers themselves (torch's fakes of them, which an RNN's _flat_weights lists) are no such
    value."""
    modules = list(module.named_modules(remove_duplicate=False))
    state = {id(t) for _, m in modules for t in (*m._parameters.values(), *m._buffers.values())}

    def computed(v):
        return _is_trace_value(v) and id(v) not in state
    return {(name, key): (value, flatten.holds(value, computed))
            for name, m in modules for key, value in list(m.__dict__.items()) if key not in flatten.MODULE_ATTRIBUTES}


def _set_to_trace_values(module, before):
    """``sub.name`` of each attribute that holds a value of the trace (a fake tensor or a symbolic
    number, in a container or an object it holds included) and did not before (``before``:
    _user_attributes), or holds another object now: what forward set."""
    changed = []
    for (name, key), (value, traced) in _user_attributes(module).items():
        old = before.get((name, key))
        if traced and (old is None or old[0] is not value or not old[1]):
            changed.append(f"{name + '.' if name else ''}{key}")
    return list(dict.fromkeys(changed))


@contextlib.contextmanager
def _removing_trace_values(module, before):
    """torch.export puts back the module's attributes that existed before the trace, and leaves
    an attribute the forward added with the trace's fake tensor or symbolic number in the user's
    module: such attributes are removed again, whatever the export's outcome (a forward that
    sets them is refused by name: _ExportWrapper reports them)."""
    try:
        yield
    finally:
        for m in module.modules():
            known = before.get(id(m), ())
            for key in [k for k, v in m.__dict__.items()
                        if k not in known and flatten.holds(v, _is_trace_value)]:
                del m.__dict__[key]


def _export_error(module, stage, e):
    cause = e
    while cause is not None and not isinstance(cause, UnsupportedModelError):
        cause = cause.__cause__ or cause.__context__
    if cause is not None:
        return cause
    first = str(e).strip().split("\n", 1)[0]
    first = first[:500] + (" ..." if len(first) > 500 else "")
    branch = _data_dependent_branch(e)
    if branch:
        # e.g. F.gaussian_nll_loss's `if torch.any(var < 0): raise ...`: the trace runs on fake
        # tensors, which have no values to branch on
        first = (f"the forward branches on tensor values at {branch}, which torch.export cannot trace "
                 f"(it does not guard on data-dependent values: {first})")
    return ExportError(f"torch.export capture of {type(module).__name__} failed in {stage}: "
                       f"{type(e).__name__}: {first} (full error in __cause__)")


def _data_dependent_branch(e):
    """'file:line: code' of the Python line whose branch on a tensor's value stopped the trace:
    the innermost frame of the traceback outside torch's tracing machinery and ortmod."""
    import os
    import traceback
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode
    if not isinstance(e, GuardOnDataDependentSymNode):
        return None
    root = os.path.dirname(torch.__file__)
    machinery = tuple(os.path.join(root, d) for d in ("_", "fx", "export", "utils", "overrides.py", "_ops.py",
                                                       "_tensor.py", "__init__.py"))
    own = os.path.dirname(__file__)
    for f in reversed(traceback.extract_tb(e.__traceback__)):
        name = f.filename
        if name.startswith(own) or name.startswith(machinery) or name.startswith("<"):
            continue
        return f"{name}:{f.lineno}: {(f.line or '').strip()}"
    return None


def _drop_unread_state(proto, state_kinds):
    """Removes the parameter and buffer inputs no node reads (torch.export lists every one; the
    TorchScript exporter only those the graph uses): such a parameter is then no input of the
    engine's autograd node, as in eager, where a head the loss leaves out is never reached.
    Passed in, it had a gradient edge that delivered nothing, on which DeepSpeed ZeRO-3's gradient
    hook still ran (and failed on the missing .grad)."""
    read = set()

    def collect(graph):
        for node in graph.node:
            read.update(node.input)
            for attr in node.attribute:
                for sub in ([attr.g] if attr.HasField("g") else []) + list(attr.graphs):
                    collect(sub)
        read.update(o.name for o in graph.output)
    collect(proto.graph)
    keep = [gi for gi in proto.graph.input if gi.name not in state_kinds or gi.name in read]
    if len(keep) != len(proto.graph.input):
        del proto.graph.input[:]
        proto.graph.input.extend(keep)


def _output_vals(ep, n):
    """The traced values of the first ``n`` outputs in signature order, the order the translation
    gives the graph's outputs (the output node's own order can put buffer updates first)."""
    nodes = {node.name: node for node in ep.graph.nodes}
    return [_meta_val(nodes.get(getattr(spec.arg, "name", None))) for spec in ep.graph_signature.output_specs[:n]]


def _check_output_dtypes(module, proto, vals):
    import onnx
    for j, (out, v) in enumerate(zip(proto.graph.output, vals)):
        elem = out.type.tensor_type.elem_type
        if not elem or not isinstance(v, torch.Tensor):
            continue
        want = _ONNX_TYPES.get(v.dtype)
        if want != elem:
            raise UnsupportedModelError(
                f"the torch.export capture of {type(module).__name__} computes output {j} as "
                f"{onnx.TensorProto.DataType.Name(elem)} where eager returns {v.dtype}")
