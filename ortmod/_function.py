"""The one torch.autograd.Function that runs the engine.

torch only *holds* tensors here: inputs go to the engine through DLPack (read in
place), outputs and gradients come back as DLPack capsules wrapped by
``torch._C._from_dlpack``. No torch op computes any part of the model.

The per-step path is kept short on purpose (a tiny model's step is mostly this file): the
capsule conversions are torch's C entry points, handed to the binding, which calls them per
tensor and builds the backward's result tuple itself (no Python loop per step); what does not
change between calls of one engine (devices, which outputs are differentiable) is worked out
once per CompiledCall; the Function is applied through torch's C ``apply`` when no functorch
transform is active (what ``Function.apply``'s Python wrapper would do then, less its
per-call argument walk), and its backward class's ``apply`` calls the backward directly.
"""
import contextlib
import itertools
import operator

import torch

from .capture import compat
from torch.autograd.function import once_differentiable
from torch.utils.dlpack import to_dlpack

from .capture import python_op as pyop


# A DLPack capsule of t's own storage. torch.utils.dlpack.to_dlpack takes tensors that
# require grad as they are (Tensor.__dlpack__ wants a detach() first, a new Python object per
# parameter per step: 14x slower for 50 parameters, and garbage for the GC). Bound to the name
# itself, not wrapped: it runs once per input per step.
_engine_view = to_dlpack
# torch.from_dlpack on a capsule calls exactly this, after a hasattr(__dlpack__) test.
_from_dlpack = compat.from_dlpack
# torch.autograd.Function.apply without its Python wrapper: with no functorch transform active
# the wrapper only unwraps dead functorch wrappers (done for the call's inputs in _entry.py's
# Entry.inputs: parameters are never such wrappers) and calls this.
_functorch_active = compat.functorch_transforms_active


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


class CompiledCall:
    """What the Function needs from a cache entry (passed as its first, non-tensor argument)."""

    __slots__ = ("engine", "output_differentiable", "n_inputs", "output_deps", "_reached", "_kept", "functions",
                 "cuda", "non_diff")

    def __init__(self, engine, output_differentiable, n_inputs, output_deps=None, functions=None):
        self.engine = engine
        # the FunctionRunner of the graph's PythonOp nodes (a user's autograd.Function), or None
        self.functions = functions
        self.output_differentiable = tuple(output_differentiable)
        self.n_inputs = n_inputs
        # per output: the input positions it depends on (None: unknown, keep every gradient)
        self.output_deps = output_deps
        self._reached = {}
        self._kept = {}
        # Set by the first forward (an engine's devices and output dtypes are those of its
        # export, fixed): whether it runs on CUDA (streams, dense gradients) or the CPU, and the
        # positions of the outputs that get no gradient.
        self.cuda = None
        self.non_diff = None

    def reached(self, present):
        """Input positions that a gradient reaches when only the outputs flagged in
        ``present`` have one (cached per pattern)."""
        r = self._reached.get(present)
        if r is None:
            r = frozenset().union(*(d for d, p in zip(self.output_deps, present) if p))
            self._reached[present] = r
        return r

    def kept(self, present):
        """Per input position: whether its gradient is handed back (``reached``), as a tuple."""
        k = self._kept.get(present)
        if k is None:
            r = self.reached(present)
            k = self._kept[present] = tuple(i in r for i in range(self.n_inputs))
        return k

    def learn(self, tensors, outputs):
        """What the first forward tells about every later one (see __init__)."""
        self.cuda = any(t.is_cuda for t in tensors)
        self.non_diff = tuple(j for j, (o, d) in enumerate(zip(outputs, self.output_differentiable))
                              if not d or not (o.is_floating_point() or o.is_complex()))


