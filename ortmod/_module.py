"""ORTModule: wraps an nn.Module so that its forward and backward run on the ortmod engine.

Caching, in two levels:

* export key  -> the exported ONNX bytes and how graph inputs/outputs map to the call
  (argument structure, per tensor dtype/rank/device, non-tensor values, train/eval,
  grad mode, parameter and buffer names/dtypes/devices/ties);
* full key    -> an engine built from those bytes (the export key plus which inputs and
  parameters require grad). Changing ``requires_grad`` builds a new engine from the
  cached bytes: the backward graph changes, the export does not.

Both levels are bounded: the ``max_cached_graphs`` most recently used engines are kept
(DebugOptions, ORTMOD_MAX_CACHED_GRAPHS, default 16), and the exports they were built from;
the least recently used is dropped (its engine is freed once no autograd graph holds it).
Each engine keeps ``max_cached_plans`` plans, one per input shape set, the same way
(ORTMOD_MAX_CACHED_PLANS, default 32). A non-tensor argument that takes a new value call
after call re-exports every time: one warning names it.

Per call only the inputs are flattened and keyed; the parameter/buffer scan is kept
between calls and re-verified cheaply (dtype and requires_grad per tensor). Structural
changes — a parameter, buffer or submodule registered anywhere inside the wrapped module,
or an attribute set on the ORTModule — mark the module *dirty*: the next call exports
again and keeps its engines only if the new ONNX bytes are identical.
"""
import contextlib
import collections
import json
import logging
import dataclasses
import inspect
import os
import sys
import warnings
import weakref

import torch

from .capture import compat
from .capture.compat import pytree

from .capture import flatten, errors, torchscript, python_op as pyop
from . import _fsdp2, _options, _quiet, _threads, _zero3
from ._function import CompiledCall, run_inference, run_training
from ._logging import LogLevel, configure, engine_log_callback, logger
from ._options import options
from ._report import summarize


@dataclasses.dataclass
class DebugOptions:
    """Debugging knobs, per ORTModule. Defaults for the fields that have an environment variable
    come from ``ortmod.options`` (ortmod/_options.py: the environment, read once, or what was set
    there); a value given here wins.

    log_level:   LogLevel for the "ortmod" logger and the engine's log callback
                 (the environment variable ORTMODULE_LOG_LEVEL, a LogLevel name or number,
                 overrides it).
    save_onnx:   write the exported, optimized and execution graphs as ONNX files:
                 ``<save_path>/<onnx_prefix>_torch_exported_<training|inference>.onnx``,
                 ``..._optimized_<mode>.onnx`` and ``..._execution_model_<mode>.onnx``.
    strict_trace: a Python value the trace froze (``.item()``, ``if tensor:``, a number from a
                 shape) is an error (UnsupportedModelError) instead of a warning and a guarded
                 graph (also ORTMOD_STRICT_TRACE=1).
    inline_autograd_functions: a custom torch.autograd.Function's forward is exported inline and
                 the engine differentiates it (its own backward is not used). Off by default: the
                 user's forward and backward run in PyTorch, called from the engine's graph
                 (also ORTMOD_INLINE_AUTOGRAD_FUNCTIONS=1).
    capture:     how the forward is captured (also ORTMOD_CAPTURE): "torchscript" (torch's
                 TorchScript ONNX exporter, ortmod/capture/torchscript.py), "export" (torch.export,
                 ortmod/capture/export.py) or "auto" (the default: torch.export, and the TorchScript
                 exporter where torch.export's path is missing or cannot capture the model).
    max_cached_graphs: exports and engines kept per ORTModule, the least recently used dropped
                 past it (one per schema: non-tensor argument values, train/eval, ...). None: the
                 environment variable ORTMOD_MAX_CACHED_GRAPHS, else 16.
    max_cached_plans: plans kept per engine, one per input shape set (a new batch size or
                 sequence length plans again, it does not export), least recently used dropped
                 past it. None: ORTMOD_MAX_CACHED_PLANS, else 32.
    """

    log_level: LogLevel = LogLevel.WARNING
    save_onnx: bool = False
    onnx_prefix: str = ""
    save_path: str = ""
    strict_trace: bool = False
    inline_autograd_functions: bool = False
    capture: str = ""
    max_cached_graphs: int = None
    max_cached_plans: int = None

    def __post_init__(self):
        self.log_level = LogLevel(int(self.log_level))
        # defaults from the environment come through ortmod.options (_options.py), read once
        self.strict_trace = bool(self.strict_trace) or options.strict_trace
        self.inline_autograd_functions = bool(self.inline_autograd_functions) or options.inline_autograd_functions
        self.capture = _options._capture(self.capture, "DebugOptions(capture=...)") if self.capture else options.capture
        self.max_cached_graphs = cache_limit("max_cached_graphs", self.max_cached_graphs)
        self.max_cached_plans = cache_limit("max_cached_plans", self.max_cached_plans)


def cache_limit(field, value):
    """A cache limit: ``value`` when given (an int in 1..2^20, else ValueError naming the field),
    else ortmod.options' (its environment variable, else the default)."""
    if value is not None:
        return _options._cache_limit(value, f"DebugOptions.{field}")
    if field == "max_cached_plans":
        try:
            return options.max_cached_plans     # the engine's option
        except ImportError:                     # no engine to use it: ORTModule falls back or raises
            return _options.DEFAULT_MAX_CACHED_PLANS
    return getattr(options, field)


def log_level_from_env(default):
    """ORTMODULE_LOG_LEVEL (ortmod.options.log_level), where set, overrides ``default``."""
    level = options.log_level
    return default if level is None else level


# --------------------------------------------------------------------------- change tracking
#
# torch calls global registration hooks whenever any module gets a parameter, buffer or
# submodule assigned. Modules inside a wrapped model map to the ORTModules that wrap them;
# a registration there marks those ORTModules dirty. The module hook also refuses
# nn.DataParallel around an ORTModule, at construction, with a clear message.

_WATCHERS = weakref.WeakKeyDictionary()     # submodule -> WeakSet of ORTModules


def _mark_dirty(parent):
    try:
        watchers = _WATCHERS.get(parent)
    except TypeError:                       # an unhashable/unweakrefable module
        return
    if watchers:
        for m in list(watchers):
            m.__dict__["_ortmod_dirty"] = True


def _on_module_registration(parent, name, value):
    if isinstance(value, ORTModule) and isinstance(parent, torch.nn.DataParallel):
        raise TypeError(
            "ortmod: nn.DataParallel around ORTModule is not supported (DataParallel replicates "
            "the module per device in one process, which the engine cannot follow). Use "
            "torch.nn.parallel.DistributedDataParallel(ORTModule(model)) with one process per "
            "device instead.")
    _mark_dirty(parent)


def _on_tensor_registration(parent, name, value):
    _mark_dirty(parent)


torch.nn.modules.module.register_module_module_registration_hook(_on_module_registration)
torch.nn.modules.module.register_module_parameter_registration_hook(_on_tensor_registration)
torch.nn.modules.module.register_module_buffer_registration_hook(_on_tensor_registration)


