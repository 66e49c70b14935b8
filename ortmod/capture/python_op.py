"""A user's torch.autograd.Function inside an ORTModule: the user's own forward and backward,
run in PyTorch from a node of the engine's graph (ONNX Runtime calls it PythonOp).

Capture. While ortmod exports, ``Function.apply`` is wrapped (``capturing_functions``): each
call made by the traced forward is noted with what eager autograd would see (which tensor
arguments require grad, the non-tensor arguments, the outputs), and its traced
``prim::PythonOp`` node is tagged with the record's index. That node exports as
``ortmod::PythonOp`` of the tensor arguments with a ``function_id`` (the engine op of the same
name, csrc/ops/callback.c). An output eager gives no history (a call under the forward's own
``no_grad``, ``ctx.mark_non_differentiable``) is detached in the trace: a stop-gradient. When
the user asks for it (``DebugOptions(inline_autograd_functions=True)``) every Function is
inlined as torch does it, and the engine differentiates its forward; torch's own Functions
(reentrant checkpointing) are refused otherwise, by name. The torch.export path
(ortmod/capture/export.py) is a second front end to the same records: its
``ortmod::python_op`` becomes the same node.

Run. The engine calls ``FunctionRunner`` for the node's output shapes (plan time), its forward
and its backward. In training, the forward runs ``Function.apply`` with grad enabled on copies
of the inputs that require grad exactly where the trace's did, so the user's ``ctx``,
``save_for_backward`` and ``needs_input_grad`` behave as in eager; the backward is
``torch.autograd.grad`` through that record, which calls the user's ``backward``. Which record a
backward belongs to is kept per engine call (``call_scope``): each engine forward runs each
PythonOp once, and two forwards before their backwards keep two records.
"""
import contextlib
import threading

import torch

from . import compat
from .compat import pytree

from .errors import UnsupportedModelError
from .errors import user_frame

_DTYPES = {1: torch.float32, 2: torch.uint8, 3: torch.int8, 6: torch.int32, 7: torch.int64, 9: torch.bool,
           10: torch.float16, 11: torch.float64, 16: torch.bfloat16}
_ONNX_DTYPE = {v: k for k, v in _DTYPES.items()}

_local = threading.local()


def _inside_function():
    """True while a Function's own forward runs during an ortmod export. It runs with grad
    disabled, yet what it computes is differentiated (by its backward, or by the engine when
    inlined): the stop-gradient mode leaves it alone."""
    return getattr(_local, "depth", 0) > 0


def _inside_kept_function():
    """True inside the forward of a Function that runs in PyTorch at run time: nothing in it is
    frozen into the graph, so the trace guards leave it alone (an inlined one is guarded)."""
    return getattr(_local, "kept_depth", 0) > 0


class FunctionSpec:
    """One captured Function call: what to run and how to rebuild its arguments. ``outputs`` may
    come later (``set_outputs``): the torch.export front end learns them from the call's fake run.
    ``grad_enabled``: the grad mode at the call; without it eager's needs_input_grad is all False."""
    __slots__ = ("cls", "arg_kinds", "constants", "requires_grad", "traced_in", "traced_out", "out_dtypes",
                 "where", "returns_tuple", "out_differentiable")

    def __init__(self, cls, args, outputs, where, grad_enabled=True):
        self.cls = cls
        self.where = where
        self.arg_kinds = ["t" if isinstance(a, torch.Tensor) else "c" for a in args]
        self.constants = [a for a in args if not isinstance(a, torch.Tensor)]
        if any(isinstance(leaf, torch.Tensor) for leaf in pytree.tree_leaves(self.constants)):
            raise UnsupportedModelError(f"{cls.__qualname__}.apply (at {where}) takes a tensor inside a container "
                                        "argument; ortmod passes a Function's tensors as direct arguments only")
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        self.requires_grad = [bool(grad_enabled) and t.requires_grad and (t.is_floating_point() or t.is_complex())
                              for t in tensors]
        self.traced_in = [_sizes(t) for t in tensors]
        self.traced_out = self.out_dtypes = self.returns_tuple = self.out_differentiable = None
        if outputs is not None:
            self.set_outputs(outputs)

    def set_outputs(self, outputs, returns_tuple=None, differentiable=None):
        self.traced_out = [_sizes(t) for t in outputs]
        self.out_dtypes = [t.dtype for t in outputs]
        self.returns_tuple = returns_tuple
        self.out_differentiable = differentiable

    @property
    def name(self):
        return f"{self.cls.__module__}.{self.cls.__qualname__}"

    def args(self, tensors):
        it, consts = iter(tensors), iter(self.constants)
        return [next(it) if k == "t" else next(consts) for k in self.arg_kinds]

    def onnx_dtypes(self):
        """The PythonOp node's ``output_dtypes`` attribute."""
        dtypes = [_ONNX_DTYPE.get(d) for d in self.out_dtypes]
        if None in dtypes:
            raise UnsupportedModelError(f"{self.name} returns a {self.out_dtypes[dtypes.index(None)]} tensor; "
                                        "ortmod runs Functions whose outputs are real or integer tensors")
        return dtypes


