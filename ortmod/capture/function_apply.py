"""A user's ``torch.autograd.Function`` and a library's custom op on the torch.export path: while
torch.export traces, ``Function.apply`` is patched so each call becomes the opaque
``ortmod::python_op`` op (kept through decomposition), translated to the engine's
``ortmod::PythonOp`` callback node; the recorder of the export in progress holds the calls."""
import contextlib
import functools
import threading

import torch

from . import compat
from .compat import pytree

from . import python_op as pyop
from .errors import UnsupportedModelError
from .onnx_util import _concrete
from .errors import user_frame


# ---------------------------------------------------------------------------------------------
# a user's autograd.Function: one opaque op per call, the TorchScript path's ortmod::PythonOp in ONNX
#
# torch.export would inline a Function's forward and lose its backward. While it traces,
# Function.apply is replaced: a user's Function becomes ``ortmod::python_op(tensors, call)``, an
# op that decomposition leaves alone, whose fake kernel runs the user's forward on the fake
# tensors (the output shapes, symbolic sizes included, are the forward's own). The call's record
# is python_op's FunctionSpec, kept by a python_op.FunctionRecorder as on the TorchScript path; the ONNX
# translation gives the node that path gives, so the engine and python_op.FunctionRunner run it.

_functions = threading.local()     # .recorder: the FunctionRecorder of the export in progress


@torch.library.custom_op("ortmod::python_op", mutates_args=())
def python_op(xs: list[torch.Tensor], call: int) -> list[torch.Tensor]:
    """Call ``call`` of the export in progress: the user's forward on ``xs``."""
    return _run_function(xs, call)


@python_op.register_fake
def _python_op_fake(xs, call):
    return _run_function(xs, call)


def _run_function(xs, call):
    recorder = getattr(_functions, "recorder", None)
    if recorder is None:
        raise RuntimeError("ortmod::python_op stands for a user's autograd.Function only while ortmod captures "
                           "a module with torch.export")
    spec = recorder.calls[call]
    # grad enabled, on copies that require grad where the call's arguments did: the outputs'
    # requires_grad is then eager's (mark_non_differentiable, integer outputs)
    copies = [x.detach().requires_grad_(rg) for x, rg in zip(xs, spec.requires_grad)]
    versions = [c._version for c in copies]
    fake_mode = compat.detect_fake_mode(xs)
    shape_env = getattr(fake_mode, "shape_env", None)
    _functions.inside = getattr(_functions, "inside", 0) + 1
    try:
        # a number the forward takes from a tensor (.item()) is a fresh unbacked symbol that no
        # output holds (checked below): the forward runs in PyTorch, the graph never sees it
        with torch.enable_grad(), (shape_env.ignore_fresh_unbacked_symbols() if shape_env is not None
                                   else contextlib.nullcontext()):
            ys = _unpatched_apply(spec.cls)(*spec.args(copies))
    except UnsupportedModelError:
        raise
    except Exception as e:
        if any(c._version != v for c, v in zip(copies, versions)):
            raise _refuse_in_place(spec) from e
        raise UnsupportedModelError(
            f"{spec.name} (called at {spec.where}): its forward does not run on torch.export's fake tensors, "
            f"from which ortmod takes its output shapes ({type(e).__name__}: {str(e).splitlines()[0][:300]}); "
            "ORTMOD_CAPTURE=torchscript captures it with the TorchScript exporter") from e
    finally:
        _functions.inside -= 1
    if any(c._version != v for c, v in zip(copies, versions)):
        raise _refuse_in_place(spec)
    returns_tuple = isinstance(ys, tuple)
    ys = ys if returns_tuple else (ys,)
    if not ys or not all(isinstance(y, torch.Tensor) for y in ys):
        raise UnsupportedModelError(f"{spec.cls.__qualname__}.apply (at {spec.where}) returns something other than "
                                    "tensors; ortmod runs Functions that return a tensor or a tuple of tensors")
    from torch.fx.experimental.symbolic_shapes import free_unbacked_symbols
    if free_unbacked_symbols([y.shape for y in ys]):
        raise UnsupportedModelError(
            f"{spec.name} (called at {spec.where}) returns a tensor whose size depends on tensor values; on the "
            "torch.export path ortmod plans a Function's outputs from their sizes (ORTMOD_CAPTURE=torchscript "
            "captures it with the TorchScript exporter)")
    if spec.out_dtypes is None and issubclass(spec.cls, _OpCall):
        # autograd does not record below python_op's dispatch, where a custom op's own autograd
        # runs: its floating outputs are differentiable as eager's are (an op without a registered
        # backward raises in eager's backward, and in the runner's, naming the op)
        spec.set_outputs(ys, returns_tuple, [y.is_floating_point() and any(spec.requires_grad) for y in ys])
    elif spec.out_dtypes is None:
        differentiable = [y.requires_grad for y in ys]
        if any(spec.requires_grad) and not any(differentiable) and not _autograd_records(copies, spec):
            raise RuntimeError(f"ortmod: autograd does not record inside the fake kernel of {spec.name}, so which "
                               "of its outputs are differentiable cannot be told (ortmod bug for this torch)")
        spec.set_outputs(ys, returns_tuple, differentiable)
    elif [y.dtype for y in ys] != spec.out_dtypes:
        raise RuntimeError(f"{spec.name}: its forward gave other dtypes when traced again (ortmod bug)")
    # fresh tensors: an op's outputs alias neither its inputs nor each other; contiguous, as the
    # engine hands them back
    return [y.detach().clone(memory_format=torch.contiguous_format) for y in ys]


