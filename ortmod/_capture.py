"""Capture: flatten a call's inputs, compute its schema key, export the module to ONNX.

A *schema* is everything that decides the exported graph: the structure of the
arguments (a pytree spec), per tensor its dtype, rank, device and requires_grad, the
non-tensor values (baked into the graph as constants), train/eval, whether grad is
enabled, and the dtype/device/requires_grad of every parameter and buffer. Sizes are
not in the key: every dimension is dynamic in the exported graph, so a new batch size
reuses the graph and only makes the engine re-plan.
"""
import contextlib
import dataclasses
import inspect
import io
import warnings

import torch
import torch.utils._pytree as pytree

# dtypes the engine can take; anything else (complex, quantized, float8, ...) is a
# TypeError at the call site rather than an obscure export or engine failure.
SUPPORTED_DTYPES = frozenset({
    torch.float32, torch.float64, torch.float16, torch.bfloat16,
    torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8, torch.bool,
})
SUPPORTED_DEVICE_TYPES = frozenset({"cpu"})

ONNX_OPSET = 20


def dtype_name(dtype):
    return str(dtype).replace("torch.", "")


# ---------------------------------------------------------------------------
# flattening and naming


class FlatInputs:
    """The pytree leaves of a call's (args, kwargs), their spec, and (lazily) their key paths."""

    __slots__ = ("leaves", "spec", "_tree", "_paths")

    def __init__(self, leaves, spec, tree):
        self.leaves = leaves
        self.spec = spec
        self._tree = tree
        self._paths = None

    @property
    def paths(self):
        # key paths only matter for error messages: computed on a cache miss, not per step
        if self._paths is None:
            self._paths = [p for p, _ in pytree.tree_flatten_with_path(self._tree)[0]]
        return self._paths

    def tensor_indices(self):
        return [i for i, v in enumerate(self.leaves) if isinstance(v, torch.Tensor)]


def flatten_inputs(args, kwargs):
    tree = (tuple(args), dict(kwargs))
    leaves, spec = pytree.tree_flatten(tree)
    return FlatInputs(leaves, spec, tree)


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
        raise TypeError(f"{what} has dtype {dtype_name(tensor.dtype)}, which ortmod does not "
                        f"support (supported: {', '.join(sorted(map(dtype_name, SUPPORTED_DTYPES)))})")
    if tensor.device.type not in SUPPORTED_DEVICE_TYPES:
        raise ValueError(f"{what} is on device '{tensor.device}', which ortmod's engine does not "
                         f"support (supported: {', '.join(sorted(SUPPORTED_DEVICE_TYPES))})")
    if tensor.layout != torch.strided:
        raise TypeError(f"{what} has layout {tensor.layout}; ortmod takes only dense (strided) tensors")
    if tensor.is_quantized or tensor.is_complex():
        raise TypeError(f"{what} has dtype {dtype_name(tensor.dtype)}, which ortmod does not support")


def check_inputs(module, flat):
    for i in flat.tensor_indices():
        check_tensor(flat.leaves[i], describe_input(module, flat.paths[i]))


def check_state(module):
    for name, p in module.named_parameters(remove_duplicate=True):
        check_tensor(p, f"parameter '{name}'")
    for name, b in module.named_buffers(remove_duplicate=True):
        check_tensor(b, f"buffer '{name}'")


# ---------------------------------------------------------------------------
# schema key


def _constant_key(value):
    try:
        hash(value)
        return (type(value).__qualname__, value)
    except TypeError:
        return (type(value).__qualname__, repr(value))


def state_signature(module):
    """(name, dtype, device, requires_grad) of every parameter and buffer, in order."""
    sig = [(n, p.dtype, p.device, p.requires_grad) for n, p in module.named_parameters()]
    sig.extend((n, b.dtype, b.device) for n, b in module.named_buffers())
    return tuple(sig)


def schema_key(module, flat):
    per_leaf = []
    for v in flat.leaves:
        if isinstance(v, torch.Tensor):
            per_leaf.append(("T", v.dtype, v.dim(), v.device, v.requires_grad))
        else:
            per_leaf.append(("C",) + _constant_key(v))
    return (flat.spec, tuple(per_leaf), bool(module.training), torch.is_grad_enabled(),
            state_signature(module))


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

    def forward(self, *tensors):
        leaves = list(self._leaves)
        for i, t in zip(self._tensor_indices, tensors):
            leaves[i] = t
        args, kwargs = pytree.tree_unflatten(leaves, self._spec)
        out = self.module(*args, **kwargs)
        out_leaves, self.out_spec = pytree.tree_flatten(out)
        self.out_leaves = list(out_leaves)
        self.out_tensor_positions = [i for i, v in enumerate(out_leaves) if isinstance(v, torch.Tensor)]
        for i in self.out_tensor_positions:
            self.out_leaves[i] = None      # do not keep traced tensors alive
        return tuple(v for v in out_leaves if isinstance(v, torch.Tensor))


