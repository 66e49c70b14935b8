"""A call as the capture sees it, on both paths: its inputs, outputs and module state as flat
lists, the schema key that decides whether a call can reuse an export, the attributes a forward
changes, and ``Exported``, the record either driver hands to ORTModule.

A *schema* is everything that decides the exported graph: the structure of the arguments (a pytree
spec), per tensor its dtype, rank, device and requires_grad, the non-tensor values (baked into the
graph as constants), train/eval, whether grad is enabled, and the dtype/device/requires_grad of
every parameter and buffer. Sizes are not in the key: a new batch size reuses the graph and only
makes the engine re-plan."""
import contextlib
import copy
import dataclasses
import enum
import gc
import inspect
import operator
import types
import warnings

import torch

from . import compat
from .compat import pytree

from .errors import UnsupportedDataError, UnsupportedDeviceError, UnsupportedModelError
from .errors import TraceHazardWarning

# dtypes the engine can take; anything else (complex, quantized, float8, ...) is a
# TypeError at the call site rather than an obscure export or engine failure.
SUPPORTED_DTYPES = frozenset({
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
})
# CPU tensors run on the C kernels (float32/float64 math); CUDA tensors on the CUDA provider
# (ortmod/libortmod_cuda.so: float32, float16 and bfloat16 with fp32 accumulation, float64).
SUPPORTED_DEVICE_TYPES = frozenset({"cpu", "cuda"})


def dtype_name(dtype):
    return str(dtype).replace("torch.", "")


# ---------------------------------------------------------------------------
# flattening and naming


class FlatInputs:
    """The pytree leaves of a call's (args, kwargs), their structure key, and (lazily)
    their pytree spec and key paths.

    ``structure`` is what the schema key holds: the pytree spec, or — on the fast path,
    when every argument is a tensor — just the argument count and keyword names (the
    leaves are then ``args + kwargs.values()``, the order pytree gives), which is much
    cheaper to build and hash. The spec itself is only needed on a cache miss.
    """

    __slots__ = ("leaves", "structure", "_spec", "_tree", "_paths")

    def __init__(self, leaves, structure, spec, tree):
        self.leaves = leaves
        self.structure = structure
        self._spec = spec
        self._tree = tree
        self._paths = None

    @property
    def spec(self):
        if self._spec is None:
            self._spec = pytree.tree_flatten(self._tree)[1]
        return self._spec

    @property
    def paths(self):
        # key paths only matter for error messages: computed on a cache miss, not per step
        if self._paths is None:
            self._paths = [p for p, _ in compat.tree_flatten_with_path(self._tree)[0]]
        return self._paths

    def tensor_indices(self):
        return [i for i, v in enumerate(self.leaves) if isinstance(v, torch.Tensor)]


_Tensor = torch.Tensor


def flatten_inputs(args, kwargs):
    tree = (args, kwargs)
    leaves = list(args)
    if kwargs:
        leaves.extend(kwargs.values())
    for v in leaves:
        if type(v) is not _Tensor and not isinstance(v, _Tensor):
            leaves, spec = pytree.tree_flatten(tree)
            return FlatInputs(leaves, spec, spec, tree)
    return FlatInputs(leaves, ("tensors", len(args), tuple(kwargs)), None, tree)


def _forward_parameter_names(module):
    """Positional parameter names of ``module.forward`` (without self), and the *args name."""
    try:
        sig = inspect.signature(module.forward)
    except (TypeError, ValueError):
        return [], None
    names, varargs = [], None
    for p in sig.parameters.values():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD):
            names.append(p.name)
        elif p.kind == p.VAR_POSITIONAL:
            varargs = p.name
    return names, varargs


def describe_input(module, path):
    """Human name of the leaf at ``path``: "input 'x' (argument 0)", "input 'y' (keyword argument)",
    "input 'batch['ids']' (argument 0)" ..."""
    if not path:
        return "input"
    top, rest = path[0], path[1:]
    sub = pytree.keystr(rest[1:]) if len(rest) > 1 else ""
    if getattr(top, "idx", None) == 0 and rest:          # positional args
        pos = rest[0].idx
        names, varargs = _forward_parameter_names(module)
        if pos < len(names):
            name = names[pos]
        elif varargs:
            name = f"{varargs}[{pos - len(names)}]"
        else:
            name = f"args[{pos}]"
        return f"input '{name}{sub}' (argument {pos})"
    if rest:                                              # keyword args
        return f"input '{rest[0].key}{sub}' (keyword argument)"
    return "input"


