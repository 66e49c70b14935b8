"""The one torch.autograd.Function that runs the engine.

torch only *holds* tensors here: inputs go to the engine through DLPack (read in
place), outputs and gradients come back as DLPack capsules wrapped by
``torch.from_dlpack``. No torch op computes any part of the model.
"""
import contextlib

import torch
from torch.autograd.function import once_differentiable
from torch.utils.dlpack import to_dlpack

from . import _pyop


# A DLPack capsule of t's own storage. torch.utils.dlpack.to_dlpack takes tensors that
# require grad as they are (Tensor.__dlpack__ wants a detach() first, a new Python object per
# parameter per step: 14x slower for 50 parameters, and garbage for the GC). Bound to the name
# itself, not wrapped: it runs once per input per step.
_engine_view = to_dlpack


def _dense(g):
    # Gradients torch hands back may be strided views (the expanded ones of a .sum() loss);
    # the binding copies strided CPU tensors itself, CUDA ones must arrive dense.
    return g.contiguous() if g.is_cuda and not g.is_contiguous() else g


def _stream(tensors):
    # CUDA inputs: the engine enqueues on torch's current stream (no synchronization needed)
    for t in tensors:
        if t is not None:
            return torch.cuda.current_stream(t.device).cuda_stream if t.is_cuda else None
    return None


def _wrap(capsule):
    return None if capsule is None else torch.from_dlpack(capsule)


class CompiledCall:
    """What the Function needs from a cache entry (passed as its first, non-tensor argument)."""

    __slots__ = ("engine", "output_differentiable", "n_inputs", "output_deps", "_reached", "functions")

    def __init__(self, engine, output_differentiable, n_inputs, output_deps=None, functions=None):
        self.engine = engine
        # the FunctionRunner of the graph's PythonOp nodes (a user's autograd.Function), or None
        self.functions = functions
        self.output_differentiable = tuple(output_differentiable)
        self.n_inputs = n_inputs
        # per output: the input positions it depends on (None: unknown, keep every gradient)
        self.output_deps = output_deps
        self._reached = {}

    def reached(self, present):
        """Input positions that a gradient reaches when only the outputs flagged in
        ``present`` have one (cached per pattern)."""
        r = self._reached.get(present)
        if r is None:
            r = frozenset().union(*(d for d, p in zip(self.output_deps, present) if p))
            self._reached[present] = r
        return r


class EngineFunction(torch.autograd.Function):
    """forward: one engine.forward call; backward: one engine.backward call.

    The engine's stash (what backward needs from forward) lives on ``ctx``, so
    several forwards may run before their backwards.
    """

    @staticmethod
    def forward(ctx, call, zero3, *tensors):
        # zero3: the module's DeepSpeed ZeRO-3 parameters (ortmod/_zero3.py), or None
        ctx.zero3 = zero3
        if zero3 is not None:
            ctx.zero3_inputs = [(i, t) for i, t in enumerate(tensors) if id(t) in zero3.ids]
        views = [_engine_view(t) for t in tensors]
        if call.functions is None:       # no PythonOp nodes: no scope to hold their records
            records = None
            capsules, stash = call.engine.forward(views, True, _stream(tensors))
        else:
            with _functions_of(call) as records:
                capsules, stash = call.engine.forward(views, True, _stream(tensors))
        ctx.records = records            # the user Functions' own autograd records, for backward
        outputs = tuple(torch.from_dlpack(c) for c in capsules)
        ctx.set_materialize_grads(False)
        ctx.call = call
        ctx.stash = stash
        non_diff = [o for o, d in zip(outputs, call.output_differentiable)
                    if not d or not (o.is_floating_point() or o.is_complex())]
        if non_diff:
            ctx.mark_non_differentiable(*non_diff)
        return outputs

    @staticmethod
    @once_differentiable
    def backward(ctx, *grad_outputs):
        call = ctx.call
        if ctx.stash is None:
            return (None,) * (2 + call.n_inputs)
        zero3 = ctx.zero3
        if zero3 is not None:
            # autograd accumulates each gradient into .grad at the parameter's current shape, and
            # DeepSpeed's hooks then reduce it: the partitioned parameters are gathered again
            zero3.before_backward([t for _, t in ctx.zero3_inputs])
        views = [None if g is None else _engine_view(_dense(g)) for g in grad_outputs]
        if call.functions is None:
            grads = call.engine.backward(ctx.stash, views, _stream(grad_outputs))
        else:
            with _functions_of(call, ctx.records):
                grads = call.engine.backward(ctx.stash, views, _stream(grad_outputs))
        if call.output_deps is not None:
            # An input that no output in the loss depends on (left out of the loss, or reached
            # only through a stop-gradient) gets no gradient (None), as in eager autograd,
            # rather than the engine's zeros: an optimizer treats the two differently.
            reached = call.reached(tuple(g is not None for g in grad_outputs))
            result = tuple(_wrap(g) if i in reached else None for i, g in enumerate(grads))
        else:
            result = tuple(_wrap(g) for g in grads)
        if zero3 is not None:
            zero3.after_backward([t for i, t in ctx.zero3_inputs if result[i] is None])
        return (None, None) + result


@contextlib.contextmanager
def _functions_of(call, records=None, training=True):
    """Around one engine call of a graph with PythonOp nodes: the scope that holds their records,
    and the user's own exception (not the engine's report of it) when one of them raised."""
    if call.functions is None:
        yield None
        return
    try:
        with _pyop.call_scope(records, training) as scope:
            yield scope
    except Exception as e:
        raised = call.functions.take_error()
        if raised is None:
            raise
        raise raised from e


def run_training(call, tensors, zero3=None):
    """Forward with autograd history; returns the engine outputs as torch tensors."""
    return EngineFunction.apply(call, zero3, *tensors)


def run_inference(call, tensors):
    """Forward-only (eval or no_grad): plain tensors, no autograd history, no stash."""
    with _functions_of(call, training=False):
        capsules, _ = call.engine.forward([_engine_view(t) for t in tensors], False, _stream(tensors))
    return tuple(torch.from_dlpack(c) for c in capsules)
