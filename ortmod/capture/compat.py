"""The one boundary between ortmod and torch's internals.

Every private torch name ortmod touches is reached here and nowhere else in ``ortmod/``
(tests/test_torch_compat.py walks the package for it): torch._C's bindings, ``Function.apply``,
pytree, FakeTensor, torch.export's IR helpers, the ONNX translator's registry and passes
(``torch.onnx._internal.exporter``) and the TorchScript exporter's symbolic helpers, registry and
graph hooks (``torch.onnx._internal.torchscript_exporter``). What changed between the releases
ortmod declares (``SUPPORTED``, pyproject.toml) is decided here, by name:

- ``Function.apply``: a Python classmethod up to 2.13, torch._C's classmethod_descriptor from 2.14
  (which binds default arguments and enters functorch in C). ``call_apply`` calls either.
- clamp's gradient at its bound (``clamp_semantics``): up to 2.13 all of dy reaches x at a bound
  (torch.clamp's backward, the engine's Clip); 2.14 gives none at a number bound and half at a
  tensor bound. Measured on the running torch, not read off its version: the capture rules
  reproduce what eager does here, and a behaviour none of them reproduces is refused by name.

A feature a release lacks raises ``TorchFeatureMissing`` naming the release and the feature, at
capture, never a silent fallback. Importing this module imports torch and nothing heavier; the
exporters' modules load when first asked for.
"""
import contextlib
import functools
import importlib

import torch
import torch.utils._pytree as pytree    # noqa: F401  (ortmod's pytree: tree_map, tree_flatten, ...)

VERSION = torch.__version__.split("+")[0]
RELEASE = tuple(int(p) for p in VERSION.split(".")[:3] if p.isdigit())
# the minors the release matrix runs (Makefile TORCH_RELEASES, pyproject.toml's range)
SUPPORTED = ((2, 10), (2, 14))


class TorchFeatureMissing(RuntimeError):
    """The running torch lacks (or changed) something ortmod needs: named, with the release."""

    def __init__(self, feature, detail=""):
        super().__init__(f"torch {VERSION} {feature}{': ' + detail if detail else ''} (ortmod supports torch "
                         f"{'.'.join(map(str, SUPPORTED[0]))} to {'.'.join(map(str, SUPPORTED[1]))})")
        self.feature = feature


def release_supported():
    return SUPPORTED[0] <= RELEASE[:2] <= SUPPORTED[1]


def _refuse_untested_release():
    """At import: a release outside the matrix is refused by name. ORTMOD_UNTESTED_TORCH=1 lets one
    through on purpose (to try a new release: the behaviours compat measures are still checked
    at capture, and a mode none of the rules reproduces is refused there)."""
    from .._options import options
    if release_supported() or options.untested_torch:
        return
    raise ImportError(f"ortmod is tested with torch {SUPPORTED[0][0]}.{SUPPORTED[0][1]} to "
                      f"{SUPPORTED[1][0]}.{SUPPORTED[1][1]} (pyproject.toml, make test-compat), not torch {VERSION}: "
                      "install a release in that range (ORTMOD_UNTESTED_TORCH=1 imports it anyway, untested)")


_refuse_untested_release()


# ---- pytree key paths --------------------------------------------------------------------------
#
# A class registered with a flatten function only (diffusers' BaseOutput registers every output
# dataclass so) has no key paths: pytree.tree_flatten_with_path raises for it. ortmod's paths name
# leaves in messages and pair an output with the eager run's, so such a node's children are keyed
# by its flatten's context where that lists one key per child (a dict's flatten), else by position.


def _keyed_children(node):
    """[(KeyEntry, child)] of a pytree node, or None for a leaf."""
    node_type = pytree._get_node_type(node)
    node_def = pytree.SUPPORTED_NODES.get(node_type)
    if node_def is None:
        return None
    if node_def.flatten_with_keys_fn is not None:
        return list(node_def.flatten_with_keys_fn(node)[0])
    children, context = node_def.flatten_fn(node)
    children = list(children)
    if isinstance(context, (list, tuple)) and len(context) == len(children) and \
            all(isinstance(k, (str, int)) for k in context):
        return [(pytree.MappingKey(k), c) for k, c in zip(context, children)]
    return [(pytree.SequenceKey(i), c) for i, c in enumerate(children)]


