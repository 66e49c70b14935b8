"""What ORTModule keeps per call schema (ortmod/_pipeline.py runs the calls):

* ``CallKey``: what selects a call's export and engine, computed once per keyed call;
* ``ExportRecord``: one export (the ONNX bytes and how its inputs/outputs map to the call);
* ``Entry``: one engine built from an export for one requires_grad pattern, with the checks
  that say whether the export holds for a call's shapes and layouts (``shape_miss``);
* ``FastRecord``: the last keyed call, re-checked item by item so that the next call with the
  same key skips flattening, keying and the cache lookup (the steady state).

The validity checks of a call, and where each lives:

1. the module's state (parameters' requires_grad, tensors' dtypes, ZeRO-3 partitioning): the
   keyed path asks ``StateInfo.still_valid`` (capture/flatten.py); the steady state asks the
   same of the binding's ``attrs_are`` loop (no Python frame per tensor), in FastRecord.inputs;
2. the call's key: the keyed path computes it whole (CallKey); the steady state compares each
   top-level argument's exact type and tensor key with the record's, in the binding's
   ``steady_inputs`` for CPU tensors (python/module.c) and in FastRecord's CUDA twin for others
   (they are made dense on the way, which the C loop does not do);
3. the export's shape checks (static dims, torch.export's shape guard, layouts): one method,
   ``Entry.shape_miss``, for both paths.
"""
import torch

from .capture import compat, flatten
from .capture.compat import pytree
from ._function import CompiledCall

MISS = object()        # FastRecord.inputs: the call is not the recorded one
_Tensor = torch.Tensor
_grad_enabled = compat.is_grad_enabled
_any_autocast = compat.is_any_autocast_enabled
_unwrap_if_dead = compat.unwrap_if_dead
# top-level argument types whose schema key is their capture.flatten.constant_key (each a pytree leaf,
# None included): a call that passes equal ones in the same places flattens alike
_FAST_CONSTANTS = frozenset({type(None), bool, int, float, str})


def autocast_key():
    """The autocast state the export traces (its Casts become the graph's): one graph per state,
    so a call outside autocast never runs a graph traced inside it, nor the other way round."""
    return tuple((dev, torch.get_autocast_dtype(dev)) for dev in ("cpu", "cuda") if torch.is_autocast_enabled(dev))


def dense(t):
    # The engine reads CUDA tensors in place and needs them dense (the binding copies strided
    # CPU tensors itself): a sliced CUDA batch (input_ids[:, :-1]) is laid out anew, the
    # layout copy being the only thing torch does with it.
    return t.contiguous() if t.is_cuda and not t.is_contiguous() else t


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
        self.export = (inputs_key, training, grad, state.signature_id, autocast_key())
        self.full = (self.export, input_grads, state.grads) if grad else (self.export,)

    def shaped(self):
        """The call's tensor leaves, in order (what an export's shape checks read)."""
        leaves = self.flat.leaves
        return [leaves[i] for i in self.flat.tensor_indices()]


class ExportRecord:
    __slots__ = ("exported", "stale")

    def __init__(self, exported):
        self.exported = exported
        self.stale = False


class Entry:
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
            tensors[pos] = dense(_unwrap_if_dead(leaves[leaf]))
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


class FastRecord:
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
        shape checks hold, else MISS."""
        state = self.state
        if (d["_ortmod_dirty"] or d["_ortmod_state"] is not state or len(args) != self.nargs
                or (tuple(kwargs) != self.kwnames if kwargs or self.kwnames else False)
                or self.module.training is not self.training or _grad_enabled() is not self.grad
                or (autocast_key() != self.autocast if _any_autocast() else self.autocast)
                # state.still_valid(), less its frame
                or not self.attrs_are(state.params, "requires_grad", state.grads)
                or not self.attrs_are(state.tensors, "dtype", state.dtypes)
                or (state.params and hasattr(state.params[0], "ds_status"))):
            return MISS
        values = args + tuple(kwargs.values()) if kwargs else args
        if self.dense:            # CUDA inputs: here, made dense as the keyed path does
            tensors = self._cuda_inputs(values)
        else:                     # the same checks and list, in the extension
            tensors = self.steady_inputs(values, self.types, self.tensor_keys, self.template, self.input_slots,
                                         _unwrap_if_dead)
        if tensors is None:
            return MISS
        for i, key in self.constants:
            if flatten.constant_key(values[i]) != key:
                return MISS
        entry = self.entry
        if entry.checks_shapes and entry.shape_miss([values[i] for i in self.tensor_positions]) is not None:
            return MISS
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
            tensors[pos] = dense(_unwrap_if_dead(values[i]))
        return tensors
