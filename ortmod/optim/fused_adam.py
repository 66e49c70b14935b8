"""FusedAdam: Adam/AdamW whose whole update runs in one C call per parameter group.

    from ortmod.optim import FusedAdam, AdamWMode
    opt = FusedAdam(model.parameters(), lr=1e-4, weight_decay=0.01, adam_w_mode=AdamWMode.ADAMW_TORCH)

The three update rules are ORT's (``onnxruntime.training.optim.FusedAdam``); with
bc1 = 1 - beta1^t, bc2 = 1 - beta2^t (1 when bias_correction is off), t the group's step:

- ``ADAM_L2_REGULARIZATION`` (0): g += wd p; m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
  p -= lr sqrt(bc2)/bc1 m / (sqrt(v) + eps)
- ``ADAMW_TRANSFORMERS`` (1): m, v from the raw g; the same update; then p -= lr wd p
- ``ADAMW_TORCH`` (2): p -= lr wd p; m, v as above; p -= lr m / (bc1 (sqrt(v)/sqrt(bc2) + eps)),
  which is ``torch.optim.AdamW`` (and follows its order of operations)

Every tensor of a group is updated by one engine call (multi-tensor, threaded and
vectorized C, GIL released), reading and writing torch's storage in place through
DLPack. Parameters may be float32, float16 or bfloat16 (math in fp32, moments kept in
fp32); ORT's needs a GPU and refuses bf16, this one does neither. CUDA parameters take the
CUDA provider's multi-tensor kernel (one call per group and device, enqueued on the device's
current stream: no synchronization).
"""
import enum
import math

import torch
from torch.utils.dlpack import to_dlpack

from .. import _C, _threads
from .._options import options

_threads.share_torch_threads(_C)

__all__ = ["AdamWMode", "FusedAdam"]

_PARAM_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class AdamWMode(enum.IntEnum):
    """Where weight decay enters the update (values match ORT's and the C API's om_adam_mode)."""
    ADAM_L2_REGULARIZATION = 0   # added to the gradient before the moments
    ADAMW_TRANSFORMERS = 1       # decoupled, after the update (Hugging Face transformers' AdamW)
    ADAMW_TORCH = 2              # decoupled, before the update (torch.optim.AdamW)


def _dense(t):
    return t if t.is_contiguous() else t.contiguous()


def stream_of(device):
    """The int torch's current stream on device is (0 for the CPU): where CUDA work is enqueued."""
    return torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else 0