def _key_paths(node, prefix, out):
    keyed = _keyed_children(node)
    if keyed is None:
        out.append((prefix, node))
        return
    for key, child in keyed:
        _key_paths(child, prefix + (key,), out)


def tree_flatten_with_path(tree):
    """pytree.tree_flatten_with_path, also through nodes registered without key paths."""
    try:
        return pytree.tree_flatten_with_path(tree)
    except ValueError as e:
        if "flatten_with_keys_fn" not in str(e):
            raise
    spec = pytree.tree_structure(tree)
    pairs = []
    _key_paths(tree, (), pairs)
    return pairs, spec


def tree_map_with_path(fn, tree, *rests):
    """pytree.tree_map_with_path, also through nodes registered without key paths: ``rests`` must
    have ``tree``'s structure (ValueError/TypeError/KeyError otherwise, as pytree raises)."""
    pairs, spec = tree_flatten_with_path(tree)
    others = [spec.flatten_up_to(r) for r in rests]
    return pytree.tree_unflatten([fn(path, leaf, *(o[i] for o in others))
                                  for i, (path, leaf) in enumerate(pairs)], spec)


# ---- torch._C bindings ORTModule's call path reads (bound once: they are hot) ------------------

from_dlpack = torch._C._from_dlpack
functorch_transforms_active = torch._C._are_functorch_transforms_active
unwrap_if_dead = torch._C._functorch.unwrap_if_dead
is_grad_enabled = torch._C.is_grad_enabled
is_any_autocast_enabled = torch._C._is_any_autocast_enabled
get_tracing_state = torch._C._get_tracing_state
get_value_trace = torch._C._get_value_trace
DisableTorchFunction = torch._C.DisableTorchFunction
JitTensorType = torch._C.TensorType
JitListType = torch._C.ListType
OpOverload = torch._ops.OpOverload
OpOverloadPacket = torch._ops.OpOverloadPacket
BatchNormBase = torch.nn.modules.batchnorm._BatchNorm


def reduction_enum(reduction):
    """torch.nn._reduction.get_enum: a loss's reduction string as its number (ValueError as eager)."""
    return torch.nn._reduction.get_enum(reduction)
nn_linear = torch._C._nn.linear
# torch._debug_has_internal_overlap: 1 where a tensor's elements overlap in memory
has_internal_overlap = torch._debug_has_internal_overlap


def onnx_log_enabled():
    return torch._C._jit_is_onnx_log_enabled()


def set_onnx_log_enabled(enabled):
    torch._C._jit_set_onnx_log_enabled(enabled)


# ---- autograd.Function.apply --------------------------------------------------------------------

def function_apply():
    """The ``apply`` torch.autograd.Function defines (to patch and to restore)."""
    return torch.autograd.Function.__dict__["apply"]


def call_apply(original, cls, *args, **kwargs):
    """Call torch's own ``Function.apply`` (``original``, from ``function_apply``) for ``cls``:
    a classmethod up to 2.13, torch._C's classmethod_descriptor from 2.14; both bind by __get__."""
    return original.__get__(None, cls)(*args, **kwargs)


@contextlib.contextmanager
def patched_function_apply(apply):
    """torch.autograd.Function.apply is ``classmethod(apply)`` inside; torch's own after."""
    original = function_apply()
    torch.autograd.Function.apply = classmethod(apply)
    try:
        yield original
    finally:
        torch.autograd.Function.apply = original


def engine_function_apply(cls):
    """torch._C._FunctionBase.apply bound to ``cls``: the C apply, without the Python wrapper's
    setup_context and functorch handling (ortmod's EngineFunction checks functorch itself)."""
    return torch._C._FunctionBase.__dict__["apply"].__get__(None, cls)


# ---- FakeTensor, torch.export, decompositions ---------------------------------------------------

def detect_fake_mode(tensors):
    return torch._guards.detect_fake_mode(tensors)