@dataclasses.dataclass
class GraphInput:
    """Where an ONNX graph input comes from: a user tensor leaf or a parameter/buffer."""
    name: str              # ONNX graph input name
    kind: str              # "input" or "state"
    leaf_index: int = -1   # for kind == "input": index into FlatInputs.leaves
    state_name: str = ""   # for kind == "state": name in the user's module (state_dict style)
    owner: object = None   # for kind == "state": the submodule holding it
    attr: str = ""         # ... and its attribute name there

    def resolve(self, leaves):
        if self.kind == "input":
            return leaves[self.leaf_index]
        return getattr(self.owner, self.attr)


@dataclasses.dataclass
class Exported:
    onnx_bytes: bytes
    graph_inputs: dict      # ONNX graph input name -> GraphInput
    output_spec: object     # pytree spec of the user's output
    output_leaves: list     # output leaves: constants as returned, None where an engine output goes
    output_tensor_positions: list  # index in output_leaves of each engine output, in order


@contextlib.contextmanager
def _preserved_state(module):
    """Tracing runs the module in torch: keep RNG and buffers (e.g. BatchNorm stats) unchanged."""
    buffers = [(b, b.detach().clone()) for b in module.buffers()]
    training = module.training
    with torch.random.fork_rng(devices=[]):
        try:
            yield
        finally:
            with torch.no_grad():
                for b, saved in buffers:
                    b.copy_(saved)
            module.train(training)


def _state_owner(module, name):
    owner_path, _, attr = name.rpartition(".")
    owner = module.get_submodule(owner_path) if owner_path else module
    return owner, attr


def export(module, flat):
    """Export ``module`` called as ``flat`` describes; return ONNX bytes and the input/output mapping."""
    import onnx
    from torch.onnx import TrainingMode

    wrapper = _FlatWrapper(module, flat)
    tensor_indices = flat.tensor_indices()
    tensors = tuple(flat.leaves[i] for i in tensor_indices)
    input_names = [f"input_{k}" for k in range(len(tensors))]

    with _preserved_state(module):
        # One eager run first, to learn the output structure and ranks (all output
        # dimensions are declared dynamic, and dynamic_axes needs the ranks).
        with torch.no_grad():
            outs = wrapper(*tensors)
        if not outs:
            raise RuntimeError("ortmod: the module returned no tensors; there is nothing to run")
        output_names = [f"output_{j}" for j in range(len(outs))]
        dynamic_axes = {}
        for name, t in zip(input_names, tensors):
            dynamic_axes[name] = {d: f"{name}_dim{d}" for d in range(t.dim())}
        for name, t in zip(output_names, outs):
            dynamic_axes[name] = {d: f"{name}_dim{d}" for d in range(t.dim())}

        f = io.BytesIO()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", UserWarning)
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
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
            )
    onnx_bytes = f.getvalue()

    # Map every graph input to its source. Parameters and buffers are named by their
    # state_dict names under the wrapper; a tied tensor appears once, under one name.
    state_names = {}
    for name, _ in wrapper.named_parameters(remove_duplicate=False):
        state_names[name] = name
    for name, _ in wrapper.named_buffers(remove_duplicate=False):
        state_names[name] = name
    model = onnx.load_from_string(onnx_bytes)
    initializers = {init.name for init in model.graph.initializer}
    graph_inputs = {}
    for gi in model.graph.input:
        if gi.name in input_names:
            graph_inputs[gi.name] = GraphInput(gi.name, "input",
                                               leaf_index=tensor_indices[input_names.index(gi.name)])
        elif gi.name in state_names:
            inner = gi.name[len(_FlatWrapper.PREFIX):] if gi.name.startswith(_FlatWrapper.PREFIX) else gi.name
            owner, attr = _state_owner(module, inner)
            graph_inputs[gi.name] = GraphInput(gi.name, "state", state_name=inner, owner=owner, attr=attr)
        elif gi.name in initializers:
            continue  # an initializer listed as input has its value in the graph
        else:
            raise RuntimeError(f"ortmod: exported graph input '{gi.name}' is neither a call input "
                               f"nor a parameter/buffer of the module")
    return Exported(onnx_bytes, graph_inputs, wrapper.out_spec, wrapper.out_leaves,
                    wrapper.out_tensor_positions)
