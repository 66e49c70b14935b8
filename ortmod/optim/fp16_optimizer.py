"""FP16_Optimizer: dynamic loss scaling for fp16/bf16 training around a torch optimizer.

    optimizer = FP16_Optimizer(FusedAdam(model.parameters(), lr=1e-4), clip_grad_norm=1.0)
    loss = model(x, y)
    optimizer.backward(loss)        # (loss * loss_scale).backward()
    optimizer.step()                # skipped (and the scale halved) if a gradient overflowed
    optimizer.zero_grad()

``step()`` reads every gradient once in C to find inf/NaN and the global L2 norm
together, then unscales and clips: with a :class:`FusedAdam` inside, the unscale/clip
factor rides on the Adam update itself (no extra pass, and fp32 master weights read the
fp16 model gradients directly); with any other torch optimizer one more C pass scales the
gradients (into the fp32 master gradients when there are masters).

Loss scale: starts at ``init_loss_scale`` (2**16), doubles after ``scale_window`` (2000)
consecutive finite steps, halves on overflow, never below ``min_loss_scale`` (1) nor above
``max_loss_scale`` (2**24). ``optimizer.loss_scale`` reads it; ``state_dict()`` keeps it.

As ORT's ``FP16_Optimizer``, wrapping an optimizer that DeepSpeed returned patches, in place,
what its step calls (overflow checks, gradient norm, unscale/clip) with the fused passes and
returns it, DeepSpeed's loss scaling unchanged (``_deepspeed.py``); a torch optimizer that a
DeepSpeed engine steps itself is returned unchanged, with a warning. An optimizer that
``apex.amp.initialize`` patched (it has ``_amp_stash``) keeps Apex's loss scaler: its
``_post_amp_backward`` and ``zero_grad`` are replaced in place by fused ones (``_apex.py``;
untested against real Apex). Any other object: a warning, and it is returned unchanged.
"""
import math
import warnings

import torch
from torch.utils.dlpack import to_dlpack

from .. import _C, _threads

_threads.share_torch_threads(_C)
from .fused_adam import FusedAdam, stream_of
from . import _apex, _deepspeed
from ._grads import _by_device, _c_able, _check_and_norm

__all__ = ["FP16_Optimizer"]

_HALF = (torch.float16, torch.bfloat16)


def _kind(optimizer):
    module = type(optimizer).__module__ or ""
    if module.startswith("deepspeed"):
        return "deepspeed"
    if isinstance(optimizer, torch.optim.Optimizer):
        return "apex" if module.startswith("apex") else "torch"
    return None