def is_fake(t):
    from torch._subclasses.fake_tensor import is_fake as fake
    return fake(t)


def shape_env_of(graph_module):
    from torch.export.exported_program import _get_shape_env
    return _get_shape_env(graph_module)


def rnn_packing_vf():
    """torch.nn.utils.rnn's private ``_VF``, through which pack_padded_sequence and
    pad_packed_sequence reach their ops (capture/packed.py swaps it while capturing)."""
    import torch.nn.utils.rnn as rnn_utils
    return rnn_utils._VF


def set_rnn_packing_vf(vf):
    import torch.nn.utils.rnn as rnn_utils
    rnn_utils._VF = vf


def traced_value(t):
    """The TorchScript tracer's graph value (torch._C.Value) of ``t``, while it traces."""
    return torch._C._get_value_trace(t)


def decomposition_table():
    from torch._decomp import decomposition_table as table
    return table


def propagate_real_tensors():
    """functorch's config: fake tensors that carry their real values while torch.export traces."""
    import torch._functorch.config as functorch_config
    return functorch_config.patch(fake_tensor_propagate_real_tensors=True)


def backed_size_oblivious():
    return torch.fx.experimental._config.patch(backed_size_oblivious=True)


def size_oblivious(enabled):
    return torch.fx.experimental._config.patch(backed_size_oblivious=enabled)


# ---- private modules, reached by name ----------------------------------------------------------

class Internals:
    """A torch module's private names without their underscore: ``ns.get_const`` is the module's
    ``_get_const`` (or ``get_const`` where it has no private one). The module loads on first use;
    a release without it or without a name raises TorchFeatureMissing naming both."""

    def __init__(self, feature, *modules):
        self._feature, self._modules, self._module = feature, modules, None

    def module(self):
        if self._module is None:
            errors = []
            for name in self._modules:
                try:
                    self._module = importlib.import_module(name)
                    break
                except ImportError as e:
                    errors.append(f"{name}: {e}")
            else:
                raise TorchFeatureMissing(f"has no {self._feature}", "; ".join(errors))
        return self._module

    def _resolve(self, name):
        m = self.module()
        for candidate in ("_" + name, name):
            if hasattr(m, candidate):
                return candidate
        raise TorchFeatureMissing(f"has no {self._feature} {name} ({m.__name__})")

    def __getattr__(self, name):
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.module(), self._resolve(name))

    def has(self, name):
        try:
            self._resolve(name)
            return True
        except TorchFeatureMissing:
            return False

    @contextlib.contextmanager
    def patched(self, name, value):
        """Set the module's ``name`` (private or not) to ``value`` inside, restore it after."""
        m, attr = self.module(), self._resolve(name)
        original = getattr(m, attr)
        setattr(m, attr, value)
        try:
            yield original
        finally:
            setattr(m, attr, original)


_TS = "torch.onnx._internal.torchscript_exporter"
# the TorchScript exporter (torch.onnx.export(dynamo=False))
symbolic_helper = Internals("TorchScript exporter symbolic helper", "torch.onnx.symbolic_helper",
                            f"{_TS}.symbolic_helper")
ts_utils = Internals("TorchScript exporter", f"{_TS}.utils", "torch.onnx.utils")
ts_type_utils = Internals("TorchScript exporter type table", f"{_TS}._type_utils", "torch.onnx._type_utils")
ts_registration = Internals("TorchScript exporter symbolic registry", f"{_TS}.registration",
                            "torch.onnx._internal.registration")
ts_proto_utils = Internals("TorchScript exporter onnx-script hook", f"{_TS}.onnx_proto_utils",
                           "torch.onnx._internal.onnx_proto_utils")
ts_opset11 = Internals("TorchScript exporter opset 11", f"{_TS}.symbolic_opset11", "torch.onnx.symbolic_opset11")
ts_opset12 = Internals("TorchScript exporter opset 12", f"{_TS}.symbolic_opset12", "torch.onnx.symbolic_opset12")