def _watch(ortmodule):
    for m in ortmodule.__dict__["_modules"]["_original_module"].modules():
        try:
            _WATCHERS.setdefault(m, weakref.WeakSet()).add(ortmodule)
        except TypeError:
            pass


def _autocast_key():
    """The autocast state the export traces (its Casts become the graph's): one graph per state,
    so a call outside autocast never runs a graph traced inside it, nor the other way round."""
    return tuple((dev, torch.get_autocast_dtype(dev)) for dev in ("cpu", "cuda") if torch.is_autocast_enabled(dev))


# --------------------------------------------------------------------------- cache entries

_MISS = object()
_Tensor = torch.Tensor
_grad_enabled = compat.is_grad_enabled
_any_autocast = compat.is_any_autocast_enabled
_torch_threads = torch.get_num_threads
_nn_module = torch.nn.modules.module
_tracing_state = compat.get_tracing_state
_unwrap_if_dead = compat.unwrap_if_dead
# top-level argument types whose schema key is their capture.flatten.constant_key (each a pytree leaf,
# None included): a call that passes equal ones in the same places flattens alike
_FAST_CONSTANTS = frozenset({type(None), bool, int, float, str})


class CallKey:
    """A keyed call: its flattened inputs and the keys they select. ``export``: the export's key
    (input structure and per-leaf keys, train/eval, grad mode, the state's signature, autocast),
    shared by both capture paths; ``full``: the engine's (the export key, plus with grad enabled
    which inputs and parameters require grad)."""

    __slots__ = ("flat", "export", "full", "want_grad")

    def __init__(self, flat, training, state):
        inputs_key, input_grads = flatten.input_keys(flat)
        # eval mode with grad enabled is still differentiated (saliency maps, adversarial inputs,
        # a validation loop without no_grad): eager autograd records it, so does ortmod
        self.flat = flat
        self.want_grad = grad = _grad_enabled()
        self.export = (inputs_key, training, grad, state.signature_id, _autocast_key())
        self.full = (self.export, input_grads, state.grads) if grad else (self.export,)

    def shaped(self):
        """The call's tensor leaves, in order (what an export's shape checks read)."""
        leaves = self.flat.leaves
        return [leaves[i] for i in self.flat.tensor_indices()]


class _ExportRecord:
    __slots__ = ("exported", "stale")

    def __init__(self, exported):
        self.exported = exported
        self.stale = False


class _Entry:
    """One engine: built from one export for one requires_grad pattern."""

    __slots__ = ("engine", "call", "names", "needs_grad", "output_spec", "output_leaves",
                 "output_positions", "single", "state_updates", "counters", "input_slots", "state_names",
                 "template", "template_generation", "guards", "static_dims", "shape_guard", "layouts",
                 "checks_shapes")

    def __init__(self, engine, exported, needs_grad, functions=None):
        self.engine = engine
        self.needs_grad = needs_grad
        self.names = list(exported.graph_inputs)
        diff = list(engine.output_differentiable)
        for index, _ in exported.state_updates:       # running stats: never differentiated
            diff[index] = False
        for guard in exported.guards:                  # frozen-value checks: never differentiated
            diff[guard.output_index] = False
        position = {name: i for i, name in enumerate(self.names)}
        deps = [frozenset(position[n] for n in d if n in position) for d in exported.output_deps]
        self.call = CompiledCall(engine, diff, len(self.names),
                                 deps if len(deps) == len(diff) else None, functions)
        self.relink(exported)

    def relink(self, exported):
        """Take the input/output mapping of ``exported`` (same ONNX bytes as the engine's)."""
        self.output_spec = exported.output_spec
        self.output_leaves = exported.output_leaves
        self.output_positions = exported.output_tensor_positions
        self.single = self.output_spec.is_leaf()          # the module returned one tensor
        self.state_updates = exported.state_updates
        self.counters = exported.counters
        gis = [exported.graph_inputs[n] for n in self.names]
        self.input_slots = [(pos, gi.leaf_index) for pos, gi in enumerate(gis) if gi.kind == "input"]
        self.state_names = [(pos, gi.state_name) for pos, gi in enumerate(gis) if gi.kind == "state"]
        self.template = None
        self.template_generation = -1
        self.guards = exported.guards
        self.static_dims = exported.static_dims
        self.shape_guard = exported.shape_guard
        self.layouts = exported.layouts
        self.checks_shapes = bool(self.static_dims) or self.shape_guard is not None or self.layouts is not None
        if self.call.functions is not None:      # same bytes, so the function ids line up
            self.call.functions.specs = exported.functions

    def shape_miss(self, shaped):
        """Why the export does not hold for a call whose tensor leaves are ``shaped`` (in order):
        "dims" (a dim it holds only at its traced size has another), "guard" (torch.export
        specialised a size, or related two, that the call does not match), "layout" (a kernel
        eager picks by memory layout meets another layout); None where it holds."""
        for k, dim, size in self.static_dims:
            if shaped[k].shape[dim] != size:
                return "dims"
        if self.shape_guard is not None and not self.shape_guard.holds(tuple(tuple(t.shape) for t in shaped)):
            return "guard"
        if self.layouts is not None and flatten.tensor_layouts(shaped) != self.layouts:
            return "layout"
        return None

    def varied_dims(self, shaped):
        """The (tensor, dim) pairs of static_dims whose size the call changes."""
        return {(k, dim) for k, dim, size in self.static_dims if shaped[k].shape[dim] != size}

    def inputs(self, leaves, state):
        if self.template_generation != state.generation:
            template = [None] * len(self.names)
            for pos, name in self.state_names:
                template[pos] = state.by_name[name]
            self.template = template
            self.template_generation = state.generation
        tensors = self.template.copy()
        for pos, leaf in self.input_slots:
            # a functorch wrapper left over from a finished transform (torch.func.grad's argument
            # kept by the user) is its tensor again, as torch.autograd.Function.apply would make it
            tensors[pos] = _dense(_unwrap_if_dead(leaves[leaf]))
        return tensors

    def rebuild(self, outputs):
        if self.single:
            return outputs[0]
        leaves = list(self.output_leaves)
        for pos, t in zip(self.output_positions, outputs):
            leaves[pos] = t
        return pytree.tree_unflatten(leaves, self.output_spec)

    def update_state(self, outputs, state):
        """BatchNorm bookkeeping, as eager does it: the engine computed the new running
        statistics; they go into the module's own buffers, in place, and each
        num_batches_tracked counts the step."""
        by_name = state.by_name
        with torch.no_grad():
            for index, name in self.state_updates:
                by_name[name].copy_(outputs[index])
            for name in self.counters:
                by_name[name].add_(1)