def check_tensor(tensor, what):
    """Raise TypeError / ValueError naming ``what`` when the engine cannot take ``tensor``."""
    if tensor.dtype not in SUPPORTED_DTYPES:
        raise UnsupportedDataError(f"{what} has dtype {dtype_name(tensor.dtype)}, which ortmod does not "
                        f"support (supported: {', '.join(sorted(map(dtype_name, SUPPORTED_DTYPES)))})")
    if tensor.device.type not in SUPPORTED_DEVICE_TYPES:
        raise UnsupportedDeviceError(f"{what} is on device '{tensor.device}', which ortmod's engine does not "
                         f"support (supported: {', '.join(sorted(SUPPORTED_DEVICE_TYPES))})")
    if tensor.layout != torch.strided:
        raise UnsupportedDataError(f"{what} has layout {tensor.layout}; ortmod takes only dense (strided) tensors")
    if tensor.is_quantized or tensor.is_complex():
        raise UnsupportedDataError(f"{what} has dtype {dtype_name(tensor.dtype)}, which ortmod does not support")


def check_inputs(module, flat):
    for i in flat.tensor_indices():
        check_tensor(flat.leaves[i], describe_input(module, flat.paths[i]))


def check_state(module):
    for name, p in module.named_parameters(remove_duplicate=True):
        check_tensor(p, f"parameter '{name}'")
    for name, b in module.named_buffers(remove_duplicate=True):
        check_tensor(b, f"buffer '{name}'")


def check_one_device(module, flat):
    """Raise UnsupportedDeviceError when the call's tensors and the module's parameters and
    buffers are not all on one device: one engine call runs on one device (the CPU or one
    GPU), and torch would only fail later, inside the export, with a less telling message."""
    first = None
    named = [(describe_input(module, flat.paths[i]), flat.leaves[i]) for i in flat.tensor_indices()]
    named += [(f"parameter '{n}'", p) for n, p in module.named_parameters(remove_duplicate=True)]
    named += [(f"buffer '{n}'", b) for n, b in module.named_buffers(remove_duplicate=True)]
    for what, t in named:
        if first is None:
            first = (what, t.device)
        elif t.device != first[1]:
            raise UnsupportedDeviceError(
                f"{what} is on {t.device} but {first[0]} is on {first[1]}: ortmod runs a module's call on one "
                f"device, so move the module and every tensor argument to the same device (module.to(device), "
                f"x.to(device))")


def cuda_devices(module, flat):
    """Indices of the CUDA devices the call touches (for forking their RNG around tracing)."""
    tensors = [flat.leaves[i] for i in flat.tensor_indices()]
    tensors += list(module.parameters()) + list(module.buffers())
    return sorted({t.device.index for t in tensors if t.is_cuda and t.device.index is not None})


# ---------------------------------------------------------------------------
# schema key
#
# The key is split in two. The *export key* is everything that decides the exported
# ONNX graph; the *grad key* is which tensors require grad, which decides only the
# backward graph the engine builds from it. Changing requires_grad therefore builds a
# new engine from the cached ONNX bytes without exporting again.


def constant_key(value):
    if isinstance(value, float):
        return ("float", repr(value))     # 0.0 vs -0.0, nan == nan: repr tells them apart
    try:
        hash(value)
        return (type(value).__qualname__, value)
    except TypeError:
        return (type(value).__qualname__, repr(value))