# the ONNX translator of torch.export programs (torch.onnx.export(dynamo=True))
_EX = "torch.onnx._internal.exporter"
# torch.export's tracer (its fakes of parameters and buffers)
export_trace = Internals("torch.export tracer", "torch.export._trace")
onnx_core = Internals("ONNX translator", f"{_EX}._core")
onnx_registration = Internals("ONNX translator registry", f"{_EX}._registration")
onnx_fx_passes = Internals("ONNX translator passes", f"{_EX}._fx_passes")
onnx_tensors = Internals("ONNX translator tensors", f"{_EX}._tensors")
onnx_torchlib = Internals("ONNX translator's own torchlib", f"{_EX}._torchlib._torchlib_registry")


def prepare_for_onnx(ep, registry, after_decomposition, after_promotion):
    """torch's _core._prepare_exported_program_for_export: decomposition for the registry, explicit
    type promotion, assertions removed, under backed_size_oblivious as there; with
    ``after_decomposition(graph_module)`` run between decomposition and type promotion, and
    ``after_promotion(graph_module)`` after it."""
    passes = onnx_fx_passes
    with backed_size_oblivious():
        ep = passes.decompose_with_registry(ep, registry)
        gm = ep.graph_module
        after_decomposition(gm)
        with _promotion_finds_its_own_overload():
            passes.insert_type_promotion_nodes(gm)
        after_promotion(gm)
        gm = passes.remove_assertion_nodes(gm)
        ep._graph_module = gm
        return ep


onnx_type_promotion = Internals("ONNX translator's type promotion pass", "torch.onnx._internal.fx.passes.type_promotion")


@contextlib.contextmanager
def _promotion_finds_its_own_overload():
    """The type-promotion pass re-dispatches a promoted node's op under a dispatch mode and takes
    the first op it records as the node's new overload. On torch 2.11 and 2.12 a re-run with a
    number argument records ``prim.device`` first (a composite overload's device query, as
    where.ScalarOther's before its where.self), and the pass fails with "Expected same OpOverload
    packet, got prim.device != aten.mul". The overload is the one the packet's schemas match for
    these arguments (what the dispatcher resolves, before any composite decomposes); where that
    cannot be told, the first recorded op of the node's own packet; none is still its error."""
    if not onnx_type_promotion.has("OpTraceDispatchMode") or not onnx_type_promotion.has("find_compatible_op_overload"):
        yield
        return
    trace_mode = onnx_type_promotion.OpTraceDispatchMode

    def find_compatible_op_overload(op, args, kwargs):
        try:
            name = torch._C._jit_resolve_packet(op._qualified_op_name, *args, **kwargs)
            return getattr(op, name or "default")
        except Exception:       # noqa: BLE001  (arguments the schema matcher cannot read: dispatch tells)
            pass
        mode = trace_mode()
        with mode:
            op(*args, **kwargs)
        own = [o for o in mode.traced_ops if isinstance(o, OpOverload) and o.overloadpacket == op]
        if not own:
            raise AssertionError(f"Expected an overload of {op} among the traced ops {mode.traced_ops}")
        return own[0]
    with onnx_type_promotion.patched("find_compatible_op_overload", find_compatible_op_overload):
        yield