def _sizes(t):
    """A tensor's sizes as ints; a symbolic size (torch.export's fake tensors) as its example
    value, which is what the runner's shape fallback compares (see FunctionRunner._infer)."""
    if not any(isinstance(s, torch.SymInt) for s in t.shape):
        return tuple(t.shape)
    return tuple(_example_size(s) if isinstance(s, torch.SymInt) else s for s in t.shape)


def _example_size(s):
    from torch.fx.experimental import symbolic_shapes
    for name in ("optimization_hint", "hint_int"):      # torch renamed it (2.13: optimization_hint)
        hint = getattr(symbolic_shapes, name, None)
        if hint is not None:
            return int(hint(s, fallback=-1))
    return -1       # unknown: a shape fallback that used it would fail the C side's size check


def refuse_torch_function(cls):
    """The error for one of torch's own Functions met while ortmod keeps the user's."""
    return UnsupportedModelError(
        f"the forward calls torch's own autograd.Function {cls.__module__}.{cls.__qualname__} (reentrant "
        "torch.utils.checkpoint, ...); ortmod runs only the user's Functions in PyTorch. Use "
        "DebugOptions(inline_autograd_functions=True) to have the engine differentiate its forward "
        "(for checkpointing, ORTMODULE_MEMORY_OPT_LEVEL recomputes inside the engine instead)")


def refuse_keywords(cls):
    return UnsupportedModelError(f"{cls.__qualname__}.apply is called with keyword arguments; "
                                 "ortmod captures a Function's positional arguments only")


class FunctionRecorder:
    """Function calls of one export. Each kept call's traced node is tagged with the index of its
    record (attribute ``ortmod_call``): the exporter copies the graph before its passes, and the
    tag is what survives the copy."""

    def __init__(self, inline_all=False):
        self.inline_all = inline_all
        self.calls = []        # ortmod_call -> FunctionSpec
        self.specs = []        # function_id -> FunctionSpec, for the calls kept as PythonOp

    def note(self, cls, args, out, grad_enabled=True):
        if not self.keeps(cls):
            return
        outputs = out if isinstance(out, tuple) else (out,)
        where = user_frame(3)
        if not outputs or not all(isinstance(o, torch.Tensor) for o in outputs):
            raise UnsupportedModelError(f"{cls.__qualname__}.apply (at {where}) returns something other than "
                                        "tensors; ortmod runs Functions that return a tensor or a tuple of tensors")
        try:
            node = compat.get_value_trace(outputs[0]).node()
        except RuntimeError:
            return                      # not traced: nothing of it is in the graph
        if node.kind() == "prim::TupleUnpack":  # a Function returning a tuple
            node = node.input().node()
        if node.kind() != "prim::PythonOp":
            return
        node.i_("ortmod_call", len(self.calls))
        self.calls.append(FunctionSpec(cls, args, outputs, where, grad_enabled))

    def keeps(self, cls):
        """Run this Function as a callback (True) or inline its forward (False)?"""
        if self.inline_all:
            return False
        return not (cls.__module__ or "").startswith("torch.") or is_custom_op_function(cls)


def is_custom_op_function(cls):
    """The autograd.Function torch.library makes for a library's custom op with a registered
    backward (torch.library.custom_op + register_autograd): its forward runs the op's own kernel
    and its backward the registered one, both the library's code, so it runs in PyTorch as a
    user's Function does."""
    return cls.__module__ == "torch._library.autograd" and cls.__name__.startswith("GeneratedBackwardFor_")


