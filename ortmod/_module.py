"""ORTModule: wraps an nn.Module so that its forward and backward run on the ortmod engine."""
import dataclasses
import os

import torch
import torch.utils._pytree as pytree

from . import _capture
from ._function import CompiledCall, run_inference, run_training
from ._logging import LogLevel, configure, engine_log_callback, logger


@dataclasses.dataclass
class DebugOptions:
    """Debugging knobs.

    log_level:   LogLevel for the "ortmod" logger and the engine's log callback.
    save_onnx:   write the exported, optimized and execution graphs as ONNX files:
                 ``<save_path>/<onnx_prefix>_torch_exported_<training|inference>.onnx``,
                 ``..._optimized_<mode>.onnx`` and ``..._execution_model_<mode>.onnx``.
    """

    log_level: LogLevel = LogLevel.WARNING
    save_onnx: bool = False
    onnx_prefix: str = ""
    save_path: str = ""

    def __post_init__(self):
        self.log_level = LogLevel(int(self.log_level))


class _Entry:
    """One compiled schema: the engine, where its inputs come from, how to rebuild the output."""

    __slots__ = ("engine", "call", "graph_inputs", "needs_grad", "output_spec",
                 "output_leaves", "output_positions")

    def __init__(self, engine, graph_inputs, needs_grad, exported):
        self.engine = engine
        self.graph_inputs = graph_inputs
        self.needs_grad = needs_grad
        self.output_spec = exported.output_spec
        self.output_leaves = exported.output_leaves
        self.output_positions = exported.output_tensor_positions
        self.call = CompiledCall(engine, engine.output_differentiable, len(graph_inputs))

    def rebuild(self, outputs):
        leaves = list(self.output_leaves)
        for pos, t in zip(self.output_positions, outputs):
            leaves[pos] = t
        return pytree.tree_unflatten(leaves, self.output_spec)


def _load_C():
    try:
        from . import _C
    except ImportError as e:
        raise ImportError(
            "ortmod's C extension (ortmod._C) is not built or failed to load: "
            f"{e}. Build it with `make setup` (or `python setup.py build_ext --inplace`).") from e
    return _C


class ORTModule(torch.nn.Module):
    """``model = ORTModule(model)``: forward and backward of ``model`` run on the ortmod engine.

    The first call with a new schema (argument structure, dtypes, ranks, devices,
    requires_grad, constants, train/eval, grad mode) exports the module to ONNX and
    builds an engine for it; later calls with that schema reuse it, whatever the sizes.
    Parameters, buffers and state_dict keys are those of the wrapped module.
    """

    def __init__(self, module, debug_options=None):
        if not isinstance(module, torch.nn.Module):
            raise TypeError(f"ORTModule wraps a torch.nn.Module, got {type(module).__name__}")
        if debug_options is None:
            debug_options = DebugOptions()
        elif not isinstance(debug_options, DebugOptions):
            raise TypeError(f"debug_options must be ortmod.DebugOptions, got {type(debug_options).__name__}")
        super().__init__()
        self._C = _load_C()
        self._debug_options = debug_options
        configure(debug_options.log_level)
        self._original_module = module
        self._ortmod_cache = {}
        self._ortmod_export_count = 0
        self.training = module.training
        # When an ORTModule sits inside another module, the parent's load_state_dict
        # walks into _original_module; let keys without that prefix load there.
        self._register_load_state_dict_pre_hook(_add_inner_prefix)

    # -- the call ------------------------------------------------------------

    def forward(self, *args, **kwargs):
        module = self._original_module
        flat = _capture.flatten_inputs(args, kwargs)
        key = _capture.schema_key(module, flat)
        entry = self._ortmod_cache.get(key)
        if entry is None:
            entry = self._compile(flat)
            self._ortmod_cache[key] = entry
        tensors = [gi.resolve(flat.leaves) for gi in entry.graph_inputs]
        if entry.needs_grad:
            outputs = run_training(entry.call, tensors)
        else:
            outputs = run_inference(entry.engine, tensors)
        return entry.rebuild(outputs)

    def _compile(self, flat):
        module = self._original_module
        _capture.check_inputs(module, flat)
        _capture.check_state(module)
        training = module.training
        want_grad = training and torch.is_grad_enabled()
        mode = "training" if training else "inference"
        logger.info("exporting %s for %s (%s, grad %s); export #%d", type(module).__name__, mode,
                    ", ".join(f"{_capture.dtype_name(flat.leaves[i].dtype)}[rank {flat.leaves[i].dim()}]"
                              for i in flat.tensor_indices()) or "no tensor inputs",
                    "enabled" if torch.is_grad_enabled() else "disabled", self._ortmod_export_count + 1)
        exported = _capture.export(module, flat)
        self._ortmod_export_count += 1
        opts = self._debug_options
        if opts.save_onnx:
            self._save(f"torch_exported_{mode}", exported.onnx_bytes)

        names = list(exported.graph_inputs)
        grad_inputs = []
        for name in names:
            t = exported.graph_inputs[name].resolve(flat.leaves)
            grad_inputs.append(bool(want_grad and t.requires_grad and t.is_floating_point()))
        engine = self._C.Engine(exported.onnx_bytes, grad_inputs, log_level=int(opts.log_level),
                                seed=torch.initial_seed() & 0x7FFFFFFFFFFFFFFF,
                                log=engine_log_callback)
        if list(engine.input_names) != names:
            raise RuntimeError(f"ortmod: engine inputs {list(engine.input_names)} differ from the "
                               f"exported graph's inputs {names}")
        if len(engine.output_names) != len(exported.output_tensor_positions):
            raise RuntimeError(f"ortmod: engine has {len(engine.output_names)} outputs, the module "
                               f"returned {len(exported.output_tensor_positions)} tensors")
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
        return _Entry(engine, [exported.graph_inputs[n] for n in names], any(grad_inputs), exported)

    def _save(self, stem, data):
        opts = self._debug_options
        directory = opts.save_path or "."
        os.makedirs(directory, exist_ok=True)
        path = os.path.join(directory, f"{opts.onnx_prefix}_{stem}.onnx")
        with open(path, "wb") as f:
            f.write(data)
        logger.info("wrote %s", path)

    # -- the wrapped module shows through ------------------------------------

    def train(self, mode=True):
        if not isinstance(mode, bool):
            raise ValueError("training mode is expected to be boolean")
        self.training = mode
        self._original_module.train(mode)
        return self

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

    def __getstate__(self):
        state = super().__getstate__() if hasattr(super(), "__getstate__") else self.__dict__.copy()
        state = dict(state)
        state["_ortmod_cache"] = {}        # engines are rebuilt on the next call
        state.pop("_C", None)
        return state

    def __setstate__(self, state):
        super().__setstate__(state)
        self._C = _load_C()


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