def input_keys(flat):
    """(export part, grad part) of the call inputs' schema."""
    per_leaf = []
    grads = []
    for v in flat.leaves:
        if isinstance(v, torch.Tensor):
            per_leaf.append(("T", v.dtype, v.dim(), v.device))
            grads.append(v.requires_grad)
        else:
            if not isinstance(v, _CONSTANT_OUTPUT_TYPES) and _holds_tensor(v):
                # its tensors would be baked into the graph, and an object changed in place
                # between calls (a cache) would keep its key: refuse rather than go stale
                raise UnsupportedDataError(
                    f"an argument is a {type(v).__name__} holding tensors in its attributes; ortmod takes "
                    "tensors as arguments directly, or inside lists, tuples, dicts and dataclasses (a "
                    "transformers cache as an input, as in generation, is not supported)")
            per_leaf.append(("C",) + constant_key(v))
    return (flat.structure, tuple(per_leaf)), tuple(grads)


_requires_grad_of = operator.attrgetter("requires_grad")
_dtype_of = operator.attrgetter("dtype")


class StateInfo:
    """The module's parameters and buffers, scanned once and re-verified cheaply per call.

    ``signature`` (names, dtypes, devices, ties) is part of the export key; ``grads``
    (requires_grad per parameter) is part of the grad key. ``by_name`` maps every
    state_dict-style name (tied aliases included) to its tensor. Between scans the
    tensors are the same objects (replacing one goes through a module registration hook,
    which marks the ORTModule dirty), but their dtype and requires_grad may change in
    place (``module.to(dtype)``, ``p.requires_grad_()``): ``still_valid`` checks those.
    """

    __slots__ = ("params", "buffers", "tensors", "by_name", "signature", "signature_id", "grads", "dtypes",
                 "generation", "zero3", "fsdp2")

    def __init__(self, module, generation):
        named_p = list(module.named_parameters(remove_duplicate=False))
        named_b = list(module.named_buffers(remove_duplicate=False))
        self.by_name = dict(named_p)
        self.by_name.update(named_b)
        seen = {}
        sig = []
        self.params, self.buffers = [], []
        for kind, named, out in (("P", named_p, self.params), ("B", named_b, self.buffers)):
            for name, t in named:
                if id(t) in seen:            # a tie: part of the graph's structure
                    sig.append(("=", name, seen[id(t)]))
                    continue
                seen[id(t)] = name
                out.append(t)
                sig.append((kind, name, t.dtype, t.device))
        self.signature = tuple(sig)
        self.grads = tuple(p.requires_grad for p in self.params)
        self.tensors = self.params + self.buffers
        self.dtypes = tuple(t.dtype for t in self.tensors)
        self.generation = generation
        self.signature_id = None
        self.zero3 = None        # _zero3.Zero3 when the parameters are DeepSpeed ZeRO-3 partitions
        self.fsdp2 = None        # _fsdp2.Fsdp2 when fully_shard was applied (params: the unsharded ones)

    def still_valid(self):
        # map with attrgetter: no Python frame per tensor (this runs on every call)
        return (tuple(map(_requires_grad_of, self.params)) == self.grads
                and tuple(map(_dtype_of, self.tensors)) == self.dtypes)


# ---------------------------------------------------------------------------
# export


class _FlatWrapper(torch.nn.Module):
    """Takes only the tensor leaves, rebuilds the user's call, flattens the outputs.

    The user's module is registered as ``module``, so the exporter names its
    parameters ``module.<state_dict name>``.
    """

    PREFIX = "module."

    def __init__(self, module, flat):
        super().__init__()
        self.module = module
        self._leaves = list(flat.leaves)
        self._spec = flat.spec
        self._tensor_indices = flat.tensor_indices()
        self.out_spec = None
        self.out_leaves = None          # output leaves: constants, None at tensor slots
        self.out_tensor_positions = None
        self.guards = None              # a tracing.TraceGuards while ortmod exports
        self.eager_out = None           # the output of the eager run before the trace

    def forward(self, *tensors):
        if self.guards is not None:
            self.guards.reset()
        leaves = list(self._leaves)
        for i, t in zip(self._tensor_indices, tensors):
            leaves[i] = t
        args, kwargs = pytree.tree_unflatten(leaves, self._spec)
        out_leaves, self.out_spec = pytree.tree_flatten(self.expand(self.module(*args, **kwargs)))
        self.out_leaves = list(out_leaves)
        self.out_tensor_positions = [i for i, v in enumerate(out_leaves) if isinstance(v, torch.Tensor)]
        for i in self.out_tensor_positions:
            self.out_leaves[i] = None      # do not keep traced tensors alive
        outs = tuple(v for v in out_leaves if isinstance(v, torch.Tensor))
        if self.guards is not None:     # set only while a trace runs
            # values Python took out of tensors: extra graph outputs, checked after every call
            outs += self.guards.tensors()
        return outs

    def expand(self, out):
        """``out`` with its objects expanded (expand_objects). The TorchScript trace's is compared
        with the eager run's (kept here by that run), so that what the trace made a tensor where
        eager has a number comes back as eager's number, guarded."""
        if not torch.jit.is_tracing():
            self.eager_out = out
            return expand_objects(out)
        return expand_objects(out, reference=self.eager_out, guards=self.guards)