def _note_apply(original):
    def apply(cls, *args, **kwargs):
        recorder = getattr(_local, "recorder", None)
        if recorder is None or not torch.jit.is_tracing():
            return compat.call_apply(original, cls, *args, **kwargs)
        if kwargs:
            raise refuse_keywords(cls)
        kept = recorder.keeps(cls)
        grad = torch.is_grad_enabled()
        outermost = not _inside_function()
        _local.depth = getattr(_local, "depth", 0) + 1
        _local.kept_depth = getattr(_local, "kept_depth", 0) + kept
        try:
            out = compat.call_apply(original, cls, *args)
        finally:
            _local.depth -= 1
            _local.kept_depth -= kept
        recorder.note(cls, args, out, grad)
        if outermost and any(isinstance(a, torch.Tensor) and a.requires_grad for a in args):
            # an output eager gives no history (the call is under the forward's own
            # torch.no_grad(), or ctx.mark_non_differentiable) is a stop-gradient in the graph:
            # tracing.StopGradientMode does this for torch's ops, apply does not pass through it
            out = pytree.tree_map(
                lambda t: t.detach() if isinstance(t, torch.Tensor) and t.is_floating_point() and not t.requires_grad
                else t, out)
        return out
    return classmethod(apply)


def _python_op_symbolic(g, *args, **attrs):
    """prim::PythonOp -> ortmod::PythonOp(tensor arguments) with the call's function_id."""
    node = g.original_node
    cls = getattr(node.pyobj(), "__self__", None)
    name = getattr(cls, "__qualname__", node.pyname())
    recorder = _local.recorder
    if "ortmod_call" not in attrs:
        if cls is not None and not recorder.keeps(cls):
            raise refuse_torch_function(cls)
        raise UnsupportedModelError(f"the trace holds a call of {name} that ortmod did not see being made")
    spec = recorder.calls[attrs["ortmod_call"]]
    dtypes = spec.onnx_dtypes()
    tensors = [a for a, c in zip(args, node.cconv()) if c == "d"]
    function_id = len(recorder.specs)
    recorder.specs.append(spec)
    outs = g.op("ortmod::PythonOp", *tensors, function_id_i=function_id, output_dtypes_i=dtypes,
                outputs=len(dtypes))
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    for o, t in zip(outs, node.outputs()):
        # dtype and rank as traced, every size unknown: a static size here would let the
        # exporter fold the shapes computed from this output into constants
        rank = t.type().dim()
        o.setType(t.type().with_sizes([None] * rank) if rank is not None else t.type())
    return outs if len(outs) > 1 else outs[0]


@contextlib.contextmanager
def capturing_functions(recorder, opset):
    """For one torch.onnx.export (called with ``autograd_inlining=recorder.inline_all``): note the
    Function calls, and export the user's as ortmod::PythonOp."""
    fn = torch.autograd.function.Function
    original_apply = compat.function_apply()
    _local.recorder = recorder
    fn.apply = _note_apply(original_apply)
    if not recorder.inline_all:
        torch.onnx.register_custom_op_symbolic("prim::PythonOp", _python_op_symbolic, opset)
    try:
        yield recorder
    finally:
        if not recorder.inline_all:
            torch.onnx.unregister_custom_op_symbolic("prim::PythonOp", opset)
        fn.apply = original_apply
        _local.recorder = None



# ---------------------------------------------------------------------------------------------
# run time


@contextlib.contextmanager
def call_scope(records=None, training=True):
    """The Function records of one engine call: a new dict for a training forward (returned, for
    the autograd ctx to keep), the forward's dict for its backward. For an inference call
    (``training=False``) there is none: Functions run under no_grad and keep nothing."""
    previous = getattr(_local, "records", None)
    _local.records = None if not training else {} if records is None else records
    try:
        yield _local.records
    finally:
        _local.records = previous