class FusedAdam(torch.optim.Optimizer):
    """Adam with ORT's three weight-decay modes, one C call per parameter group per step.

    Args mirror ORT's FusedAdam. Each parameter group may override lr, betas, eps,
    weight_decay, bias_correction and adam_w_mode. ``set_grad_none``: what ``zero_grad()``
    does when not told (True: grads become None; False: zero-filled).

    Extra arguments to :meth:`step` (used by :class:`FP16_Optimizer`): ``grad_scale`` divides
    every gradient on the fly (loss scale / clip coefficient, no extra pass), and ``grads``
    (one list per group, aligned with ``group["params"]``, None entries skipped) replaces
    ``p.grad`` — e.g. fp16 model gradients for fp32 master weights.
    """

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-6,
                 adam_w_mode=AdamWMode.ADAMW_TRANSFORMERS, weight_decay=0.0, set_grad_none=True):
        _check_hparams(lr, betas, eps, weight_decay, adam_w_mode)
        options.optim_num_threads   # a bad ORTMOD_NUM_THREADS: a ValueError naming it, now rather than at step()
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=tuple(betas), eps=eps,
                        weight_decay=weight_decay, adam_w_mode=int(AdamWMode(adam_w_mode)))
        # (a plain int in param_groups, so state_dict() loads with torch.load(weights_only=True))
        super().__init__(params, defaults)
        self.adam_w_mode = AdamWMode(adam_w_mode)
        self.set_grad_none = set_grad_none

    def zero_grad(self, set_to_none=None):
        super().zero_grad(set_to_none=self.set_grad_none if set_to_none is None else set_to_none)

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        # torch casts floating state to each parameter's dtype; the moments stay fp32.
        for state in self.state.values():
            for key in ("exp_avg", "exp_avg_sq"):
                if key in state and isinstance(state[key], torch.Tensor):
                    state[key] = _dense(state[key].to(torch.float32))

    def _init_state(self, p):
        state = self.state[p]
        if "exp_avg" not in state:
            state["exp_avg"] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
            state["exp_avg_sq"] = torch.zeros(p.shape, dtype=torch.float32, device=p.device)
        return state

    @torch.no_grad()
    def step(self, closure=None, *, grad_scale=1.0, grads=None):
        """One update of every parameter that has a gradient. Returns closure()'s loss, if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        if grads is not None and len(grads) != len(self.param_groups):
            raise ValueError(f"FusedAdam.step: grads has {len(grads)} lists for {len(self.param_groups)} groups")
        if not (grad_scale > 0 and math.isfinite(grad_scale)):
            raise ValueError(f"FusedAdam.step: grad_scale must be finite and > 0, got {grad_scale}")
        for gi, group in enumerate(self.param_groups):
            group_grads = grads[gi] if grads is not None else None
            by_device, writeback = {}, []   # device -> (params, grads, exp_avgs, exp_avg_sqs)
            for i, p in enumerate(group["params"]):
                g = p.grad if group_grads is None else group_grads[i]
                if g is None:
                    continue
                if g.is_sparse:
                    raise RuntimeError("FusedAdam does not support sparse gradients; use torch.optim.SparseAdam "
                                       "for embeddings with sparse=True")
                if p.device.type not in ("cpu", "cuda") or g.device != p.device:
                    raise ValueError(f"FusedAdam: a parameter on {p.device} with its gradient on {g.device}: both "
                                     "must be on one CPU or CUDA device")
                if p.dtype not in _PARAM_DTYPES or g.dtype not in _PARAM_DTYPES:
                    raise TypeError(f"FusedAdam: parameters and gradients must be float32, float16 or bfloat16, "
                                    f"got {p.dtype} with a {g.dtype} gradient")
                if g.shape != p.shape:
                    raise ValueError(f"FusedAdam: gradient shape {tuple(g.shape)} != parameter shape {tuple(p.shape)}")
                state = self._init_state(p)
                target = p
                if not p.is_contiguous():        # updated in a dense copy, written back below
                    target = p.contiguous()
                    writeback.append((p, target))
                lists = by_device.setdefault(p.device, ([], [], [], []))
                for lst, t in zip(lists, (target, _dense(g), state["exp_avg"], state["exp_avg_sq"])):
                    lst.append(t)
            # one step counter per group, incremented before the update (as ORT's)
            group["step"] = group.get("step", 0) + 1
            beta1, beta2 = group["betas"]
            for device, (params, gs, ms, vs) in by_device.items():
                _C.adam_step(list(map(to_dlpack, params)), list(map(to_dlpack, gs)), list(map(to_dlpack, ms)),
                             list(map(to_dlpack, vs)), float(group["lr"]), float(beta1), float(beta2),
                             float(group["eps"]), float(group["weight_decay"]), bool(group["bias_correction"]),
                             int(group.get("adam_w_mode", self.adam_w_mode)), int(group["step"]), float(grad_scale),
                             stream_of(device))
            for p, dense in writeback:
                p.copy_(dense)
        return loss

    def add_param_group(self, param_group):
        _check_hparams(param_group.get("lr", self.defaults["lr"]), param_group.get("betas", self.defaults["betas"]),
                       param_group.get("eps", self.defaults["eps"]),
                       param_group.get("weight_decay", self.defaults["weight_decay"]),
                       param_group.get("adam_w_mode", self.defaults["adam_w_mode"]))
        super().add_param_group(param_group)


def _check_hparams(lr, betas, eps, weight_decay, adam_w_mode):
    if not 0.0 <= lr:
        raise ValueError(f"Invalid learning rate: {lr}")
    if not 0.0 <= eps:
        raise ValueError(f"Invalid epsilon value: {eps}")
    if len(betas) != 2 or not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
        raise ValueError(f"Invalid betas: {betas}")
    if not 0.0 <= weight_decay:
        raise ValueError(f"Invalid weight_decay value: {weight_decay}")
    try:
        AdamWMode(adam_w_mode)
    except ValueError:
        raise ValueError(f"Invalid adam_w_mode {adam_w_mode!r}: one of {[m.name for m in AdamWMode]}") from None