# ---------------------------------------------------------------------------
# outputs that are plain Python objects holding tensors (transformers' DynamicCache, ...)


def _slot_names(cls):
    """The attribute names the __slots__ of ``cls`` and its bases declare (a dataclass made with
    slots=True keeps its fields there, with no __dict__)."""
    names = []
    for c in cls.__mro__:
        slots = c.__dict__.get("__slots__", ())
        for name in ((slots,) if isinstance(slots, str) else slots):
            if name in ("__dict__", "__weakref__"):
                continue
            if name.startswith("__") and not name.endswith("__"):
                name = f"_{c.__name__.lstrip('_')}{name}"      # a private slot's mangled name
            if name not in names:
                names.append(name)
    return names


_NO_VALUE = object()


def object_attributes(obj):
    """{name: value} of what ``obj`` holds in its __dict__ and its slots, or None for an object
    with neither (a number, a C type's instance)."""
    d = getattr(obj, "__dict__", None)
    attrs = dict(d) if isinstance(d, dict) else None
    for name in _slot_names(type(obj)):
        v = getattr(obj, name, _NO_VALUE)       # an unset slot has no value to keep
        if v is not _NO_VALUE and (attrs is None or name not in attrs):
            attrs = {} if attrs is None else attrs
            attrs[name] = v
    return attrs


def _set_attribute(obj, kind, name, value):
    """Sets what _ObjectNode took out, past a frozen dataclass's __setattr__: an attribute in the
    __dict__, a slot through its descriptor, an item of a dict subclass."""
    if kind == "attr":
        obj.__dict__[name] = value
    elif kind == "slot":
        object.__setattr__(obj, name, value)
    else:
        dict.__setitem__(obj, name, value)


class _ObjectNode:
    """Stands, in a flattened output, for an object that is no pytree node but holds tensors in
    its attributes (a user's class, a dataclass, frozen or with slots): its tensor-holding
    attributes are its children, the rest stay on a template (a shallow copy without them).
    Unflattening builds a new object of the same class from the template and the new children,
    so the user gets what the module returns, with the engine's tensors in it."""

    __slots__ = ("template", "keys", "values", "aliases")

    def __init__(self, obj, children, numbers=None, items=None, aliases=None):
        # keys: ("attr", name), ("slot", name) or ("item", key), the last for a dict subclass
        # pytree does not know (a transformers ModelOutput whose class was made while
        # torch.export traced): its items are children too, or the template would hand the
        # traced tensors back. aliases: {attribute: item key} where both held one object
        # (ModelOutput's fields), rebuilt so
        d = getattr(obj, "__dict__", None)
        d = d if isinstance(d, dict) else {}

        def kind(name):
            return "attr" if name in d else "slot"
        self.keys = [(kind(k), k) for k in children] + [("item", k) for k in (items or {})]
        self.values = [children[k] for k in children] + list((items or {}).values())
        self.aliases = {k: (kind(k), item) for k, item in (aliases or {}).items()}
        self.template = copy.copy(obj)
        for kind_, k in self.keys:          # the template keeps no traced tensor alive
            _set_attribute(self.template, kind_, k, None)
        for k, (kind_, _) in self.aliases.items():
            _set_attribute(self.template, kind_, k, None)
        for k, v in (numbers or {}).items():
            _set_attribute(self.template, kind(k), k, v)


def _object_flatten(node):
    return node.values, (node.template, tuple(node.keys), tuple(node.aliases.items()))


