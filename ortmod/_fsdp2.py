"""ORTModule over FSDP2: ``ORTModule(fully_shard(model))``, the blocks and the model sharded.

FSDP2 keeps each parameter as a DTensor shard registered on its module and swaps in a plain,
unsharded parameter (all-gathered) in the forward pre-hook of the module it was applied to,
swapping the shard back in its post-hook; hooks on the outputs gather again for backward, and
after backward each parameter group reduce-scatters the unsharded gradients into the shards'
``.grad``. The engine runs the whole model as one graph and never calls the submodules, so
those hooks never fire. ORTModule does what they do, for all groups at once, with FSDP's own
API (``FSDPModule.unshard()/reshard()``; what has no public entry goes through capture/compat):

- forward: the roots' pre-forward (lazy init, stream waits), then every FSDPModule
  ``unshard()``, freshly all-gathered: the engine reads the unsharded parameters (the same
  nn.Parameter objects on every call: FSDP allocates them once and frees only their storage).
- after forward: ``reshard()``, as FSDP does after each module's forward. FSDP frees an
  unsharded parameter by resizing its storage to 0, in place (every alias loses it too), and
  the engine's stash reads the parameters its forward read again in backward: in training the
  engine reads a copy of each unsharded parameter, which the stash keeps until the backward ran
  (memory: one unsharded copy of the model per forward awaiting its backward, where eager FSDP
  gathers each block again in backward; the gradients still go to the unsharded parameters).
- backward: the engine's gradients reach the unsharded parameters' ``.grad`` through autograd
  (as eager's AccumulateGrad); at the end of the backward pass (an autograd engine callback, as
  FSDP queues its own) FSDP's end-of-backward callback runs each group's post-backward:
  reduce-scatter into the DTensor shards' ``.grad`` (or, without gradient sync, accumulation
  unsharded), then finalization.
- export: FSDP's forward hooks are taken off the modules while the trace runs them (they would
  gather, register autograd Functions on the inputs and reshard inside the trace).
- prefetch: all groups are gathered at once before the engine runs (no overlap of the
  all-gathers with compute: the engine needs every parameter of the graph at its start).

Refused by name: fully_shard(ORTModule(model)) (_module.py), parameters on an accelerator (not
run there yet), mixed precision policies, CPU offload, HSDP (a 2-d mesh), several modules
sharded as one group, DTensor parameters that fully_shard did not make.
"""
import operator
import sys

from ._hooks import hooks_removed
from .capture import compat, errors

_PREFIX = "ortmod: FSDP2 (torch.distributed.fsdp.fully_shard) under ORTModule"