@functools.lru_cache(maxsize=None)
def view_copy_copies_on_fakes():
    """Whether aten.view_copy of strides a view cannot take copies on fake tensors, as its real
    kernel does (2.12 on); 2.10 and 2.11's fake kernel raises "Cannot view a tensor ..."."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        try:
            torch.ops.aten.view_copy.default(torch.empty(2, 3).t(), [6])
            return True
        except (RuntimeError, ValueError):
            return False


def torchlib_registry(opset):
    """The registry torch's ONNXRegistry.from_torchlib builds, with each function's ONNX signature
    inferred when the translation first asks for its op rather than for all ~500 up front.

    from_torchlib spends about half its 0.6 s of every process's first export inferring
    signatures (and parsing each function's source for its domain, which it then drops), while
    a model reads a few dozen. Same functions, same order, same signatures: a test compares the
    two registries op by op."""
    reg = onnx_registration.module()
    from onnxscript.function_libs.torch_lib import ops, registration    # noqa: F401  (registers the ops)

    class Registry(reg.ONNXRegistry):
        def get_decomps(self, target):
            decomps = super().get_decomps(target)
            for meta in decomps:
                if meta.skip_signature_inference and getattr(meta, "_ortmod_deferred", False):
                    meta.skip_signature_inference = meta._ortmod_deferred = False
                    meta.__post_init__()
            return decomps

        def is_registered(self, target):
            return bool(super().get_decomps(target))

    registry = Registry()
    registry._opset_version = opset
    for meta in onnx_torchlib.get_torchlib_ops():
        registry._register(meta.fx_target, meta)
    for qualified_name, functions in registration.default_registry.items():
        if qualified_name.startswith("internal::"):
            continue
        try:        # as from_torchlib: an op this torch lacks is skipped
            target = reg._get_overload(qualified_name)
        except Exception:
            target = None
        if target is None:
            continue
        for fn, is_complex in [(f, False) for f in functions.overloads] + [(f, True) for f in functions.complex]:
            meta = reg.OnnxDecompMeta(onnx_function=fn, fx_target=target, signature=None,
                                      is_complex=is_complex, skip_signature_inference=True)
            meta._ortmod_deferred = True
            registry._register(target, meta)
    registry._cleanup_registry_based_on_opset_version()
    return registry


def torchscript_exporter_present():
    """False on a torch without the TorchScript exporter (the day it goes): the export path only."""
    try:
        ts_utils.module()
        return True
    except TorchFeatureMissing:
        return False


# ---- FSDP2 (torch.distributed.fsdp.fully_shard): the per-module state behind FSDPModule -------
# FSDPModule's public methods (unshard, reshard, set_requires_gradient_sync, ...) cover a user's
# eager loop; what FSDP's own forward hooks and autograd callback do around a forward (the root's
# lazy init and stream waits, each param group's post-backward reduce-scatter, the end-of-backward
# finalization) has no public entry: ortmod/_fsdp2.py reaches it here. Names as of torch 2.10-2.14.

def fsdp2_state(module):
    """The FSDPState that fully_shard attached to ``module`` (an FSDPModule)."""
    get = getattr(module, "_get_fsdp_state", None)
    if get is None:
        raise TorchFeatureMissing("has no FSDPModule._get_fsdp_state (FSDP2's per-module state), which ortmod "
                                  "needs to run FSDP2 around its engine")
    return get()


def fsdp2_param_groups(state):
    """The state's FSDPParamGroups (one per device mesh; none for a module without parameters)."""
    groups = getattr(state, "_fsdp_param_groups", None)      # a list where a release has per-parameter meshes
    if groups is not None:
        return list(groups)
    if not hasattr(state, "_fsdp_param_group"):
        raise TorchFeatureMissing("has no FSDPState._fsdp_param_groups or _fsdp_param_group (FSDP2's "
                                  "parameter groups)")
    group = state._fsdp_param_group
    return [] if group is None else [group]


def _fsdp2_member(obj, name, what):
    member = getattr(obj, name, None)
    if member is None:
        raise TorchFeatureMissing(f"has no {type(obj).__name__}.{name} ({what})")
    return member


def fsdp2_is_root(state):
    """True, False, or None before FSDP's lazy init decided."""
    return getattr(state, "_is_root", None)


def fsdp2_root_pre_forward(state, module):
    """What FSDP's root pre-forward hook does before the first submodule runs: the lazy init
    (which state is the root, the shared communication context) and, on an accelerator, the
    all-gather streams' wait for the current stream (the optimizer's writes). The forward it
    would mark as in progress is not marked: ortmod runs no FSDP forward hook after it."""
    _fsdp2_member(state, "_root_pre_forward", "FSDP2's root pre-forward")(module, (), {})
    _fsdp2_member(state, "_state_ctx", "FSDP2's shared state").iter_forward_root = None


def fsdp2_post_backward_final(state):
    """FSDP's end-of-backward callback on a root state: each param group not yet post-backward
    runs it (reduce-scatter of the unsharded gradients into the DTensor shards' .grad, reshard),
    then every group's finalization and the per-iteration state reset."""
    _fsdp2_member(state, "_root_post_backward_final_callback", "FSDP2's end-of-backward callback")()


def queue_backward_callback(fn):
    """Run fn once the autograd engine finished the current backward pass (after every gradient
    was accumulated into .grad): what FSDP queues its own end-of-backward callback with."""
    torch.autograd.Variable._execution_engine.queue_callback(fn)


# ---- clamp's gradient at its bound, as eager computes it on this torch -------------------------

# the modes the capture rules reproduce: (number bound, tensor bound)
CLAMP_INCLUSIVE = "inclusive"        # all of dy at a bound, 0 at NaN: torch.clamp's backward to 2.13 (Clip)
CLAMP_EXCLUSIVE = "exclusive"        # none at a bound, 0 at NaN (2.14's number bounds)
CLAMP_HALF = "half"                  # half at a bound, all at both (lo == hi), all at NaN (2.14's tensor bounds)

_PROBE_X = [float("nan"), -2.0, -1.0, -0.5, 0.5, 1.0, 2.0, float("inf"), -float("inf")]


def _expected(mode, lo, hi):
    out = []
    for x in _PROBE_X:
        if x != x:
            out.append(1.0 if mode == CLAMP_HALF else 0.0)
        elif (lo is not None and x < lo) or (hi is not None and x > hi):
            out.append(0.0)
        else:
            ties = (lo is not None and x == lo) + (hi is not None and x == hi)
            out.append({CLAMP_INCLUSIVE: 1.0, CLAMP_EXCLUSIVE: 0.0 if ties else 1.0,
                        CLAMP_HALF: 0.5 if ties == 1 else 1.0}[mode])
    return out


@functools.lru_cache(maxsize=None)
def clamp_semantics():
    """(number-bound mode, tensor-bound mode) of eager's clamp gradient on this torch, each one of
    CLAMP_INCLUSIVE / CLAMP_EXCLUSIVE / CLAMP_HALF, or None where eager does something else
    (the rules then refuse clamp by name). Nine values, float64, once per process."""
    with torch.enable_grad():
        def grads(fn, *bounds):
            x = torch.tensor(_PROBE_X, dtype=torch.float64, requires_grad=True)
            fn(x, *bounds).sum().backward()
            return x.grad.tolist()
        t = lambda b: None if b is None else torch.tensor(b, dtype=torch.float64)     # noqa: E731
        cases = [(-1.0, 1.0), (-1.0, None), (None, 1.0), (1.0, 1.0)]
        number = [(lo, hi, grads(lambda x, a, b: torch.clamp(x, a, b), lo, hi)) for lo, hi in cases]
        number += [(-1.0, None, grads(lambda x: torch.clamp_min(x, -1.0))),
                   (None, 1.0, grads(lambda x: torch.clamp_max(x, 1.0)))]
        tensor = [(lo, hi, grads(lambda x, a, b: torch.clamp(x, a, b), t(lo), t(hi))) for lo, hi in cases]
        tensor += [(-1.0, None, grads(lambda x: torch.clamp_min(x, t(-1.0)))),
                   (None, 1.0, grads(lambda x: torch.clamp_max(x, t(1.0))))]

    def mode(measured, modes):
        for m in modes:
            if all(got == _expected(m, lo, hi) for lo, hi, got in measured):
                return m
        return None
    return (mode(number, (CLAMP_INCLUSIVE, CLAMP_EXCLUSIVE)), mode(tensor, (CLAMP_INCLUSIVE, CLAMP_HALF)))


def require_clamp_mode(kind):
    """The mode of eager's clamp gradient for ``kind`` ("number" or "tensor") bounds, or
    TorchFeatureMissing where it is none the capture rules reproduce."""
    m = clamp_semantics()[0 if kind == "number" else 1]
    if m is None:
        raise TorchFeatureMissing(f"computes clamp's gradient at a {kind} bound in a way ortmod does not "
                                  "reproduce (ortmod.capture.compat.clamp_semantics)")
    return m