def _object_unflatten(values, context):
    template, keys, aliases = context
    obj = copy.copy(template)
    for (kind, k), v in zip(keys, values):
        _set_attribute(obj, kind, k, v)
    for attr, (kind, key) in aliases:
        _set_attribute(obj, kind, attr, dict.__getitem__(obj, key))
    return obj


pytree.register_pytree_node(_ObjectNode, _object_flatten, _object_unflatten,
                            serialized_type_name="ortmod.capture.flatten._ObjectNode")


def check_output_leaves(wrapper):
    """Refuses an output leaf that is neither an engine output nor a constant, naming its path."""
    for i, v in enumerate(wrapper.out_leaves):
        if i not in wrapper.out_tensor_positions and not isinstance(v, _CONSTANT_OUTPUT_TYPES):
            path = pytree.keystr(compat.tree_flatten_with_path(
                pytree.tree_unflatten(list(range(len(wrapper.out_leaves))), wrapper.out_spec))[0][i][0])
            raise UnsupportedDataError(
                f"output{path} is a {type(v).__name__}, which ortmod cannot rebuild from the engine's outputs")


_SYMBOLIC_NUMBERS = (torch.SymInt, torch.SymFloat, torch.SymBool)


def holds(v, wanted, depth=0):
    """Whether ``v``, or a value in its containers or attributes, is one that ``wanted(value)``
    accepts."""
    if wanted(v):
        return True
    # a tensor is a leaf: a fake one's slots (fake_mode, its real tensor, its constant) are torch's;
    # so is a Python module (FSDP2's state holds torch.cpu as its device handle): its namespace is
    # the process's, not the model's (and torch's nests without end)
    if depth > 6 or isinstance(v, _CONSTANT_OUTPUT_TYPES + (torch.Tensor, types.ModuleType)):
        return False
    leaves = pytree.tree_leaves(v)
    if leaves != [v]:
        return any(holds(x, wanted, depth + 1) for x in leaves)
    if isinstance(v, dict) and any(holds(x, wanted, depth + 1) for x in v.values()):    # a dict subclass pytree does not know
        return True
    d = object_attributes(v)
    return d is not None and any(holds(x, wanted, depth + 1) for x in d.values())


def _holds_tensor(v):
    return holds(v, lambda x: isinstance(x, torch.Tensor))


def _holds_traced(v):
    """A tensor, or a number that torch.export traced symbolically (which only a guard makes
    eager's number again, as a 0-d tensor the TorchScript trace made of one)."""
    return holds(v, lambda x: isinstance(x, (torch.Tensor,) + _SYMBOLIC_NUMBERS))


_NUMBER_TYPES = (bool, int, float)


def traced_number(value, reference):
    """The TorchScript trace's stand-in for a Python number: (eager's number, the traced 0-d
    tensor) where the trace has a 0-d tensor and the eager run's ``reference`` is a number (jit
    tracing returns ``x.shape[-2]`` as a tensor, so ``self.cumulative_length += k.shape[-2]``
    makes one); else None."""
    if isinstance(value, torch.Tensor) and value.dim() == 0 and isinstance(reference, _NUMBER_TYPES):
        return reference, value
    return None