class FP16_Optimizer:
    """Wraps a torch optimizer with dynamic loss scaling (see the module docstring).

    Keyword arguments: ``init_loss_scale`` (2**16), ``scale_factor`` (2), ``scale_window``
    (2000), ``min_loss_scale`` (1), ``max_loss_scale`` (2**24), ``dynamic_loss_scale``
    (True; False keeps ``init_loss_scale``), ``clip_grad_norm`` (None: no clipping; else the
    max global L2 norm of the unscaled gradients), ``master_weights`` (True: fp16/bf16
    parameters get fp32 master copies that the inner optimizer updates).
    """

    def __new__(cls, optimizer, **kwargs):
        if _apex.is_apex_amp(optimizer):
            return _apex.modify(optimizer, kwargs)
        kind = _kind(optimizer)
        if kind is None:
            warnings.warn(f"FP16_Optimizer: {type(optimizer).__module__}.{type(optimizer).__qualname__} is neither a "
                          "torch, DeepSpeed nor Apex optimizer; it is returned unchanged (no loss scaling)",
                          UserWarning, stacklevel=2)
            return optimizer
        if kind == "deepspeed":
            return _deepspeed.modify(optimizer, kwargs)
        if kind == "torch":
            if _deepspeed.engine_of(optimizer) is not None:
                # fp32 without ZeRO: deepspeed.initialize hands back the client's optimizer and
                # engine.step() calls it directly; a loss scaler around it would never run
                warnings.warn(f"FP16_Optimizer: {type(optimizer).__module__}.{type(optimizer).__qualname__} is "
                              "stepped by a DeepSpeed engine (fp32 without ZeRO: DeepSpeed does no loss scaling "
                              "and engine.step() calls it directly); it is returned unchanged, since ortmod's "
                              "loss scaler around it would never be called", UserWarning, stacklevel=2)
                return optimizer
        return super().__new__(cls)

    def __init__(self, optimizer, *, init_loss_scale=2.0 ** 16, scale_factor=2.0, scale_window=2000,
                 min_loss_scale=1.0, max_loss_scale=2.0 ** 24, dynamic_loss_scale=True, clip_grad_norm=None,
                 master_weights=True):
        if not init_loss_scale > 0 or not scale_factor > 1 or scale_window < 1 or not min_loss_scale > 0:
            raise ValueError("FP16_Optimizer: need init_loss_scale > 0, scale_factor > 1, scale_window >= 1, "
                             "min_loss_scale > 0")
        if clip_grad_norm is not None and not clip_grad_norm > 0:
            raise ValueError(f"FP16_Optimizer: clip_grad_norm must be > 0 or None, got {clip_grad_norm}")
        self.optimizer = optimizer
        self.scale_factor = float(scale_factor)
        self.scale_window = int(scale_window)
        self.min_loss_scale = float(min_loss_scale)
        self.max_loss_scale = float(max_loss_scale)
        self.dynamic_loss_scale = bool(dynamic_loss_scale)
        self.clip_grad_norm = clip_grad_norm
        self._loss_scale = float(min(max(init_loss_scale, min_loss_scale), max_loss_scale))
        self._good_steps = 0           # consecutive finite steps since the last scale change
        self.overflow = False          # did the last step() skip?
        self.skipped_steps = 0
        self.last_grad_norm = None     # global L2 norm of the unscaled gradients, before clipping
        # (group index, index in group, model param, master or None), in param_groups order
        self._slots = []
        for gi, group in enumerate(optimizer.param_groups):
            for pi, p in enumerate(group["params"]):
                master = None
                if master_weights and p.dtype in _HALF:
                    master = p.detach().clone().to(torch.float32)
                    group["params"][pi] = master
                    if p in optimizer.state:   # move existing state onto the master
                        optimizer.state[master] = {k: (v.float() if torch.is_tensor(v) and v.is_floating_point()
                                                       and v.dim() > 0 else v)
                                                   for k, v in optimizer.state.pop(p).items()}
                self._slots.append((gi, pi, p, master))

    # ---- what users see ----------------------------------------------------------------
    @property
    def loss_scale(self):
        """The current loss scale."""
        return self._loss_scale

    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    def __getattr__(self, name):   # anything else: the inner optimizer's
        if name == "optimizer":
            raise AttributeError(name)
        return getattr(self.optimizer, name)

    def __repr__(self):
        return f"FP16_Optimizer(loss_scale={self._loss_scale}, optimizer={self.optimizer!r})"

    def backward(self, loss, retain_graph=False, create_graph=False):
        """Backward of loss * loss_scale (in fp32)."""
        (loss.float() * self._loss_scale).backward(retain_graph=retain_graph, create_graph=create_graph)

    def zero_grad(self, set_to_none=True):
        for _, _, p, master in self._slots:
            for t in (p, master):
                if t is None or t.grad is None:
                    continue
                if set_to_none:
                    t.grad = None
                else:
                    t.grad.detach_()
                    t.grad.zero_()

    @torch.no_grad()
    def step(self, closure=None):
        """Checks, unscales, clips, then steps the inner optimizer — or skips on overflow.
        Returns closure()'s loss if given (None when the step was skipped)."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        grads = []
        for _, _, p, _ in self._slots:
            if p.grad is not None:
                if p.grad.is_sparse:
                    raise RuntimeError("FP16_Optimizer does not support sparse gradients")
                grads.append(p.grad)
        scale = self._loss_scale
        found_inf, sq = _check_and_norm(grads, scale)
        self.overflow = found_inf
        if found_inf:
            self.skipped_steps += 1
            self._update_scale(overflow=True)
            self.last_grad_norm = math.inf
            return None
        norm = math.sqrt(sq)
        self.last_grad_norm = norm
        clip = 1.0
        if self.clip_grad_norm is not None and norm > self.clip_grad_norm:
            clip = self.clip_grad_norm / (norm + 1e-6)
        divisor = scale / clip            # every gradient is divided by this

        if isinstance(self.optimizer, FusedAdam):
            # the unscale/clip rides on the Adam update; masters read the model grads directly
            per_group = [list(g["params"]) for g in self.optimizer.param_groups]
            for gi, pi, p, master in self._slots:
                per_group[gi][pi] = p.grad
            self.optimizer.step(grad_scale=divisor, grads=per_group)
        else:
            self._unscale_into_inner(1.0 / divisor)
            self.optimizer.step()
        for _, _, p, master in self._slots:
            if master is not None and p.grad is not None:
                p.copy_(master)
        self._update_scale(overflow=False)
        return loss

    def _unscale_into_inner(self, factor):
        """Gradients of the inner optimizer's params = model grads * factor (one C pass)."""
        src, dst, inplace = [], [], []
        for _, _, p, master in self._slots:
            g = p.grad
            if master is None:
                if g is not None and factor != 1.0:
                    inplace.append(g)
                continue
            if g is None:
                master.grad = None
                continue
            if master.grad is None or master.grad.shape != master.shape or not master.grad.is_contiguous():
                master.grad = torch.empty_like(master, memory_format=torch.contiguous_format)
            src.append(g)
            dst.append(master.grad)
        c_pair = lambda s, d: _c_able(s) and _c_able(d) and s.device == d.device   # noqa: E731
        for device, pairs in _by_device([(s, d) for s, d in zip(src, dst) if c_pair(s, d)], key=lambda sd: sd[0]):
            _C.grads_copy_scaled([to_dlpack(s) for s, _ in pairs], [to_dlpack(d) for _, d in pairs], float(factor),
                                 stream_of(device))
        for s, d in zip(src, dst):
            if not c_pair(s, d):
                torch.mul(s, factor, out=d)
        for device, c_in in _by_device(g for g in inplace if _c_able(g)):
            _C.grads_scale(list(map(to_dlpack, c_in)), float(factor), stream_of(device))
        for g in inplace:
            if not _c_able(g):
                g.mul_(factor)

    def _update_scale(self, overflow):
        if not self.dynamic_loss_scale:
            return
        if overflow:
            self._loss_scale = max(self._loss_scale / self.scale_factor, self.min_loss_scale)
            self._good_steps = 0
        else:
            self._good_steps += 1
            if self._good_steps >= self.scale_window:
                self._loss_scale = min(self._loss_scale * self.scale_factor, self.max_loss_scale)
                self._good_steps = 0

    # ---- checkpoints -------------------------------------------------------------------
    def state_dict(self):
        return {
            "optimizer": self.optimizer.state_dict(),
            "loss_scaler": {"loss_scale": self._loss_scale, "good_steps": self._good_steps,
                            "scale_factor": self.scale_factor, "scale_window": self.scale_window,
                            "min_loss_scale": self.min_loss_scale, "max_loss_scale": self.max_loss_scale,
                            "dynamic_loss_scale": self.dynamic_loss_scale, "skipped_steps": self.skipped_steps},
            "fp32_master_params": [m.detach().clone() if m is not None else None for _, _, _, m in self._slots],
        }

    def load_state_dict(self, state_dict):
        """Loads what state_dict() saved. Everything is checked before anything is loaded: a
        state dict of another layout (other parameter shapes or counts) raises ValueError naming
        the parameter, where copying would broadcast a [1, 1] master weight into a [16, 12]
        parameter, silently."""
        masters = state_dict.get("fp32_master_params", [])
        if len(masters) != len(self._slots):
            raise ValueError(f"FP16_Optimizer.load_state_dict: {len(masters)} master entries for "
                             f"{len(self._slots)} parameters")
        for k, ((gi, pi, p, master), saved) in enumerate(zip(self._slots, masters)):
            where = f"parameter {k} (param_groups[{gi}]['params'][{pi}], {_shape(p)} {p.dtype})"
            if (master is None) != (saved is None):
                raise ValueError(f"FP16_Optimizer.load_state_dict: {where} "
                                 + ("has an fp32 master weight here but none in the state dict" if saved is None
                                    else "has no fp32 master weight here but one in the state dict"))
            if master is not None:
                if not torch.is_tensor(saved) or saved.shape != master.shape:
                    got = _shape(saved) if torch.is_tensor(saved) else type(saved).__name__
                    raise ValueError(f"FP16_Optimizer.load_state_dict: the master weight of {where} is {got} in the "
                                     "state dict (it was saved for another model or another parameter order)")
        self._check_inner_state(state_dict["optimizer"])
        self.optimizer.load_state_dict(state_dict["optimizer"])
        s = state_dict["loss_scaler"]
        self._loss_scale = float(s["loss_scale"])
        self._good_steps = int(s["good_steps"])
        self.scale_factor = float(s["scale_factor"])
        self.scale_window = int(s["scale_window"])
        self.min_loss_scale = float(s["min_loss_scale"])
        self.max_loss_scale = float(s["max_loss_scale"])
        self.dynamic_loss_scale = bool(s["dynamic_loss_scale"])
        self.skipped_steps = int(s.get("skipped_steps", 0))
        with torch.no_grad():
            for (_, _, p, master), saved in zip(self._slots, masters):
                if master is not None:
                    master.copy_(saved)
                    p.copy_(master)

    def _check_inner_state(self, inner):
        """The inner optimizer's per-parameter tensors (Adam's moments, ...) must have their
        parameter's shape: torch's load_state_dict checks only the group sizes."""
        groups = inner.get("param_groups", [])
        ours = self.optimizer.param_groups
        if len(groups) != len(ours) or any(len(g["params"]) != len(o["params"]) for g, o in zip(groups, ours)):
            return   # torch's own load_state_dict says what differs
        state = inner.get("state", {})
        for gi, (g, o) in enumerate(zip(groups, ours)):
            for pi, (key, param) in enumerate(zip(g["params"], o["params"])):
                for name, v in state.get(key, {}).items():
                    if torch.is_tensor(v) and v.dim() > 0 and v.shape != param.shape:
                        raise ValueError(f"FP16_Optimizer.load_state_dict: optimizer state '{name}' of "
                                         f"param_groups[{gi}]['params'][{pi}] ({_shape(param)}) is {_shape(v)} in "
                                         "the state dict (it was saved for another model or another parameter order)")


def _shape(t):
    return "[" + ", ".join(map(str, t.shape)) + "]"