def sharded_modules(module):
    """(name, FSDPModule) for module and each submodule that fully_shard was applied to, pre-order."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    cls = getattr(fsdp, "FSDPModule", None)
    if cls is None:                      # not imported: no FSDPModule exists
        return []
    return [(name or type(module).__name__, m) for name, m in module.named_modules() if isinstance(m, cls)]


def refuse_dtensors(params):
    """DTensor parameters that fully_shard did not make (tensor parallelism, distribute_tensor)."""
    dtensor = getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)
    if dtensor is not None and any(isinstance(p, dtensor) for p in params):
        raise errors.UnsupportedModelError(
            "ortmod: the model holds DTensor parameters that fully_shard did not make (tensor parallelism, "
            "distribute_tensor): the engine reads plain tensors. FSDP2 is supported as ORTModule(fully_shard(model))")


class Fsdp2:
    """The FSDPModules of one ORTModule's model, gathered around the engine's calls."""

    def __init__(self, sharded):
        self.names = [name for name, _ in sharded]
        self.modules = [m for _, m in sharded]
        self.states = [compat.fsdp2_state(m) for m in self.modules]
        self.groups = [g for state in self.states for g in compat.fsdp2_param_groups(state)]
        for name, state in zip(self.names, self.states):
            _refuse_unsupported(name, compat.fsdp2_param_groups(state))
        self.ids = frozenset()        # id() of the unsharded parameters (EngineFunction's hold)
        self._queued = False
        self._unsharded = None        # the unsharded parameters the last gather registered

    # -- forward -----------------------------------------------------------------
    def gather(self):
        """Every FSDPModule unsharded, freshly all-gathered: the model's parameters are plain
        tensors now. False where FSDP registered other unsharded parameter objects than the last
        gather's (the caller scans the state again)."""
        self._reshard()               # (unsharded values from before an optimizer step: stale)
        for m, state in zip(self.modules, self.states):
            # pre-order: a root's lazy init marks the states under it as not roots
            if compat.fsdp2_is_root(state) is not False:
                compat.fsdp2_root_pre_forward(state, m)
        for m in self.modules:
            m.unshard()
        now = tuple(fp.unsharded_param for g in self.groups for fp in g.fsdp_params)
        same = self._unsharded is not None and len(now) == len(self._unsharded) and \
            all(map(operator.is_, now, self._unsharded))
        self._unsharded = now
        self.ids = frozenset(map(id, now))
        return same

    def release(self):
        """After the engine's forward: every FSDPModule resharded (the stash holds its copy)."""
        self._reshard()

    def _reshard(self):
        for m in self.modules:
            m.reshard()

    # -- EngineFunction's protocol (as _zero3.Zero3's) -----------------------------
    def hold(self, inputs, tensors):
        """(the copies the engine reads for the unsharded parameters among tensors, the tensors
        it reads). FSDP frees an unsharded parameter by resizing its storage to 0 in place (every
        alias loses it), and the engine's stash reads the parameters it read again in backward:
        the engine reads a copy, which the stash keeps until the backward ran. The gradients
        still go to the unsharded parameters (the autograd inputs)."""
        copies = [t.detach().clone() for _, t in inputs]
        read = list(tensors)
        for (i, _), copy in zip(inputs, copies):
            read[i] = copy
        return copies, tuple(read)

    def before_backward(self, params):
        """Nothing to gather: the engine reads its copies."""

    def after_backward(self, without_grad):
        """The engine's backward ran; autograd accumulates the gradients it returned into the
        unsharded parameters' .grad after this returns: FSDP's post-backward (reduce-scatter into
        the DTensor shards' .grad) runs at the end of the backward pass."""
        if not self._queued:
            self._queued = True
            compat.queue_backward_callback(self._end_of_backward)

    def _end_of_backward(self):
        self._queued = False
        for state in self.states:
            if compat.fsdp2_is_root(state):
                compat.fsdp2_post_backward_final(state)

    # -- export ------------------------------------------------------------------
    def hooks_off(self, module):
        """FSDP's forward (pre-)hooks off every submodule while the trace runs them, and its
        state_dict pre-hook (which reshards; the TorchScript tracer reads the state dict)."""
        return hooks_removed(module, ("_forward_pre_hooks", "_forward_hooks", "_state_dict_pre_hooks"),
                             "torch.distributed.fsdp.")


def _refuse_unsupported(name, groups):
    from torch.distributed.fsdp import CPUOffloadPolicy
    for g in groups:
        if g.device.type != "cpu":
            # the stream order (all-gather and reduce-scatter streams against the engine's) is
            # FSDP's own and should hold, but no run on an accelerator has checked it yet
            raise errors.UnsupportedModelError(
                f"{_PREFIX}: parameters on {g.device.type} (at {name}) are not supported yet: ortmod runs FSDP2 on "
                "the CPU (gloo) only; on CUDA use DistributedDataParallel(ORTModule(model)) or DeepSpeed ZeRO 1-3")
        if len(g.modules) > 1:
            raise errors.UnsupportedModelError(
                f"{_PREFIX}: several modules sharded as one group (fully_shard([...]) at {name}) are not "
                "supported: apply fully_shard to each module")
        mp = g.mp_policy
        if mp.param_dtype is not None or mp.reduce_dtype is not None or mp.output_dtype is not None:
            raise errors.UnsupportedModelError(
                f"{_PREFIX}: a mixed precision policy ({mp} at {name}) is not supported: the engine computes "
                "in the parameters' dtype; shard without mp_policy")
        if isinstance(g.offload_policy, CPUOffloadPolicy):
            raise errors.UnsupportedModelError(
                f"{_PREFIX}: CPU offload (offload_policy=CPUOffloadPolicy() at {name}) is not supported")
        for fp in g.fsdp_params:
            mesh = getattr(fp.sharded_param, "device_mesh", None)
            if mesh is not None and mesh.ndim != 1:
                raise errors.UnsupportedModelError(
                    f"{_PREFIX}: HSDP (a {mesh.ndim}-d device mesh at {name}) is not supported: shard over a 1-d "
                    "mesh")