def expand_objects(tree, depth=0, reference=None, guards=None, number=traced_number, where="output"):
    """``tree`` with every leaf that is a plain object holding tensors replaced by an
    _ObjectNode, recursively (a DynamicCache's list of layers, each with keys and values).

    While tracing, a number eager returns that the trace holds as a stand-in (``number(value,
    reference)`` gives eager's number and the stand-in as a 0-d tensor; ``reference`` is the same
    output from the eager run, where there was one) is given back as eager's number, and the
    stand-in is guarded on ``guards`` (checked against that number after every call: another
    value means a new export, never a stale one). That holds for the output's own leaves and
    for the attributes of its objects."""
    def guarded(leaf, ref, what):
        traced = number(leaf, ref) if guards is not None else None
        if traced is None:
            return False, leaf
        value, tensor = traced
        guards.records.append((tensor, "a number traced as a tensor", value, what, True))
        return True, value

    def expand(path, leaf, ref=None):
        is_number, value = guarded(leaf, ref, where + pytree.keystr(path))
        if is_number:
            return value
        if isinstance(leaf, (torch.Tensor,) + _CONSTANT_OUTPUT_TYPES) or depth > 6:
            return leaf
        if isinstance(leaf, (type, torch.nn.Module)):
            return leaf
        d = object_attributes(leaf)
        if d is None or not _holds_traced(leaf):
            return leaf
        ref_d = (object_attributes(ref) if type(ref) is type(leaf) else None) or {}
        numbers = {}
        for k, v in d.items():
            is_number, value = guarded(v, ref_d.get(k), f"output attribute {type(leaf).__name__}.{k}")
            if is_number:
                numbers[k] = value
        item_values = {k: v for k, v in leaf.items() if _holds_traced(v)} if isinstance(leaf, dict) else {}
        aliases = {k: next(ik for ik, iv in item_values.items() if iv is v) for k, v in d.items()
                   if any(iv is v for iv in item_values.values())}
        children = {k: expand_objects(v, depth + 1, ref_d.get(k), guards, number,
                                      f"output attribute {type(leaf).__name__}.{k}")
                    for k, v in d.items() if k not in numbers and k not in aliases and _holds_traced(v)}
        items = {k: expand_objects(v, depth + 1, None, guards, number, f"output item {type(leaf).__name__}[{k!r}]")
                 for k, v in item_values.items()}
        return _ObjectNode(leaf, children, numbers, items, aliases)
    if reference is not None:
        try:
            return compat.tree_map_with_path(expand, tree, reference)
        except (ValueError, TypeError, KeyError):   # structures differ: nothing to compare with
            pass
    return compat.tree_map_with_path(expand, tree)


@dataclasses.dataclass
class GraphInput:
    """Where an ONNX graph input comes from: a user tensor leaf or a parameter/buffer."""
    name: str              # ONNX graph input name
    kind: str              # "input" or "state"
    leaf_index: int = -1   # for kind == "input": index into FlatInputs.leaves
    state_name: str = ""   # for kind == "state": name in the user's module (state_dict style)


def tensor_layouts(tensors):
    """(index, contiguous, channels-last contiguous) of each 4-d and 5-d call tensor: what eager's
    kernels that choose their arithmetic by memory layout read, directly or through the layouts
    the ops between propagate (a convolution of a channels-last input is channels-last)."""
    return tuple((k, t.is_contiguous(),
                  t.is_contiguous(memory_format=torch.channels_last if t.dim() == 4 else torch.channels_last_3d))
                 for k, t in enumerate(tensors) if t.dim() in (4, 5))


@dataclasses.dataclass
class Exported:
    onnx_bytes: bytes
    graph_inputs: dict      # ONNX graph input name -> GraphInput
    output_spec: object     # pytree spec of the user's output
    output_leaves: list     # output leaves: constants as returned, None where an engine output goes
    output_tensor_positions: list  # index in output_leaves of each engine output, in order
    # Training-mode BatchNormalization: the graph's extra outputs (after the user's) are
    # the new running statistics; after each training forward they are copied into these
    # buffers (state names), and each listed num_batches_tracked is incremented, as eager does.
    state_updates: list = dataclasses.field(default_factory=list)   # [(engine output index, buffer name)]
    counters: list = dataclasses.field(default_factory=list)        # [num_batches_tracked buffer name]
    # per graph output: the names of the graph inputs it depends on (for gradients that
    # no output in the loss reaches: None, as eager autograd gives, not zeros)
    output_deps: list = dataclasses.field(default_factory=list)
    # values the trace froze (ortmod.capture.tracing.Guard): engine outputs after the user's,
    # compared with what Python saw after every call
    guards: list = dataclasses.field(default_factory=list)
    # tracer warnings no guard covers: the graph holds only for the traced input shapes
    shape_specialized: bool = False
    hazards: list = dataclasses.field(default_factory=list)   # 'file:line ...' for messages
    # (tensor input, dim, size) the graph holds only for: dims exported static, or every dim
    # when shape_specialized; a call with another size there exports again
    static_dims: tuple = ()
    # the call tensors' memory layouts (tensor_layouts) where the graph holds a kernel eager picks
    # by layout (nearest upsampling): a call with other layouts exports again. None: it does not
    layouts: tuple = None
    # the shapes eager returned for the export's call: the engine's first run of the graph,
    # on the same call, must give them (a mis-converted op otherwise goes unnoticed)
    eager_shapes: tuple = ()
    # per ortmod::PythonOp function_id: the user's autograd.Function call (ortmod.capture.python_op.FunctionSpec)
    functions: list = dataclasses.field(default_factory=list)
    # the torch.export path (ortmod.capture.export): what the export assumed about the call's
    # input sizes (a ShapeGuard, checked per call: a call it rejects is exported again)
    shape_guard: object = None
    capture: str = "torchscript"    # which capture path made it
    timings: dict = dataclasses.field(default_factory=dict)   # seconds per capture stage