class _Fast:
    """The call that a module's last keyed call ran, kept so that the next call with the same key
    skips flattening, keying and the cache lookup: what CallKey computes from the arguments is
    re-checked against what it computed then, every item of the key, and any difference (or
    anything that the keyed path would do differently: a dirty module, another state scan,
    ZeRO-3) goes the keyed way.

    Per top-level argument (positional, then keyword in order) it holds the exact type and, for a
    tensor, (dtype, rank, requires_grad, device), for a constant its key: equal ones give an equal
    pytree structure and equal leaf keys, hence the same export and full key. The shape checks that
    depend on sizes run as in the keyed path (Entry.shape_miss). The entry is the cache's most
    recently used one (the keyed path drops this record before it touches the cache), so a call
    here leaves the cache's order as the keyed path would."""

    __slots__ = ("entry", "state", "module", "export_key", "nargs", "kwnames", "types", "tensor_keys", "constants",
                 "training", "grad", "autocast", "template", "input_slots", "tensor_positions", "dense", "attrs_are",
                 "steady_inputs")

    @classmethod
    def make(cls, module, state, entry, key, args, kwargs, C):
        """The record of a call that just ran ``entry`` under ``key`` (a CallKey; ``C``: the
        extension, whose loops check the state and CPU inputs), or None where its arguments are
        not all tensors and plain constants at the top level (then every call is keyed)."""
        values = list(args)
        values.extend(kwargs.values())
        tensor_keys, constants = [], []
        for i, v in enumerate(values):
            if isinstance(v, _Tensor):
                device = v.device
                tensor_keys.append((i, v.dtype, v.dim(), v.requires_grad, device.type == "cpu", device))
            elif type(v) in _FAST_CONSTANTS:
                constants.append((i, flatten.constant_key(v)))
            else:
                return None
        # every argument is one leaf (the exact types make that hold for a later call too), unless a
        # tensor subclass is one that pytree flattens further
        leaves = key.flat.leaves
        if len(values) != len(leaves) or any(a is not b for a, b in zip(values, leaves)):
            return None
        template = [None] * len(entry.names)
        for pos, name in entry.state_names:
            template[pos] = state.by_name[name]
        self = cls()
        self.entry, self.state, self.module, self.export_key = entry, state, module, key.export
        self.nargs, self.kwnames = len(args), tuple(kwargs)
        self.types = tuple(map(type, values))
        self.tensor_keys = tuple(tensor_keys)
        self.constants = tuple(constants)
        self.training, self.grad, self.autocast = key.export[1], key.export[2], key.export[4]
        self.template = template
        self.input_slots = tuple(entry.input_slots)
        self.tensor_positions = tuple(k[0] for k in tensor_keys)
        self.dense = any(not k[4] for k in tensor_keys)     # CUDA inputs: made dense as the keyed path does
        self.attrs_are, self.steady_inputs = C.attrs_are, C.steady_inputs
        return self

    def inputs(self, d, args, kwargs):
        """The engine's inputs for this call when its key is the recorded one and the entry's
        shape checks hold, else _MISS."""
        state = self.state
        if (d["_ortmod_dirty"] or d["_ortmod_state"] is not state or len(args) != self.nargs
                or (tuple(kwargs) != self.kwnames if kwargs or self.kwnames else False)
                or self.module.training is not self.training or _grad_enabled() is not self.grad
                or (_autocast_key() != self.autocast if _any_autocast() else self.autocast)
                # state.still_valid(), less its frame
                or not self.attrs_are(state.params, "requires_grad", state.grads)
                or not self.attrs_are(state.tensors, "dtype", state.dtypes)
                or (state.params and hasattr(state.params[0], "ds_status"))):
            return _MISS
        values = args + tuple(kwargs.values()) if kwargs else args
        if self.dense:            # CUDA inputs: here, made dense as the keyed path does
            tensors = self._cuda_inputs(values)
        else:                     # the same checks and list, in the extension
            tensors = self.steady_inputs(values, self.types, self.tensor_keys, self.template, self.input_slots,
                                         _unwrap_if_dead)
        if tensors is None:
            return _MISS
        for i, key in self.constants:
            if flatten.constant_key(values[i]) != key:
                return _MISS
        entry = self.entry
        if entry.checks_shapes and entry.shape_miss([values[i] for i in self.tensor_positions]) is not None:
            return _MISS
        return tensors

    def _cuda_inputs(self, values):
        if tuple(map(type, values)) != self.types:
            return None
        for i, dtype, rank, requires_grad, cpu, device in self.tensor_keys:
            v = values[i]
            if (v.dtype is not dtype or v.dim() != rank or v.requires_grad is not requires_grad
                    or (not v.is_cpu if cpu else v.device != device)):
                return None
        tensors = self.template.copy()
        for pos, i in self.input_slots:
            tensors[pos] = _dense(_unwrap_if_dead(values[i]))
        return tensors


def _dense(t):
    # The engine reads CUDA tensors in place and needs them dense (the binding copies strided
    # CPU tensors itself): a sliced CUDA batch (input_ids[:, :-1]) is laid out anew, the
    # layout copy being the only thing torch does with it.
    return t.contiguous() if t.is_cuda and not t.is_contiguous() else t


def _load_C():
    try:
        from . import _C
    except ImportError as e:
        raise ImportError(
            "ortmod's C extension (ortmod._C) is not built or failed to load: "
            f"{e}. Build it with `make setup` (or `pip install .`).") from e
    _threads.share_torch_threads(_C)
    return _C


# --------------------------------------------------------------------------- forward

def _ortmodule_forward(self, *args, **kwargs):
    """ORTModule's forward as a plain function (what ``ORTModule.forward`` and a bound forward's
    ``__func__`` are: a wrapper that rebinds it, as Accelerate's mixed-precision output cast does,
    still runs the engine)."""
    return self._ortmod_forward(args, kwargs)


class _BoundForward:
    # ``ORTModule(model).forward``: a call runs the engine, as the method did; what introspects a
    # callable (inspect.signature, ``__wrapped__``, ``__name__``, ``__doc__``) sees the wrapped
    # model's forward. The HF Trainer drops every dataset column that the signature does not name:
    # with ``(*args, **kwargs)`` it dropped them all. (No docstring: ``__doc__`` is the wrapped one.)

    __slots__ = ("__self__",)

    def __init__(self, owner):
        self.__self__ = owner

    def __call__(self, *args, **kwargs):
        return self.__self__._ortmod_forward(args, kwargs)

    @property
    def __func__(self):
        return _ortmodule_forward

    @property
    def __wrapped__(self):
        return self.__self__._modules["_original_module"].forward

    @property
    def __signature__(self):
        return inspect.signature(self.__wrapped__)

    @property
    def __name__(self):
        return getattr(self.__wrapped__, "__name__", "forward")

    @property
    def __doc__(self):
        return getattr(self.__wrapped__, "__doc__", None)

    def __eq__(self, other):
        return isinstance(other, _BoundForward) and other.__self__ is self.__self__

    def __hash__(self):
        return hash((_BoundForward, id(self.__self__)))

    def __repr__(self):
        return f"<ORTModule forward of {self.__wrapped__!r}>"


