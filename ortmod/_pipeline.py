"""ORTModule's calls (the ``CallPipeline`` part of ORTModule, ortmod/_module.py): the steady
state, then the keyed call as a loop -- state -> key -> plan (export, engine) -> run -> guards,
again while an attempt finds that its export does not hold for the call -- and the caches it keeps.

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

Per call only the inputs are flattened and keyed (ortmod/_entry.py: CallKey); the
parameter/buffer scan is kept between calls and re-verified cheaply (dtype and requires_grad per
tensor). Structural changes -- a parameter, buffer or submodule registered anywhere inside the
wrapped module, or an attribute set on the ORTModule -- mark the module *dirty*: the next call
exports again and keeps its engines only if the new ONNX bytes are identical.
"""
import contextlib
import collections
import json
import logging
import os
import sys
import warnings
import weakref

import torch

from .capture import flatten, errors, torchscript, python_op as pyop
from . import _fsdp2, _quiet, _threads, _zero3
from ._entry import MISS, CallKey, Entry, ExportRecord, FastRecord
from ._function import run_inference, run_training
from ._logging import engine_log_callback, logger
from ._report import summarize

_torch_threads = torch.get_num_threads


# --------------------------------------------------------------------------- change tracking
#
# torch calls global registration hooks whenever any module gets a parameter, buffer or
# submodule assigned (ortmod/_module.py registers them). Modules inside a wrapped model map to the
# ORTModules that wrap them; a registration there marks those ORTModules dirty.

WATCHERS = weakref.WeakKeyDictionary()     # submodule -> WeakSet of ORTModules


def mark_dirty(parent):
    try:
        watchers = WATCHERS.get(parent)
    except TypeError:                       # an unhashable/unweakrefable module
        return
    if watchers:
        for m in list(watchers):
            m.__dict__["_ortmod_dirty"] = True


def watch(ortmodule):
    for m in ortmodule.__dict__["_modules"]["_original_module"].modules():
        try:
            WATCHERS.setdefault(m, weakref.WeakSet()).add(ortmodule)
        except TypeError:
            pass


def load_C():
    try:
        from . import _C
    except ImportError as e:
        raise ImportError(
            "ortmod's C extension (ortmod._C) is not built or failed to load: "
            f"{e}. Build it with `make setup` (or `pip install .`).") from e
    _threads.share_torch_threads(_C)
    return _C


class CallPipeline:
    """ORTModule's calls and caches (mixed into ORTModule, whose ``__dict__`` holds the caches:
    ``_ortmod_cache``, ``_ortmod_exports``, ... set by ``_ortmod_reset``)."""

    def _ortmod_load_engine_library(self):
        if self.__dict__.get("_ortmod_fallback") is not None:
            return
        try:
            self.__dict__["_C"] = load_C()
        except ImportError as e:
            if "FALLBACK_BAD_INITIALIZATION" not in self._ortmod_policy:
                raise
            self._ortmod_fall_back("FALLBACK_BAD_INITIALIZATION", e)

    def _ortmod_reset(self):
        """Drop every export and engine (they are rebuilt lazily on the next call)."""
        d = self.__dict__
        d["_ortmod_exports"] = collections.OrderedDict()   # export key -> ExportRecord, oldest first
        d["_ortmod_cache"] = collections.OrderedDict()     # full key -> Entry, least recently used first
        d["_ortmod_retired"] = collections.OrderedDict()   # entries waiting for a re-check after a change
        d["_ortmod_variants"] = collections.OrderedDict()  # export key without its non-tensor values ->
        #                                                  [exports of it, the last export key]
        d["_ortmod_state"] = None     # StateInfo
        d["_ortmod_fast"] = None      # FastRecord: the last call's key, for the next call
        d["_ortmod_signatures"] = {}  # state signature -> small int (cheap to hash per call)
        d["_ortmod_generation"] = 0
        d["_ortmod_dirty"] = False

    # -- the call ------------------------------------------------------------

    def _ortmod_forward(self, args, kwargs):
        d = self.__dict__
        fast = d["_ortmod_fast"]
        if fast is None and d["_ortmod_fallback"] is not None:
            return self._original_module(*args, **kwargs)
        try:
            retried = False
            if fast is not None:
                # the steady state: the last call's key again (see FastRecord)
                tensors = fast.inputs(d, args, kwargs)
                if tensors is not MISS:
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
            check_output_shapes(self._original_module, check, outputs)
        # a call that held its guards is the next call's fast record (not under ZeRO-3 or FSDP2)
        record = None if state.zero3 is not None or state.fsdp2 is not None else \
            (lambda: FastRecord.make(module, state, entry, key, args, kwargs, self._C))
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
        watch(self)

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
                record = ExportRecord(exported)
                d["_ortmod_exports"][export_key] = record
                self._ortmod_note_export(key)
            # the export ran the module's forward: registrations it made are part of it
            d["_ortmod_dirty"] = False
            watch(self)
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
        return Entry(engine, exported, any(grad_inputs), runner)

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

    # -- pickle and deepcopy --------------------------------------------------

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
        watch(self)


def check_output_shapes(module, eager_shapes, outputs):
    """The first run of a new export, on the call it was traced from, must return eager's
    output shapes: where torch's exporter mis-converts an op (an adaptive pool of an unbatched
    input exported with static sizes), the graph is refused rather than trained."""
    for j, (want, got) in enumerate(zip(eager_shapes, outputs)):
        if tuple(got.shape) != want:
            raise errors.UnsupportedModelError(
                f"the export of {type(module).__name__} computes output {j} with shape {tuple(got.shape)} "
                f"where eager gives {want}: torch's ONNX exporter mis-converted an op of this model")


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