class FunctionRunner:
    """The engine's callback for the PythonOp nodes of one export (see _C.Engine(callback=))."""

    def __init__(self, specs):
        self.specs = specs
        self.error = None       # the first exception a callback raised, for the caller to re-raise

    def take_error(self):
        e, self.error = self.error, None
        return e

    def __call__(self, phase, function_id, inputs, outputs):
        try:
            spec = self.specs[function_id]
            if phase == 0:
                return self._infer(spec, inputs, outputs)
            if phase == 1:
                return self._forward(function_id, spec, inputs, outputs)
            return self._backward(function_id, spec, inputs, outputs)
        except BaseException as e:
            if self.error is None:
                self.error = e
            raise

    def _infer(self, spec, inputs, out_dtypes):
        shapes = [tuple(s) for _, s in inputs]
        try:
            metas = [torch.empty(s, dtype=_DTYPES[d], device="meta") for d, s in inputs]
            with torch.no_grad():
                ys = spec.cls.apply(*spec.args(metas))
            ys = ys if isinstance(ys, tuple) else (ys,)
            return [tuple(y.shape) for y in ys]
        except Exception:       # noqa: BLE001 - not every Function runs on meta tensors
            pass
        # an output traced with the shape of an input keeps following it; the others stay as traced
        out = []
        for traced in spec.traced_out:
            match = next((shapes[k] for k, t in enumerate(spec.traced_in) if t == traced and k < len(shapes)), None)
            out.append(match if match is not None else traced)
        return out

    def _forward(self, function_id, spec, inputs, outputs):
        xs = [torch.from_dlpack(c) for c in inputs]
        records = getattr(_local, "records", None)
        if records is not None:
            # copies: the engine reuses its memory after the step, the user's ctx may save them
            xs = [x.detach().clone().requires_grad_(rg) for x, rg in zip(xs, spec.requires_grad)]
        versions = [x._version for x in xs]
        with torch.no_grad() if records is None else torch.enable_grad():
            ys = spec.cls.apply(*spec.args(xs))
        if any(x._version != v for x, v in zip(xs, versions)):
            # eager changes the caller's tensor; the engine's graph holds the value from before
            raise RuntimeError(f"{spec.name} (called at {spec.where}) changed one of its tensor arguments in place "
                               "(ctx.mark_dirty), which ortmod does not reproduce: the graph reads the argument's "
                               "value from before the call; return a new tensor instead")
        ys = ys if isinstance(ys, tuple) else (ys,)
        if len(ys) != len(outputs):
            raise RuntimeError(f"{spec.name} (called at {spec.where}) returned {len(ys)} outputs; it returned "
                               f"{len(outputs)} when traced")
        for k, (y, cap) in enumerate(zip(ys, outputs)):
            dst = torch.from_dlpack(cap)
            if not isinstance(y, torch.Tensor) or y.shape != dst.shape or y.dtype != dst.dtype:
                got = f"{tuple(y.shape)} {y.dtype}" if isinstance(y, torch.Tensor) else type(y).__name__
                raise RuntimeError(f"{spec.name} (called at {spec.where}) returned {got} as output {k}; the engine "
                                   f"planned {tuple(dst.shape)} {dst.dtype} from its trace")
            dst.copy_(y)
        if records is not None:
            records[function_id] = (xs, ys)

    def _backward(self, function_id, spec, grad_outputs, grad_inputs):
        records = getattr(_local, "records", None)
        record = records.pop(function_id, None) if records is not None else None
        if record is None:
            raise RuntimeError(f"backward of {spec.name}: its forward record is missing (ortmod bug)")
        xs, ys = record
        for k, (y, c) in enumerate(zip(ys, grad_outputs)):
            if c is not None and spec.out_differentiable and spec.out_differentiable[k] and not y.requires_grad:
                # the trace gave this output a gradient; a zero here would be silently wrong
                raise RuntimeError(f"{spec.name} (called at {spec.where}): output {k} has no autograd history at "
                                   "run time, so no gradient can flow through it (an op with no autograd kernel: "
                                   "register one, e.g. torch.library.register_autograd)")
        pairs = [(y, torch.from_dlpack(c)) for y, c in zip(ys, grad_outputs)
                 if c is not None and isinstance(y, torch.Tensor) and y.requires_grad]
        wanted = [i for i, c in enumerate(grad_inputs) if c is not None and xs[i].requires_grad]
        grads = [None] * len(wanted)
        if pairs and wanted:
            grads = torch.autograd.grad([y for y, _ in pairs], [xs[i] for i in wanted], [g for _, g in pairs],
                                        allow_unused=True)
        given = dict(zip(wanted, grads))
        for i, cap in enumerate(grad_inputs):
            if cap is None:
                continue
            dst = torch.from_dlpack(cap)
            g = given.get(i)
            if g is None:
                dst.zero_()
            elif g.shape != dst.shape:
                raise RuntimeError(f"{spec.name}.backward returned a gradient of shape {tuple(g.shape)} for an "
                                   f"input of shape {tuple(dst.shape)}")
            else:
                dst.copy_(g)