@contextlib.contextmanager
def collector_paused():
    """Python's cyclic garbage collector paused while a forward is captured (either path). A
    capture allocates hundreds of thousands of fx nodes, fake tensors and sympy expressions; the
    collections they trigger each walk the older generations, which hold torch's (and
    transformers') millions of module-level objects: 0.4-0.5 s of a MobileNetV2 first call on
    torch.export (bench/first_call.py). What the capture leaves in cycles is collected when the
    collector runs again, at the first allocation after. A collector the user disabled stays
    disabled, and one another thread's capture paused is not turned back on here."""
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


@contextlib.contextmanager
def _preserved_state(module, cuda_devices=()):
    """Tracing runs the module in torch: keep RNG (the CPU's and that of the CUDA devices the
    call uses: dropout draws there) and buffers (e.g. BatchNorm stats) unchanged."""
    buffers = [(b, b.detach().clone()) for b in module.buffers()]
    training = module.training
    with torch.random.fork_rng(devices=list(cuda_devices)):
        try:
            yield buffers
        finally:
            with torch.no_grad():
                for b, saved in buffers:
                    b.copy_(saved)
            module.train(training)


_PLAIN = (bool, int, float, str, type(None))

# the attributes nn.Module keeps its own state in (parameters, buffers, hooks): not the user's
MODULE_ATTRIBUTES = frozenset(vars(torch.nn.Module()))


def plain_attributes(module):
    """{(submodule, name): value} of the submodules' attributes holding plain Python values (a
    lazy module's, whose class changes on its first call as it sets its sizes, excepted)."""
    return {(m, k): v for m in module.modules() if not isinstance(m, torch.nn.modules.lazy.LazyModuleMixin)
            for k, v in vars(m).items() if k not in MODULE_ATTRIBUTES and type(v) in _PLAIN}


def changed_attributes(before):
    """'Class.name (old -> new)' of each attribute of ``before`` (plain_attributes) whose value
    forward changed."""
    out = []
    for (m, k), v in before.items():
        now = vars(m).get(k, v)
        if type(now) is not type(v) or now != v:
            out.append(f"{type(m).__name__}.{k} ({v!r} -> {now!r})")
    return list(dict.fromkeys(out))


def warn_attribute_changes(module, changes, strict_trace):
    """A forward that changes a plain attribute of a submodule: ortmod runs forward only when it
    exports, so the change happens then, not on every call as in eager. Idempotent changes (Swin
    fitting its window to the input, the same every call) are harmless; a counter is not: a
    warning, and an error under strict_trace."""
    if not changes:
        return
    what = (f"{type(module).__name__}.forward changes {', '.join(changes)}: ortmod runs forward only when it "
            "exports, so such an attribute changes then, not on every call as in eager")
    if strict_trace:
        raise UnsupportedModelError(what + " (strict_trace is on)")
    warnings.warn("ortmod: " + what + " (DebugOptions(strict_trace=True) or ORTMOD_STRICT_TRACE=1 makes this "
                  "an error)", TraceHazardWarning, stacklevel=2)


# Non-tensor output values that can be returned as they were at export time.
_CONSTANT_OUTPUT_TYPES = (type(None), bool, int, float, complex, str, bytes, torch.dtype, torch.device,
                          torch.Size, enum.Enum)
