"""ORTModule: wraps an nn.Module so that its forward and backward run on the ortmod engine.

ORTModule is three parts: ``CallPipeline`` (ortmod/_pipeline.py: the calls, exports, engines and
their caches; ortmod/_entry.py: what is kept per export and engine), ``ModuleAPI``
(ortmod/_proxy.py: the nn.Module API, answered by the wrapped model) and, here, construction,
``__call__`` and the class identity that libraries read, with DebugOptions and the torch
registration hooks that mark an ORTModule dirty.
"""
import dataclasses

import torch

from .capture import compat
from . import _options
from ._logging import LogLevel, configure
from ._options import options
from ._pipeline import CallPipeline, mark_dirty, watch
from ._proxy import ForwardDescriptor, ModuleAPI, add_inner_prefix

_nn_module = torch.nn.modules.module
_tracing_state = compat.get_tracing_state


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
# submodule assigned: one inside a wrapped model marks the ORTModules that wrap it dirty
# (ortmod/_pipeline.py: mark_dirty). The module hook also refuses nn.DataParallel around an
# ORTModule, at construction, with a clear message.

def _on_module_registration(parent, name, value):
    if isinstance(value, ORTModule) and isinstance(parent, torch.nn.DataParallel):
        raise TypeError(
            "ortmod: nn.DataParallel around ORTModule is not supported (DataParallel replicates "
            "the module per device in one process, which the engine cannot follow). Use "
            "torch.nn.parallel.DistributedDataParallel(ORTModule(model)) with one process per "
            "device instead.")
    mark_dirty(parent)


def _on_tensor_registration(parent, name, value):
    mark_dirty(parent)


torch.nn.modules.module.register_module_module_registration_hook(_on_module_registration)
torch.nn.modules.module.register_module_parameter_registration_hook(_on_tensor_registration)
torch.nn.modules.module.register_module_buffer_registration_hook(_on_tensor_registration)


_FSDP2_REVERSE_REFUSAL = (
    "ortmod: fully_shard(ORTModule(model)) is not supported: FSDP2 would swap the ORTModule's class and gather "
    "its parameters around a call the engine runs as one graph. Shard the model, then wrap it: "
    "ORTModule(fully_shard(model)), with fully_shard applied to each block first (ortmod/_fsdp2.py)")


def _new_ortmodule():
    return ORTModule.__new__(ORTModule)


# --------------------------------------------------------------------------- ORTModule

class ORTModule(ModuleAPI, CallPipeline, torch.nn.Module):
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
        self._register_load_state_dict_pre_hook(add_inner_prefix)
        self._C = None
        self.__dict__["_ortmod_ready"] = True
        self._ortmod_load_engine_library()
        if "FALLBACK_FORCE_TORCH_FORWARD" in self._ortmod_policy:
            self._ortmod_fall_back("FALLBACK_FORCE_TORCH_FORWARD", None)
        watch(self)

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

    forward = ForwardDescriptor()

    # -- what libraries that introspect a model read (ortmod/_proxy.py) ------
    #
    # ``__class__`` is the wrapped model's class: isinstance holds for both ORTModule and that
    # class; type() stays ORTModule.

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
