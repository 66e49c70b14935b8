"""ORTModule over FSDP2: ``ORTModule(fully_shard(model))``, the blocks and the model sharded.

FSDP2 keeps each parameter as a DTensor shard registered on its module and swaps in a plain,
unsharded parameter (all-gathered) in the forward pre-hook of the module it was applied to,
swapping the shard back in its post-hook; hooks on the outputs gather again for backward, and
after backward each parameter group reduce-scatters the unsharded gradients into the shards'
``.grad``. The engine runs the whole model as one graph and never calls the submodules, so
those hooks never fire. ORTModule does what they do, for all groups at once, with FSDP's own
API (``FSDPModule.unshard()/reshard()``; what has no public entry goes through capture/compat):

- forward: the roots' pre-forward (lazy init, stream waits), then every FSDPModule
  ``unshard()``: the engine reads the unsharded parameters (the same nn.Parameter objects on
  every call: FSDP allocates them once and frees only their storage).
- after forward: ``reshard()`` unless an engine forward's backward is still to come. FSDP frees
  an unsharded parameter by resizing its storage to 0, in place: the engine's stash holds the
  parameters it read by pointer and reads them again in backward, so they stay unsharded until
  that backward ran (FSDP's root does the same: it does not reshard after forward; here every
  group is the root's, peak memory = the unsharded model, as under ZeRO-3 here). Inference
  forwards (no backward to come) reshard at once.
- backward: the engine's gradients go to the unsharded parameters through autograd (their
  ``.grad``, as eager's AccumulateGrad); at the end of the backward pass (an autograd engine
  callback, as FSDP queues its own) FSDP's end-of-backward callback runs each group's
  post-backward: reduce-scatter into the DTensor shards' ``.grad``, reshard, finalize. Where
  another forward's backward is still to come, the groups' reshard waits for it.
- export: FSDP's forward hooks are taken off the modules while the trace runs them (they would
  gather, register autograd Functions on the inputs and reshard inside the trace).
- prefetch: all groups are gathered at once before the engine runs (no overlap of the
  all-gathers with compute: the engine needs every parameter of the graph at its start).

Refused by name: fully_shard(ORTModule(model)) (_module.py), parameters on an accelerator (not
run there yet), mixed precision policies, CPU offload, HSDP (a 2-d mesh), several modules
sharded as one group, DTensor parameters that fully_shard did not make.
"""
import contextlib
import operator
import sys
import weakref


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


class _Pending:
    """Held by an engine forward until its backward ran (or it was dropped): while one lives the
    unsharded parameters stay allocated, since its stash reads them."""
    __slots__ = ("__weakref__",)


class Fsdp2:
    """The FSDPModules of one ORTModule's model, gathered around the engine's calls."""

    def __init__(self, sharded):
        self.names = [name for name, _ in sharded]
        self.modules = [m for _, m in sharded]
        self.states = [compat.fsdp2_state(m) for m in self.modules]
        self.groups = [g for state in self.states for g in compat.fsdp2_param_groups(state)]
        for name, m, state in zip(self.names, self.modules, self.states):
            _refuse_unsupported(name, compat.fsdp2_param_groups(state))
        self.ids = frozenset()        # (EngineFunction: no parameter to gather again for backward)
        self._pending = weakref.WeakSet()
        self._queued = False
        self._unsharded = None        # the unsharded parameters the last gather registered

    # -- forward -----------------------------------------------------------------
    def gather(self):
        """Every FSDPModule unsharded: the model's parameters are plain tensors now. False where
        FSDP registered other unsharded parameter objects than the last gather's (scan again)."""
        if not self._pending:
            self._reshard()           # unsharded values from before an optimizer step: stale
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
        return same

    def release(self):
        """After an engine call: resharded unless a forward's backward is still to come."""
        if not self._pending:
            self._reshard()

    def _reshard(self):
        for m in self.modules:
            m.reshard()

    # -- EngineFunction's protocol (as _zero3.Zero3's) -----------------------------
    def hold(self, inputs):
        """Kept on the forward's ctx until its backward ran."""
        pending = _Pending()
        self._pending.add(pending)
        return pending

    def before_backward(self, params):
        """Nothing to gather: the parameters stayed unsharded since the forward (see release).
        Something that resharded them meanwhile (state_dict(), which FSDP's pre-hook reshards
        for, or reshard()) freed the storage the engine's stash reads: an error, not a read of
        freed memory."""
        resharded = [g for g in self.groups if not g.is_unsharded]
        if resharded:
            raise RuntimeError(
                f"{_PREFIX}: the parameters were resharded between the forward and its backward (by "
                "state_dict() or reshard()?): the engine's backward reads the unsharded parameters its forward "
                "read, which FSDP freed. Save or reshard after the backward")

    def after_backward(self, without_grad):
        """The engine's backward ran (its ctx dropped its _Pending); autograd accumulates the
        gradients it returned into the unsharded parameters' .grad after this returns: the
        reduce-scatter runs at the end of the backward pass."""
        if not self._queued:
            self._queued = True
            compat.queue_backward_callback(self._end_of_backward)

    def _end_of_backward(self):
        self._queued = False
        keep = bool(self._pending)    # another forward's stash still reads the unsharded storage
        saved = [g.reshard_after_backward for g in self.groups]
        if keep:
            for g in self.groups:
                g.reshard_after_backward = False
        try:
            for state in self.states:
                if compat.fsdp2_is_root(state):
                    compat.fsdp2_post_backward_final(state)
        finally:
            for g, flag in zip(self.groups, saved):
                g.reshard_after_backward = flag

    # -- export ------------------------------------------------------------------
    @contextlib.contextmanager
    def hooks_off(self, module):
        """FSDP's forward (pre-)hooks off every submodule while the trace runs them, and its
        state_dict pre-hook (which reshards; the TorchScript tracer reads the state dict)."""
        saved = []
        for m in module.modules():
            for attr in ("_forward_pre_hooks", "_forward_hooks", "_state_dict_pre_hooks"):
                hooks = getattr(m, attr)
                fsdp = [k for k, h in hooks.items() if _is_fsdp(h)]
                if fsdp:
                    saved.append((hooks, dict(hooks)))
                    for k in fsdp:
                        del hooks[k]
        try:
            yield
        finally:
            for hooks, before in saved:
                hooks.clear()
                hooks.update(before)


def _is_fsdp(hook):
    f = getattr(hook, "__func__", hook)
    while hasattr(f, "__wrapped__"):
        f = f.__wrapped__
    f = getattr(f, "__func__", f)
    return (getattr(f, "__module__", None) or "").startswith("torch.distributed.fsdp.")


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