class _ForwardDescriptor:
    """``ORTModule.forward``: on the class the plain function, on an instance a _BoundForward."""

    def __get__(self, obj, cls=None):
        return _ortmodule_forward if obj is None else _BoundForward(obj)


_FSDP2_REVERSE_REFUSAL = (
    "ortmod: fully_shard(ORTModule(model)) is not supported: FSDP2 would swap the ORTModule's class and gather "
    "its parameters around a call the engine runs as one graph. Shard the model, then wrap it: "
    "ORTModule(fully_shard(model)), with fully_shard applied to each block first (ortmod/_fsdp2.py)")


def _new_ortmodule():
    return ORTModule.__new__(ORTModule)


# --------------------------------------------------------------------------- ORTModule

class ORTModule(torch.nn.Module):
    """``model = ORTModule(model)``: forward and backward of ``model`` run on the ortmod engine.

    The first call with a new schema (argument structure, dtypes, ranks, devices,
    non-tensor values, train/eval, grad mode, parameter dtypes) exports the module to
    ONNX and builds an engine for it; later calls with that schema reuse it, whatever the
    sizes. Which tensors require grad selects an engine built from the same export.
    Parameters, buffers and state_dict keys are those of the wrapped module, which
    ``.module`` returns. Export or engine failures raise, naming the cause, unless
    ORTMODULE_FALLBACK_POLICY allows running the module in PyTorch instead.
    """

    def __init__(self, module, debug_options=None):
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"ORTModule wraps a torch.nn.Module, got {type(module).__name__}")
        if isinstance(module, ORTModule):
            raise TypeError("ORTModule: the module is already an ORTModule")
        if debug_options is None:
            debug_options = DebugOptions()
        elif not isinstance(debug_options, DebugOptions):
            raise TypeError(f"debug_options must be ortmod.DebugOptions, got {type(debug_options).__name__}")
        super().__init__()
        debug_options = dataclasses.replace(
            debug_options, log_level=log_level_from_env(debug_options.log_level))
        self._debug_options = debug_options
        configure(debug_options.log_level)
        self._original_module = module
        self._ortmod_policy = options.fallback_policy
        self._ortmod_fallback = None          # why the module runs in PyTorch, once it does
        self._ortmod_export_count = 0
        self._ortmod_engine_count = 0
        self._ortmod_reset()
        self.training = module.training
        # When an ORTModule sits inside another module, the parent's load_state_dict
        # walks into _original_module; let keys without that prefix load there.
        self._register_load_state_dict_pre_hook(_add_inner_prefix)
        self._C = None
        self.__dict__["_ortmod_ready"] = True
        self._ortmod_load_engine_library()
        if "FALLBACK_FORCE_TORCH_FORWARD" in self._ortmod_policy:
            self._ortmod_fall_back("FALLBACK_FORCE_TORCH_FORWARD", None)
        _watch(self)

    def _ortmod_load_engine_library(self):
        if self.__dict__.get("_ortmod_fallback") is not None:
            return
        try:
            self.__dict__["_C"] = _load_C()
        except ImportError as e:
            if "FALLBACK_BAD_INITIALIZATION" not in self._ortmod_policy:
                raise
            self._ortmod_fall_back("FALLBACK_BAD_INITIALIZATION", e)

    def _ortmod_reset(self):
        """Drop every export and engine (they are rebuilt lazily on the next call)."""
        d = self.__dict__
        d["_ortmod_exports"] = collections.OrderedDict()   # export key -> _ExportRecord, oldest first
        d["_ortmod_cache"] = collections.OrderedDict()     # full key -> _Entry, least recently used first
        d["_ortmod_retired"] = collections.OrderedDict()   # entries waiting for a re-check after a change
        d["_ortmod_variants"] = collections.OrderedDict()  # export key without its non-tensor values ->
        #                                                  [exports of it, the last export key]
        d["_ortmod_state"] = None     # StateInfo
        d["_ortmod_fast"] = None      # _Fast: the last call's key, for the next call
        d["_ortmod_signatures"] = {}  # state signature -> small int (cheap to hash per call)
        d["_ortmod_generation"] = 0
        d["_ortmod_dirty"] = False

    @property
    def module(self):
        """The wrapped (original) module."""
        return self._modules["_original_module"]

    # -- the call ------------------------------------------------------------

    def __call__(self, *args, **kwargs):
        # nn.Module.__call__ (_wrapped_call_impl, then _call_impl) in one frame where it would only
        # call forward: no compiled call, no tracing, no hook of this module or global ones, no
        # forward replaced on the instance; anything else goes through torch's own.
        d = self.__dict__
        if (self._compiled_call_impl is None and not (
                d["_forward_pre_hooks"] or d["_forward_hooks"] or d["_backward_pre_hooks"] or d["_backward_hooks"]
                or _nn_module._global_forward_pre_hooks or _nn_module._global_forward_hooks
                or _nn_module._global_backward_pre_hooks or _nn_module._global_backward_hooks)
                and not _tracing_state() and "forward" not in d):
            return self._ortmod_forward(args, kwargs)
        return torch.nn.Module.__call__(self, *args, **kwargs)

    forward = _ForwardDescriptor()

    # -- what libraries that introspect a model read ---------------------------
    #
    # Trainers and launchers decide what to do with a model by looking at it: the HF Trainer keeps
    # the dataset columns that inspect.signature(model.forward) names and saves with
    # save_pretrained when isinstance(model, PreTrainedModel); Accelerate and DeepSpeed read
    # attributes of the user's model (config, _keys_to_ignore_on_save, ...). ORTModule answers as
    # the wrapped model does, the way a transparent proxy does (wrapt's ObjectProxy): its forward's
    # signature is the wrapped forward's, ``__class__`` is the wrapped model's class (so isinstance
    # holds for both ORTModule and that class; type() stays ORTModule), attributes it does not
    # have are the wrapped model's (__getattr__ below). What it computes stays its own.

    @property
    def __class__(self):
        return type(self.__dict__["_modules"]["_original_module"]) if "_modules" in self.__dict__ \
            and "_original_module" in self.__dict__["_modules"] else type(self)

    @__class__.setter
    def __class__(self, cls):
        # A library that swaps a module's class for a subclass it builds from ``module.__class__``
        # (FSDP2's fully_shard, torch.nn.utils.parametrize) built it from the wrapped model's
        # class: the object would stop being an ORTModule. A subclass of ORTModule is taken.
        if isinstance(cls, type) and issubclass(cls, ORTModule):
            object.__dict__["__class__"].__set__(self, cls)
            return
        name = getattr(cls, "__name__", repr(cls))
        if any(getattr(b, "__module__", "").startswith("torch.distributed.fsdp") for b in getattr(cls, "__mro__", ())):
            raise TypeError(f"{_FSDP2_REVERSE_REFUSAL} (the ORTModule would become a {name})")
        raise TypeError(f"ortmod: an ORTModule's class cannot become {name}: a library is swapping it for a "
                        "subclass of the wrapped model's class. Apply it to the model inside ORTModule "
                        "(ORTModule(...(model)))")

    def _get_name(self):
        return "ORTModule"       # repr: nn.Module's reads self.__class__.__name__

    def __reduce_ex__(self, protocol):
        # pickle checks that the class it rebuilds is obj.__class__: ORTModule's is the wrapped
        # model's, so it is rebuilt from its own type here (state: __getstate__/__setstate__)
        return (_new_ortmodule, (), self.__getstate__())

    def _ortmod_forward(self, args, kwargs):
        d = self.__dict__
        fast = d["_ortmod_fast"]
        if fast is None and d["_ortmod_fallback"] is not None:
            return self._original_module(*args, **kwargs)
        try:
            retried = False
            if fast is not None:
                # the steady state: the last call's key again (see _Fast)
                tensors = fast.inputs(d, args, kwargs)
                if tensors is not _MISS:
                    # (the record is never made under ZeRO-3: no parameters to gather)
                    outputs = self._ortmod_execute(fast.entry, tensors, fast.state)
                    result = self._ortmod_finish(fast.entry, outputs, fast.state, fast.export_key, False)
                    if result is not _AGAIN_CHECKED:
                        return result
                    retried = True      # a value guard broke: exported again, and it must hold now
            return self._ortmod_run(args, kwargs, retried)
        except Exception as e:
            category = self._ortmod_category(e)
            if category is None or category not in self._ortmod_policy:
                raise
            self._ortmod_fall_back(category, e)
        return self._original_module(*args, **kwargs)

    def _ortmod_run(self, args, kwargs, retried):
        """The keyed call, as a loop: state -> key -> plan (export, engine) -> run -> guards, again
        from the state while an attempt finds that its export does not hold for the call (each
        such attempt dropped that export). ``retried``: an export made for this very call already
        failed a check (a value guard, torch.export's shape guard): the same failure again is an
        error, not another export. What an attempt gathers (ZeRO-3, FSDP2) is released once the
        call is over, the last attempt's first, as the nested calls that this loop replaces did."""
        module = self._modules["_original_module"]
        with contextlib.ExitStack() as releases:
            for _ in range(MAX_EXPORTS_PER_CALL):
                state = self._ortmod_prepare(module, releases)
                result = self._ortmod_call(module, state, args, kwargs, retried)
                if result is _AGAIN_CHECKED:
                    retried = True
                elif result is not _AGAIN:
                    return result
        raise errors.UnsupportedModelError(
            f"ortmod exported {type(module).__name__} {MAX_EXPORTS_PER_CALL} times for one call and the export "
            "still does not hold for it (its sizes, layouts or frozen values change with every trace)")

    def _ortmod_prepare(self, module, releases):
        """The module's state for an attempt, scanned again where it changed; under ZeRO-3 and
        FSDP2 the parameters gathered for it, their release pushed onto ``releases``."""
        d = self.__dict__
        d["_ortmod_fast"] = None      # set again by a call that succeeds; kept while nothing else runs
        if d["_ortmod_dirty"]:
            self._ortmod_recheck()
        state = d["_ortmod_state"]
        if state is None or state.fsdp2 is None and (not state.still_valid() or (
                state.zero3 is None and state.params and hasattr(state.params[0], "ds_status"))):
            state = self._ortmod_scan_state(module)
        if state.fsdp2 is not None:
            # FSDP2 (ortmod/_fsdp2.py): unsharded for this call (and its backward), then checked
            fsdp2 = state.fsdp2
            releases.callback(fsdp2.release)
            if not fsdp2.gather() or not state.still_valid():
                state = self._ortmod_scan_state(module, fsdp2)
        elif state.zero3 is not None:
            # DeepSpeed ZeRO-3: the parameters are gathered for this call and released after it
            releases.callback(state.zero3.release, state.zero3.gather())
        return state

    def _ortmod_call(self, module, state, args, kwargs, retried):
        """One attempt: the call keyed, its engine found or built, its export's shape checks, the
        engine run and its result; _AGAIN or _AGAIN_CHECKED where the export was dropped."""
        d = self.__dict__
        key = CallKey(flatten.flatten_inputs(args, kwargs), module.training, state)
        cache = d["_ortmod_cache"]
        entry = cache.get(key.full)
        first_call = entry is None
        if first_call:
            entry = self._ortmod_build(key, state)
        else:
            cache.move_to_end(key.full)
        miss = entry.checks_shapes and entry.shape_miss(key.shaped())
        if miss:
            if miss == "dims":
                # the graph holds only for the sizes it was exported with there: export again,
                # with those dims dynamic from now on (an export that cannot has them static)
                learned = d.setdefault("_ortmod_dynamic_dims", {})
                learned[key.export] = learned.get(key.export, frozenset()) | entry.varied_dims(key.shaped())
            elif miss == "guard" and retried:
                # torch.export specialised a size (or related two) that this call does not match
                raise errors.UnsupportedModelError(
                    f"ortmod exported {type(module).__name__} again for this call's input sizes and the export "
                    f"still does not hold for them ({entry.shape_guard.describe()})")
            self._ortmod_forget(key.export)     # ("layout": a kernel eager picks by layout, another layout)
            return _AGAIN_CHECKED if miss == "guard" else _AGAIN
        tensors = entry.inputs(key.flat.leaves, state)
        outputs = self._ortmod_execute(entry, tensors, state)
        if first_call and logger.isEnabledFor(logging.INFO):
            # the plan exists now: say what the passes and the planner made of the model
            logger.info("compiled %s graph:\n%s", "training" if entry.needs_grad else "inference",
                        summarize(json.loads(entry.engine.report())))
        check = d.pop("_ortmod_check_shapes", None)
        if check is not None:
            _check_output_shapes(self._original_module, check, outputs)
        # a call that held its guards is the next call's fast record (not under ZeRO-3 or FSDP2)
        record = None if state.zero3 is not None or state.fsdp2 is not None else \
            (lambda: _Fast.make(module, state, entry, key, args, kwargs, self._C))
        return self._ortmod_finish(entry, outputs, state, key.export, retried, record)

    def _ortmod_finish(self, entry, outputs, state, export_key, retried, record=None):
        """The call's result from the engine's outputs: the guards checked (a broken one drops
        the export: _AGAIN_CHECKED), the state updates copied into the module's buffers, the
        user's structure rebuilt; ``record`` (the keyed path's) makes the fast record once the
        guards held."""
        if entry.guards:
            broken = next((g for g in entry.guards if not g.holds(outputs[g.output_index])), None)
            if broken is not None:
                self._ortmod_guard_broken(broken, outputs, export_key, retried)
                return _AGAIN_CHECKED
        if entry.state_updates:
            entry.update_state(outputs, state)
        if record is not None:
            self.__dict__["_ortmod_fast"] = record()
        return entry.rebuild(outputs)

    def _ortmod_execute(self, entry, tensors, state):
        """Runs the engine on the call's graph inputs; returns its outputs as torch tensors."""
        d = self.__dict__
        threads = _torch_threads()
        if threads != d.get("_ortmod_threads"):   # torch, BLAS and the engine use one count
            self._C.set_num_threads(threads)
            d["_ortmod_threads"] = threads
        if entry.needs_grad:
            return run_training(entry.call, tensors, state.zero3 or state.fsdp2)
        return run_inference(entry.call, tensors)

    def _ortmod_forget(self, export_key):
        """Drop an export and the engines built from it (the next call exports again)."""
        d = self.__dict__
        d["_ortmod_exports"].pop(export_key, None)
        for cache in (d["_ortmod_cache"], d["_ortmod_retired"]):
            for k in [k for k in cache if k[0] == export_key]:
                del cache[k]

    def _ortmod_guard_broken(self, guard, outputs, export_key, retried):
        """A value the trace froze differs in this call: the graph is stale for it. The call's
        outputs are dropped (state updates included) and the export with them."""
        now = outputs[guard.output_index].tolist()
        if retried:
            raise errors.UnsupportedModelError(
                f"the value frozen at {guard.where} ({guard.kind}) differs between the trace and the engine on "
                f"the same call ({guard.value!r} traced, {now!r} computed): ortmod cannot capture it (is it "
                "random, or computed from state the forward changes?); compute it with tensor ops")
        d = self.__dict__
        seen = d.setdefault("_ortmod_guard_warned", set())
        if guard.where not in seen:
            seen.add(guard.where)
            warnings.warn(f"ortmod: the value frozen at {guard.where} ({guard.kind}) was {guard.value!r} when "
                          f"{type(self._original_module).__name__} was exported and is {now!r} in this call: "
                          "exporting again (every change of it costs an export; compute it with tensor ops to "
                          "avoid that)", errors.TraceHazardWarning, stacklevel=_user_stacklevel())
        self._ortmod_forget(export_key)

    def _ortmod_scan_state(self, module, fsdp2=None):
        """Parameters and buffers; under FSDP2 the unsharded ones (fsdp2: gathered now, if any)."""
        d = self.__dict__
        d["_ortmod_generation"] += 1
        sharded = _fsdp2.sharded_modules(module)
        if sharded and (fsdp2 is None or [m for _, m in sharded] != fsdp2.modules):
            fsdp2 = _fsdp2.Fsdp2(sharded)       # refuses what it does not support, by name
            fsdp2.gather()
        state = flatten.StateInfo(module, d["_ortmod_generation"])
        if sharded:
            state.fsdp2 = fsdp2
        else:
            _fsdp2.refuse_dtensors(state.params)  # (fully_shard applied after the state's scan: caught here)
        zero3 = _zero3.partitioned_params(state.params)
        if zero3:
            state.zero3 = _zero3.Zero3(zero3)
        ids = d["_ortmod_signatures"]
        state.signature_id = ids.setdefault(state.signature, len(ids))
        d["_ortmod_state"] = state
        return state

    def _ortmod_recheck(self):
        """After a structural change: every export is re-done before its engines are reused."""
        d = self.__dict__
        d["_ortmod_retired"].update(d["_ortmod_cache"])
        d["_ortmod_cache"] = collections.OrderedDict()
        _trim(d["_ortmod_retired"], self._debug_options.max_cached_graphs)
        for record in d["_ortmod_exports"].values():
            record.stale = True
        d["_ortmod_state"] = None
        d["_ortmod_dirty"] = False
        _watch(self)

    def _ortmod_build(self, key, state):
        """The engine for a call whose full key the cache lacks: from its export, which is made
        (again) where there is none or it went stale."""
        module, flat, export_key = self._original_module, key.flat, key.export
        d = self.__dict__
        record = d["_ortmod_exports"].get(export_key)
        if record is None or record.stale:
            flatten.check_inputs(module, flat)
            flatten.check_state(module)
            flatten.check_one_device(module, flat)
            exported = self._ortmod_export(key)
            d["_ortmod_check_shapes"] = exported.eager_shapes   # this call's first engine run
            if record is not None and record.exported.onnx_bytes == exported.onnx_bytes:
                record.exported = exported
                record.stale = False
                # the graph did not change: engines built from it stay valid
                for k in [k for k in d["_ortmod_retired"] if k[0] == export_key]:
                    entry = d["_ortmod_retired"].pop(k)
                    entry.relink(exported)
                    d["_ortmod_cache"][k] = entry
            else:
                for k in [k for k in d["_ortmod_retired"] if k[0] == export_key]:
                    del d["_ortmod_retired"][k]
                record = _ExportRecord(exported)
                d["_ortmod_exports"][export_key] = record
                self._ortmod_note_export(key)
            # the export ran the module's forward: registrations it made are part of it
            d["_ortmod_dirty"] = False
            _watch(self)
            entry = d["_ortmod_cache"].get(key.full)
            if entry is not None:
                return entry
        entry = self._ortmod_engine(record.exported, flat, state, key.want_grad)
        d["_ortmod_cache"][key.full] = entry
        self._ortmod_trim()
        return entry

    def _ortmod_trim(self):
        """Keeps the max_cached_graphs most recently used engines, and the exports that they or
        the retired entries were built from (others only while there is room)."""
        d = self.__dict__
        limit = self._debug_options.max_cached_graphs
        cache, exports = d["_ortmod_cache"], d["_ortmod_exports"]
        _trim(cache, limit)
        if len(exports) > limit:
            used = {k[0] for k in cache} | {k[0] for k in d["_ortmod_retired"]}
            for k in [k for k in exports if k not in used][:len(exports) - limit]:
                del exports[k]
            while len(exports) > limit:          # every one in use: the oldest goes with its engines
                self._ortmod_forget(next(iter(exports)))

    def _ortmod_note_export(self, key):
        """Counts exports that differ from an earlier one only in non-tensor argument values;
        past a few, one warning names the argument (every new value costs an export and an
        engine, and the cache keeps only the most recent ones)."""
        d, flat, export_key = self.__dict__, key.flat, key.export
        (structure, leaves), rest = export_key[0], export_key[1:]
        masked = ((structure, tuple(("C",) if leaf[0] == "C" else leaf for leaf in leaves)),) + rest
        variants = d["_ortmod_variants"]
        seen = variants.pop(masked, None) or [0, None]
        variants[masked] = seen
        _trim(variants, 64)
        seen[0] += 1
        last, seen[1] = seen[1], export_key
        limit = self._debug_options.max_cached_graphs
        if d.get("_ortmod_reexport_warned") or last is None or seen[0] < min(REEXPORT_WARNING_AFTER, limit + 1):
            return
        d["_ortmod_reexport_warned"] = True
        module = self._original_module
        changed = [i for i, (a, b) in enumerate(zip(last[0][1], leaves)) if a != b]
        what = ", ".join(f"{flatten.describe_input(module, flat.paths[i])} = {_short_repr(flat.leaves[i])}"
                         for i in changed) or "a non-tensor argument"
        warnings.warn(
            f"ortmod: {type(module).__name__} was exported {seen[0]} times for calls that differ only in "
            f"non-tensor arguments ({what} in this call): a non-tensor argument is baked into the graph, so "
            f"every new value costs an export and an engine. The newest {limit} are kept "
            "(DebugOptions(max_cached_graphs=...) or ORTMOD_MAX_CACHED_GRAPHS); pass the value as a tensor, "
            "or keep it fixed, to export once", UserWarning, stacklevel=_user_stacklevel())

    def _ortmod_export(self, key):
        module, flat = self._original_module, key.flat
        mode = "training" if module.training else "inference"
        logger.info("exporting %s for %s (%s, grad %s); export #%d", type(module).__name__, mode,
                    ", ".join(f"{flatten.dtype_name(flat.leaves[i].dtype)}[rank {flat.leaves[i].dim()}]"
                              for i in flat.tensor_indices()) or "no tensor inputs",
                    "enabled" if torch.is_grad_enabled() else "disabled", self._ortmod_export_count + 1)
        strict = self._debug_options.strict_trace
        inline = self._debug_options.inline_autograd_functions
        dynamic = self.__dict__.get("_ortmod_dynamic_dims", {}).get(key.export)
        state = self.__dict__["_ortmod_state"]
        # (torch's and the ONNX libraries' logs and warnings: at LogLevel.VERBOSE only, _quiet.py)
        with _quiet.quiet_capture(type(module).__name__), flatten.collector_paused(), _zero3.plain_linear(), \
                (state.zero3.hooks_off(module) if state is not None and state.zero3 is not None
                 else state.fsdp2.hooks_off(module) if state is not None and state.fsdp2 is not None
                 else contextlib.nullcontext()):
            exported = self._ortmod_capture(module, flat, strict, inline, dynamic)
        warned = self.__dict__.setdefault("_ortmod_hazards_warned", set())
        new = [h for h in exported.hazards if h.split(" (", 1)[0] not in warned]
        if new:
            warned.update(h.split(" (", 1)[0] for h in new)
            warnings.warn(
                f"ortmod: the trace of {type(module).__name__} froze values that Python computed from tensors: "
                + "; ".join(new) + ". ortmod checks them after every call and exports again when one changes"
                + ("; the graph holds only for the traced input shapes" if exported.shape_specialized else "")
                + " (DebugOptions(strict_trace=True) or ORTMOD_STRICT_TRACE=1 makes this an error)",
                errors.TraceHazardWarning, stacklevel=_user_stacklevel())
        self._ortmod_export_count += 1
        if self._debug_options.save_onnx:
            self._save(f"torch_exported_{mode}", exported.onnx_bytes)
        return exported

    def _ortmod_capture(self, module, flat, strict, inline, dynamic=None):
        """Export with the capture path the options pick (see DebugOptions.capture)."""
        def by_export():
            from .capture import export as torch_export     # here: the TorchScript path does not need it
            return torch_export.export(module, flat, strict_trace=strict, inline_functions=inline,
                                          dynamic=dynamic)

        def by_torchscript():
            return torchscript.export(module, flat, strict_trace=strict, inline_functions=inline, dynamic=dynamic)

        path = self._debug_options.capture
        if path == "export":
            return by_export()
        if path == "torchscript" or self.__dict__.get("_ortmod_capture_path") == "torchscript":
            return by_torchscript()
        try:     # "auto": torch.export, and the TorchScript exporter where that cannot capture
            return by_export()
        except (ImportError, errors.ExportError, errors.UnsupportedModelError) as e:
            first = e
        # outside the except block: the TorchScript attempt's errors must not carry the first one
        # as their __context__ (its export reads a refusal from the context chain, and would
        # report torch.export's refusal as its own). A refusal the TorchScript path shares,
        # strict_trace's or a parameter changed in place, comes back from it too: the first error
        # is raised, with the second noted.
        try:
            exported = by_torchscript()
        except Exception as e:
            first.add_note(f"ortmod also tried the TorchScript capture path: {type(e).__name__}: {e}")
            raise first
        logger.info("the torch.export path could not capture %s (%s); captured it with the TorchScript "
                    "exporter instead", type(module).__name__, str(first).split("\n", 1)[0][:200])
        if isinstance(first, ImportError) or isinstance(first.__cause__, ImportError):
            self.__dict__["_ortmod_capture_path"] = "torchscript"   # it will not come back in this process
        return exported

    def _ortmod_engine(self, exported, flat, state, want_grad):
        module = self._original_module
        mode = "training" if module.training else "inference"
        opts = self._debug_options
        names = list(exported.graph_inputs)
        grad_inputs = []
        for name in names:
            gi = exported.graph_inputs[name]
            t = flat.leaves[gi.leaf_index] if gi.kind == "input" else state.by_name[gi.state_name]
            grad_inputs.append(bool(want_grad and t.requires_grad and t.is_floating_point()))
        runner = pyop.FunctionRunner(exported.functions) if exported.functions else None
        engine = self._C.Engine(exported.onnx_bytes, grad_inputs, log_level=int(opts.log_level),
                                seed=torch.initial_seed() & 0x7FFFFFFFFFFFFFFF,
                                log=engine_log_callback, callback=runner, max_plans=opts.max_cached_plans)
        self._ortmod_engine_count += 1
        if list(engine.input_names) != names:
            raise RuntimeError(f"ortmod: engine inputs {list(engine.input_names)} differ from the "
                               f"exported graph's inputs {names}")
        n_outputs = len(exported.output_tensor_positions) + len(exported.guards) + len(exported.state_updates)
        if len(engine.output_names) != n_outputs:
            raise RuntimeError(f"ortmod: engine has {len(engine.output_names)} outputs, the exported "
                               f"graph {n_outputs}")
        if opts.save_onnx:
            for stage, label in (("optimized", "optimized"), ("execution", "execution_model")):
                try:
                    data = engine.export_onnx(stage)
                except self._C.EngineError as e:
                    logger.warning("could not export the %s graph: %s", stage, e)
                    continue
                self._save(f"{label}_{mode}", data)
        logger.info("compiled %s: %d graph inputs (%d with grad), %d outputs", mode, len(names),
                    sum(grad_inputs), len(engine.output_names))
        return _Entry(engine, exported, any(grad_inputs), runner)

    def _save(self, stem, data):
        opts = self._debug_options
        directory = opts.save_path or "."
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"{opts.onnx_prefix}_{stem}.onnx")
        with open(path, "wb") as f:
            f.write(data)
        logger.info("wrote %s", path)

    # -- fallback ------------------------------------------------------------

    def _ortmod_category(self, exc):
        category = getattr(exc, "fallback_category", None)
        if category is not None:
            return category
        C = self.__dict__.get("_C")
        if C is not None and isinstance(exc, C.EngineError):     # UnsupportedOpError included
            return "FALLBACK_UNSUPPORTED_ONNX_MODEL"
        return None

    def _ortmod_fall_back(self, category, exc):
        name = type(self._original_module).__name__
        if exc is None:
            why = "ORTMODULE_FALLBACK_POLICY forces it"
        else:
            why = f"{type(exc).__name__}: {exc}"
        self.__dict__["_ortmod_fallback"] = why
        self._ortmod_reset()
        warnings.warn(f"ortmod: {name} runs in PyTorch, not on the ortmod engine, from now on "
                      f"({category} in ORTMODULE_FALLBACK_POLICY). Cause: {why}",
                      UserWarning, stacklevel=4)

    # -- the wrapped module shows through ------------------------------------

    def train(self, mode=True):
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        self.training = mode
        self._original_module.train(mode)
        return self

    def _apply(self, fn, recurse=True):
        # .to(dtype), .double(), .cpu(), ...: convert the wrapped module's tensors
        self._original_module._apply(fn, recurse)
        self.__dict__["_ortmod_state"] = None      # dtypes/devices may have changed
        return self

    def apply(self, fn):
        self._original_module.apply(fn)
        return self

    def modules(self):
        return self._original_module.modules()

    def named_modules(self, memo=None, prefix="", remove_duplicate=True):
        return self._original_module.named_modules(memo=memo, prefix=prefix,
                                                   remove_duplicate=remove_duplicate)

    def children(self):
        return self._original_module.children()

    def named_children(self):
        return self._original_module.named_children()

    def _replicate_for_data_parallel(self):
        raise TypeError("ortmod: nn.DataParallel around ORTModule is not supported; use "
                        "torch.nn.parallel.DistributedDataParallel(ORTModule(model)) instead.")

    def state_dict(self, *args, **kwargs):
        return self._original_module.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict, strict=True, assign=False):
        return self._original_module.load_state_dict(state_dict, strict=strict, assign=assign)

    def named_parameters(self, prefix="", recurse=True, remove_duplicate=True):
        return self._original_module.named_parameters(prefix=prefix, recurse=recurse,
                                                      remove_duplicate=remove_duplicate)

    def parameters(self, recurse=True):
        return self._original_module.parameters(recurse=recurse)

    def named_buffers(self, prefix="", recurse=True, remove_duplicate=True):
        return self._original_module.named_buffers(prefix=prefix, recurse=recurse,
                                                   remove_duplicate=remove_duplicate)

    def buffers(self, recurse=True):
        return self._original_module.buffers(recurse=recurse)

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            modules = self.__dict__.get("_modules", {})
            if "_original_module" in modules:
                return getattr(modules["_original_module"], name)
            raise

    def _ortmod_owns(self, name):
        d = self.__dict__
        return (not d.get("_ortmod_ready") or name in d or name.startswith("_ortmod")
                or hasattr(type(self), name) or name in d.get("_modules", ())
                or name.startswith("ds_") or name in _HOOK_BOOKKEEPING)

    def __setattr__(self, name, value):
        if self._ortmod_owns(name):
            super().__setattr__(name, value)
            if name == "training" and self.__dict__.get("_ortmod_ready"):
                self._original_module.training = value
            return
        # an attribute of the wrapped model (as ORT does): set it there and re-check the
        # export on the next call, since forward may branch on it
        setattr(self._original_module, name, value)
        self.__dict__["_ortmod_dirty"] = True

    def __delattr__(self, name):
        if self._ortmod_owns(name):
            return super().__delattr__(name)
        delattr(self._original_module, name)
        self.__dict__["_ortmod_dirty"] = True

    def __getstate__(self):
        # Engines are not picklable: pickle and deepcopy carry the module, not the cache.
        state = dict(self.__dict__)
        for k in ("_ortmod_exports", "_ortmod_cache", "_ortmod_retired", "_ortmod_variants"):
            state[k] = collections.OrderedDict()
        for k in ("_ortmod_signatures", "_ortmod_dynamic_dims"):
            state[k] = {}
        state["_ortmod_state"] = None
        state["_ortmod_fast"] = None
        state["_ortmod_generation"] = 0
        state["_ortmod_dirty"] = False
        state["_C"] = None
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self.__dict__.setdefault("_ortmod_fast", None)
        self._ortmod_load_engine_library()
        _watch(self)