class EngineFunction(torch.autograd.Function):
    """forward: one engine.forward call; backward: one engine.backward call.

    The engine's stash (what backward needs from forward) lives on ``ctx``, so
    several forwards may run before their backwards: ``ctx.run`` is (call, stash, zero3,
    records), one attribute to set and read per step.
    """

    @staticmethod
    def forward(ctx, call, zero3, *tensors):
        # zero3: the manager of the module's sharded parameters, DeepSpeed ZeRO-3's (ortmod/_zero3.py)
        # or FSDP2's (ortmod/_fsdp2.py), or None
        if zero3 is not None:
            ctx.zero3_inputs = [(i, t) for i, t in enumerate(tensors) if id(t) in zero3.ids]
            # what keeps the storage the engine reads (and its stash reads again in backward)
            # alive until the backward ran, and the tensors the engine reads: see the managers' hold
            ctx.zero3_storage, tensors = zero3.hold(ctx.zero3_inputs, tensors)
        stream = _stream(tensors) if call.cuda is not False else None
        # the binding converts: to_dlpack per input, torch's from_dlpack per output (a tuple)
        if call.functions is None:       # no PythonOp nodes: no scope to hold their records
            records = None
            outputs, stash = call.engine.forward(tensors, True, stream, _engine_view, _from_dlpack)
        else:
            with _functions_of(call) as records:   # the user Functions' own autograd records, for backward
                outputs, stash = call.engine.forward(tensors, True, stream, _engine_view, _from_dlpack)
        if call.non_diff is None:
            call.learn(tensors, outputs)
        ctx.materialize_grads = False     # what ctx.set_materialize_grads(False) sets, less its frame
        ctx.run = (call, stash, zero3, records)
        if call.non_diff:
            ctx.mark_non_differentiable(*[outputs[j] for j in call.non_diff])
        return outputs

    @staticmethod
    def backward(ctx, *grad_outputs):
        # Outside create_graph=True the autograd engine runs backward with grad mode off, and
        # once_differentiable's wrapper would only add a no_grad scope and a test: it is needed
        # (to make a second differentiation an error) only when grad mode is on.
        if _grad_enabled():
            return _backward_once(ctx, *grad_outputs)
        return _backward(ctx, grad_outputs)


_grad_enabled = torch.is_grad_enabled
_is_not = operator.is_not
_NONES = itertools.repeat(None)     # map(_is_not, grads, _NONES): which gradients are given


def _backward(ctx, grad_outputs):
    call, stash, zero3, records = ctx.run
    if stash is None:
        return (None,) * (2 + call.n_inputs)
    if zero3 is not None:
        # autograd accumulates each gradient into .grad at the parameter's current shape, and
        # DeepSpeed's hooks then reduce it: the partitioned parameters are gathered again
        zero3.before_backward([t for _, t in ctx.zero3_inputs])
    if call.cuda:
        grads, convert = [None if g is None else _engine_view(_dense(g)) for g in grad_outputs], None
        stream = _stream(grad_outputs)
    else:
        grads, convert, stream = grad_outputs, _engine_view, None
    # An input that no output in the loss depends on (left out of the loss, or reached only
    # through a stop-gradient) gets no gradient (None), as in eager autograd, rather than the
    # engine's zeros: an optimizer treats the two differently. The binding builds the result:
    # (None, None) for call and zero3, then per input torch's tensor of its gradient, or None.
    keep = None if call.output_deps is None else call.kept(tuple(map(_is_not, grad_outputs, _NONES)))
    if call.functions is None:
        result = call.engine.backward(stash, grads, stream, convert, _from_dlpack, keep, 2)
    else:
        with _functions_of(call, records):
            result = call.engine.backward(stash, grads, stream, convert, _from_dlpack, keep, 2)
    if zero3 is not None:
        ctx.zero3_storage = None         # the forward's gathered storage: no longer read
        zero3.after_backward([t for i, t in ctx.zero3_inputs if result[2 + i] is None])
    return result


@once_differentiable
def _backward_once(ctx, *grad_outputs):
    return _backward(ctx, grad_outputs)


# What torch's BackwardCFunction.apply does for EngineFunction (no vjp, no boxed grads: its
# backward with these arguments), less its two frames; the autograd engine calls it per step
# with the ctx as self.
EngineFunction._backward_cls.apply = EngineFunction.backward


# EngineFunction.apply less its Python wrapper (see _functorch_active above)
_apply = compat.engine_function_apply(EngineFunction)


@contextlib.contextmanager
def _functions_of(call, records=None, training=True):
    """Around one engine call of a graph with PythonOp nodes: the scope that holds their records,
    and the user's own exception (not the engine's report of it) when one of them raised."""
    if call.functions is None:
        yield None
        return
    try:
        with pyop.call_scope(records, training) as scope:
            yield scope
    except Exception as e:
        raised = call.functions.take_error()
        if raised is None:
            raise
        raise raised from e


def run_training(call, tensors, zero3=None):
    """Forward with autograd history; returns the engine outputs as torch tensors."""
    if _functorch_active():          # the wrapper's own path (custom_function_call, or its error)
        return EngineFunction.apply(call, zero3, *tensors)
    return _apply(call, zero3, *tensors)


def run_inference(call, tensors):
    """Forward-only (eval or no_grad): plain tensors, no autograd history, no stash."""
    stream = _stream(tensors) if call.cuda is not False else None
    if call.functions is None:       # no PythonOp nodes: no scope (a generator's frames per call)
        outputs, _ = call.engine.forward(tensors, False, stream, _engine_view, _from_dlpack)
    else:
        with _functions_of(call, training=False):
            outputs, _ = call.engine.forward(tensors, False, stream, _engine_view, _from_dlpack)
    if call.cuda is None:
        call.cuda = any(t.is_cuda for t in tensors)
    return outputs
