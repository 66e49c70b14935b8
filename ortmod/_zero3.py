"""ORTModule under DeepSpeed ZeRO-3: gather the partitioned parameters around each engine call.

ZeRO-3 keeps each parameter partitioned (``param.data`` is an empty tensor, the rank's shard
is ``param.ds_tensor``) and gathers it in forward pre-hooks of the submodule that owns it,
releasing it after that submodule ran; its backward hooks gather it again for the submodule's
backward. The engine runs the whole module as one graph and never calls the submodules, so
those hooks never fire. ORTModule does what they would, for all its parameters at once (the
whole module is the "submodule"), with DeepSpeed's own parameter API (``all_gather`` /
``partition`` of ``deepspeed.zero.Init`` parameters, as ``GatheredParameters`` uses it):

- forward: every partitioned parameter is gathered before the engine reads it and released
  after the forward. The engine's stash keeps the gathered storage that forward read alive
  until backward (ZeRO-3 frees between forward and backward; here that memory stays held).
- backward: the parameters are gathered again before the gradients are handed to autograd,
  since torch accumulates a gradient into ``.grad`` with the parameter's current shape, and
  DeepSpeed's gradient hooks (``register_post_accumulate_grad_hook``, registered by
  ``DeepSpeedZeroOptimizer_Stage3``) then reduce it into the partitioned gradient buffers as
  for an eager module. A hook of ortmod's, registered after DeepSpeed's, releases each
  parameter once its gradient was taken; one without a gradient is released at once.
- export: the trace runs the submodules' forwards, so DeepSpeed's module hooks (fetch/release
  and the autograd Functions they wrap around outputs, which would become graph nodes) are
  taken off the submodules while it runs; the parameters are gathered then, as for a forward.
- ``torch.nn.functional.linear``: ZeRO-3 replaces it, process-wide and for good (its
  ``memory_efficient_linear``, on by default), with ``LinearFunctionForZeroStage3``, an
  autograd.Function that saves the parameter rather than its gathered value. Traced, it would
  become a PythonOp whose math torch computes; its forward is ``F.linear``'s, so every export
  (ZeRO-3 or not, once any ZeRO-3 engine exists in the process) traces torch's own.

Persistent parameters (``ds_persist``: DeepSpeed keeps small ones gathered) are gathered when
they are not, and never released, as DeepSpeed does.
"""
import contextlib
import sys

import torch

from ._hooks import hooks_removed
from .capture import compat


def _status(name):
    mod = sys.modules.get("deepspeed.runtime.zero.partition_parameters")
    return getattr(mod.ZeroParamStatus, name) if mod is not None else None


def partitioned_params(params):
    """The ZeRO-3 parameters among params (``deepspeed.zero.Init`` gives them these)."""
    return [p for p in params if hasattr(p, "ds_status") and hasattr(p, "ds_tensor") and hasattr(p, "all_gather")]


class Zero3:
    """The partitioned parameters of one ORTModule's state, and who gathered which."""

    def __init__(self, params):
        self.params = params
        self.ids = frozenset(id(p) for p in params)
        self.not_available = _status("NOT_AVAILABLE")
        self.available = _status("AVAILABLE")
        if self.not_available is None:
            raise RuntimeError("ortmod: the module's parameters are DeepSpeed ZeRO-3 parameters, but "
                               "deepspeed.runtime.zero.partition_parameters is not imported")
        self._awaiting_grad = {}          # id(param) -> param, gathered for a backward
        for p in params:
            if not getattr(p, "_ortmod_zero3_hook", False) and p.requires_grad:
                p.register_post_accumulate_grad_hook(self._after_grad)
                p._ortmod_zero3_hook = True

    def gather(self, params=None):
        """Gathers those of params (default: all) that are partitioned now; returns them (release
        them later)."""
        todo = [p for p in (self.params if params is None else params) if p.ds_status == self.not_available]
        if todo:
            todo[0].all_gather(param_list=todo)
        return todo

    def release(self, gathered):
        todo = [p for p in gathered if p.ds_status == self.available and not getattr(p, "ds_persist", False)
                and not p.ds_active_sub_modules]
        if todo:
            todo[0].partition(param_list=todo)

    def hold(self, inputs, tensors):
        """(what EngineFunction keeps until the backward ran, the tensors the engine reads: the
        call's own). ZeRO-3 releases a gathered parameter by assigning param.data, which frees the
        storage the engine read in place and its stash reads again in backward (a DLPack capsule
        holds the tensor, whose storage that swaps, not the storage): aliases of the gathered
        storage are kept (with world size > 1 the backward read freed memory without them: NaN
        gradients). inputs: the (index, parameter) pairs among tensors."""
        return [t.detach() for _, t in inputs], tensors

    # -- backward ----------------------------------------------------------------
    def before_backward(self, params):
        """params: the graph's inputs among the partitioned parameters (a parameter the export
        left out of the graph gets no gradient and is not gathered)."""
        for p in self.gather(params):
            self._awaiting_grad[id(p)] = p

    def after_backward(self, without_grad):
        """The engine's backward ran; params in without_grad get no gradient: release them now."""
        done = [self._awaiting_grad.pop(id(p)) for p in without_grad if id(p) in self._awaiting_grad]
        self.release(done)

    def _after_grad(self, param):
        # after DeepSpeed's own hook (registered first) reduced the gradient into its partition
        p = self._awaiting_grad.pop(id(param), None)
        if p is not None:
            self.release([p])

    # -- export ------------------------------------------------------------------
    def hooks_off(self, module):
        """DeepSpeed's forward (pre-)hooks off every submodule while the trace runs them."""
        return hooks_removed(module, ("_forward_pre_hooks", "_forward_hooks"), "deepspeed.")


@contextlib.contextmanager
def plain_linear():
    """torch's own F.linear while the export traces, where DeepSpeed's zero3_linear_wrap replaced it."""
    F = torch.nn.functional
    current = F.linear
    ds_linear = sys.modules.get("deepspeed.runtime.zero.linear")
    if ds_linear is None or current is not getattr(ds_linear, "zero3_linear_wrap", None):
        yield
        return
    pp = sys.modules.get("deepspeed.runtime.zero.partition_parameters")
    original = getattr(getattr(pp, "InsertPostInitMethodToModuleSubClasses", None), "linear_bk", None) \
        or compat.nn_linear
    F.linear = original
    try:
        yield
    finally:
        F.linear = current