def _check_output_shapes(module, eager_shapes, outputs):
    """The first run of a new export, on the call it was traced from, must return eager's
    output shapes: where torch's exporter mis-converts an op (an adaptive pool of an unbatched
    input exported with static sizes), the graph is refused rather than trained."""
    for j, (want, got) in enumerate(zip(eager_shapes, outputs)):
        if tuple(got.shape) != want:
            raise errors.UnsupportedModelError(
                f"the export of {type(module).__name__} computes output {j} with shape {tuple(got.shape)} "
                f"where eager gives {want}: torch's ONNX exporter mis-converted an op of this model")


# Attributes that DeepSpeed ZeRO-3's module hooks set on the module they hook (the ORTModule
# itself) on every call: their own bookkeeping, kept on the ORTModule. Forwarded to the wrapped
# model like its own attributes, each would mark the export dirty and re-export every step.
_HOOK_BOOKKEEPING = frozenset({"applied_pre_backward_ref_cnt", "pre_bwd_fn", "post_bwd_fn"})


REEXPORT_WARNING_AFTER = 8    # exports of one schema differing only in non-tensor values
# exports one call may run before it is refused: a call exports again where a size, a layout or a
# frozen value of the last export does not hold for it (each at most once or twice in practice);
# past this the traces themselves do not agree with each other
MAX_EXPORTS_PER_CALL = 8
# _ortmod_call's outcomes when the export did not hold for the call and was dropped: export again
# (_AGAIN_CHECKED: the export failed a check that the next one, made from this call, must pass)
_AGAIN = object()
_AGAIN_CHECKED = object()


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _user_stacklevel():
    """warnings.warn's stacklevel of the first frame outside ortmod and torch.nn's call
    machinery, for the function that calls this: the user's line, however deep the call went."""
    frame, level = sys._getframe(1), 1
    while frame is not None and (frame.f_code.co_filename.startswith(_PACKAGE_DIR)
                                 or frame.f_code.co_filename.endswith(os.path.join("nn", "modules", "module.py"))):
        frame, level = frame.f_back, level + 1
    return level


def _trim(ordered, limit):
    """Drops the oldest items of an OrderedDict past limit."""
    while len(ordered) > limit:
        ordered.popitem(last=False)


def _short_repr(value):
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _add_inner_prefix(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                      error_msgs):
    inner = prefix + "_original_module."
    for key in [k for k in state_dict if k.startswith(prefix) and not k.startswith(inner)]:
        state_dict[inner + key[len(prefix):]] = state_dict.pop(key)
    metadata = getattr(state_dict, "_metadata", None)
    if metadata is not None:
        for key in [k for k in metadata if k.startswith(prefix) and not k.startswith(inner.rstrip("."))]:
            rest = key[len(prefix):]
            metadata[inner.rstrip(".") + ("." + rest if rest else "")] = metadata[key]