def _autograd_records(copies, spec):
    probe = next(c for c, rg in zip(copies, spec.requires_grad) if rg)
    with torch.enable_grad():
        return (probe * 1).requires_grad


def _refuse_in_place(spec):
    return UnsupportedModelError(
        f"{spec.name} (called at {spec.where}) changes one of its arguments in place (ctx.mark_dirty); ortmod "
        "runs a Function on copies of its arguments, so the change would not reach the caller's tensor")


_original_apply = compat.function_apply()
_OWN_OP_FUNCTIONS = "GeneratedBackwardFor_ortmod_"     # torch._library.autograd's class names


def _export_apply(cls, *args, **kwargs):
    recorder = getattr(_functions, "recorder", None)
    if recorder is None or getattr(_functions, "inside", 0) or cls.__name__.startswith(_OWN_OP_FUNCTIONS):
        # another thread, a Function called by a user's forward (eager runs it as plain code), or
        # the autograd wrapper torch.library gives ortmod's own ops (ortmod::ctc_loss: the graph
        # keeps the op, and the engine differentiates its node)
        return compat.call_apply(_original_apply, cls, *args, **kwargs)
    if not (issubclass(cls, _OpCall) or recorder.keeps(cls)):
        raise pyop.refuse_torch_function(cls)
    if kwargs:
        raise pyop.refuse_keywords(cls)
    where = user_frame(2)
    args = tuple(a if isinstance(a, torch.Tensor) else pytree.tree_map(_concrete, a) for a in args)
    spec = pyop.FunctionSpec(cls, args, None, where, grad_enabled=torch.is_grad_enabled())
    call = len(recorder.calls)
    recorder.calls.append(spec)
    outs = torch.ops.ortmod.python_op.default([a for a in args if isinstance(a, torch.Tensor)], call)
    if spec.out_differentiable is None:
        raise RuntimeError(f"ortmod: the fake kernel of {spec.name} did not run while torch.export traced it "
                           "(ortmod bug for this torch)")
    # an output eager gives no history (mark_non_differentiable, a call under no_grad) gets no
    # gradient: detach, which becomes a stop-gradient in the graph (_insert_stop_gradients)
    outs = [o.detach() if not d and o.is_floating_point() else o for o, d in zip(outs, spec.out_differentiable)]
    return tuple(outs) if spec.returns_tuple else outs[0]


@contextlib.contextmanager
def _function_records(recorder):
    """For one export, from torch.export to the ONNX translation: the recorder whose calls the
    op's kernels and its translation read."""
    _functions.recorder = recorder
    try:
        yield recorder
    finally:
        _functions.recorder = None


# ---- a library's custom op (torch.library): a callback node like a user's Function ----------
#
# torch.export keeps a custom op as one node of the graph, which the engine cannot run. Its
# forward and its registered backward are the library's code, so each call becomes
# ortmod::python_op as a Function's does: the op stands where the Function class would (an
# _OpCall class whose ``apply`` calls it); at run time python_op.FunctionRunner calls the op with
# grad enabled and differentiates it through its registered autograd. An op without one fails
# in its backward as in eager, naming the op.

# torch's own namespaces: the translation and the audit deal with these ops
_TORCH_NAMESPACES = frozenset({"aten", "prims", "ortmod", "higher_order", "_c10d_functional", "c10d", "profiler",
                               "_c10d_functional_autograd", "_dtensor", "quantized_decomposed", "onnx", "rngprims",
                               "debugprims", "inductor", "quantized", "_quantized", "_export", "mkldnn", "sparse"})


class _OpCall:
    """Stands where a Function class does in a python_op.FunctionSpec (subclassed per op)."""
    op = None

    @classmethod
    def apply(cls, *args):
        return cls.op(*args)


_OP_CALLS = {}


def _op_call_class(op):
    cls = _OP_CALLS.get(op)
    if cls is None:
        cls = _OP_CALLS[op] = type(str(op), (_OpCall,), {"op": op, "__module__": op.namespace,
                                                         "__qualname__": f"{op._opname}.{op._overloadname}"})
    return cls


def _library_op(func):
    """func as the OpOverload of a library's custom op, else None."""
    if isinstance(func, compat.OpOverloadPacket) and func.overloads() == ["default"]:
        func = func.default
    if isinstance(func, compat.OpOverload) and func.namespace not in _TORCH_NAMESPACES:
        return func
    return None


class _LibraryOpCalls(torch.overrides.TorchFunctionMode):
    """While torch.export traces: a call of a library's custom op becomes ortmod::python_op."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        op = _library_op(func)
        if op is None or getattr(_functions, "inside", 0) or getattr(_functions, "recorder", None) is None:
            return func(*args, **kwargs)
        if kwargs:
            raise UnsupportedModelError(f"the custom op {op} is called with keyword arguments; ortmod captures a "
                                        "custom op's positional arguments only")
        return _export_apply(_op_call_class(op), *args)


def _unpatched_apply(cls):
    """cls.apply as torch defines it, while ortmod's interception is in place."""
    if issubclass(cls, _OpCall):
        return cls.apply
    return functools.partial(compat.call_apply, _original_apply, cls)


@contextlib.contextmanager
def _intercepting_apply(recorder):
    """While torch.export traces: a user's Function.apply, and a library's custom op, become
    ortmod::python_op. With ``recorder.inline_all`` apply is left alone, and torch.export inlines
    every Function, as asked (a custom op stays an op, which the audit refuses by name)."""
    if recorder.inline_all:
        yield
        return
    with compat.patched_function_apply(_export_apply), _LibraryOpCalls():
        yield
