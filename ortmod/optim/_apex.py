"""FP16_Optimizer around an optimizer that ``apex.amp.initialize`` patched: fuse its post-backward.

Apex keeps its loss scaler (``amp.scale_loss``, ``LossScaler.update_scale`` and the skipped
step); what ortmod replaces on the optimizer object, as ONNX Runtime's ``_apex_amp_modifier``
does, is the per-tensor work after backward and ``zero_grad``:

- ``_post_amp_backward(scaler)`` of the master-weights mode (O2: fp16 model, fp32 masters): the
  fp16 model gradients are checked for inf/NaN and unscaled into the fp32 master gradients in
  fused passes (``ortmod._C``); the fp32 parameters that are their own masters are unscaled in
  place, a gradient Apex stashed before backward (gradient accumulation) is added back, as
  Apex's ``post_backward_models_are_masters`` does. An overflow sets the scaler's
  ``_has_overflow`` and ``_overflow_buf``, which ``update_scale`` reads to skip the step and
  lower the scale.
- ``zero_grad(set_to_none=True)``: the model gradients are set to None (Apex zeroes them in
  place) and the master gradients too.

Apex is not on the package registry: this follows Apex's documented interface (the
``_amp_stash`` fields of ``apex/amp/_process_optimizer.py``, ``LossScaler.loss_scale()``,
``dynamic``, ``_has_overflow``, ``_overflow_buf``) and is tested against an object built to it
(``tests/apexlike.py``), not against real Apex.
"""
import types
import warnings

import torch

from . import _grads as _fp
from ._deepspeed import _underlying

_STASH_FIELDS = ("all_fp16_params", "all_fp32_from_fp16_params", "all_fp32_from_fp32_params",
                 "all_fp32_from_fp32_grad_stash")


def is_apex_amp(optimizer):
    return hasattr(optimizer, "_amp_stash") and hasattr(optimizer, "_post_amp_backward")


def _unscale_into(src, dst, factor):
    """dst[i] = src[i] * factor, one C pass per device (torch for what C cannot take)."""
    pairs = [(s, d) for s, d in zip(src, dst)]
    c = [(s, d) for s, d in pairs if _fp._c_able(s) and _fp._c_able(d) and s.device == d.device]
    for device, group in _fp._by_device(c, key=lambda sd: sd[0]):
        _fp._C.grads_copy_scaled([_fp.to_dlpack(s) for s, _ in group], [_fp.to_dlpack(d) for _, d in group],
                                 float(factor), _fp.stream_of(device))
    for s, d in pairs:
        if not (_fp._c_able(s) and _fp._c_able(d) and s.device == d.device):
            torch.mul(s, factor, out=d)


def _scale_(grads, factor):
    for device, c in _fp._by_device([g for g in grads if _fp._c_able(g)]):
        _fp._C.grads_scale(list(map(_fp.to_dlpack, c)), float(factor), _fp.stream_of(device))
    for g in grads:
        if not _fp._c_able(g):
            g.mul_(factor)


def _signal_overflow(scaler):
    scaler._has_overflow = True
    buf = getattr(scaler, "_overflow_buf", None)
    if torch.is_tensor(buf):
        buf.fill_(1)


def modify(optimizer, kwargs):
    name = f"{type(optimizer).__module__}.{type(optimizer).__qualname__}"
    if kwargs:
        warnings.warn(f"FP16_Optimizer: options {sorted(kwargs)} are ignored for Apex amp optimizers "
                      "(Apex keeps its own loss scaler)", UserWarning, stacklevel=3)
    counts = getattr(optimizer, "_ortmod_fused_calls", None)
    if counts is None:
        import collections
        counts = optimizer._ortmod_fused_calls = collections.Counter()
    left = []
    original = optimizer._post_amp_backward
    mode = getattr(_underlying(original, "_post_amp_backward"), "__name__", "")
    if getattr(original, "_ortmod_fused", False):
        pass
    elif type(optimizer).__name__ == "FusedSGD" and type(optimizer).__module__.startswith("apex"):
        left.append("_post_amp_backward (apex FusedSGD unscales into its masters in its own step)")
    elif mode != "post_backward_with_master_weights":
        left.append(f"_post_amp_backward ({mode or 'unknown'}: only the master-weights mode, O2, is fused)")
    else:
        def post_backward_with_master_weights(self, scaler):
            stash = self._amp_stash
            self._amp_lazy_init()
            if not all(hasattr(stash, f) for f in _STASH_FIELDS):
                return original(scaler)
            scale = scaler.loss_scale()
            model_grads, new_src, new_dst, acc_src, acc_dst = [], [], [], [], []
            for p16, p32 in zip(stash.all_fp16_params, stash.all_fp32_from_fp16_params):
                if p16.grad is None:
                    continue
                model_grads.append(p16.grad)
                if p32.grad is None:
                    p32.grad = torch.empty_like(p32, memory_format=torch.contiguous_format)
                    new_src.append(p16.grad)
                    new_dst.append(p32.grad)
                else:                        # accumulating onto a master gradient Apex kept
                    acc_src.append(p16.grad)
                    acc_dst.append(p32.grad)
            # fp32 parameters that are their own masters (post_backward_models_are_masters)
            own, stashed = [], stash.all_fp32_from_fp32_grad_stash
            for i, p in enumerate(stash.all_fp32_from_fp32_params):
                if p.grad is None and stashed[i] is not None:
                    p.grad = stashed[i]
                elif p.grad is not None:
                    model_grads.append(p.grad)
                    own.append((p, stashed[i]))
            found_inf, _ = _fp._check_and_norm(model_grads, 1.0)
            counts["overflow"] += 1
            if found_inf:
                _signal_overflow(scaler)       # update_scale() skips the step and lowers the scale
            # written on overflow too (as Apex's fused kernels do): the step is skipped anyway
            factor = 1.0 / scale
            _unscale_into(new_src, new_dst, factor)
            for s, d in zip(acc_src, acc_dst):
                d.add_(s.to(d.dtype), alpha=factor)
            if scale != 1.0 or scaler.dynamic:
                _scale_([p.grad for p, _ in own], factor)
            for p, st in own:
                if st is not None:
                    p.grad.add_(st)
            counts["unscale"] += 1
            for i in range(len(stashed)):
                stashed[i] = None

        post_backward_with_master_weights._ortmod_fused = True
        optimizer._post_amp_backward = types.MethodType(post_backward_with_master_weights, optimizer)

    if not getattr(optimizer.zero_grad, "_ortmod_fused", False):
        def zero_grad(self, set_to_none=True):
            stash = self._amp_stash
            self._amp_lazy_init()
            for param in list(getattr(stash, "all_fp16_params", ())) + list(getattr(stash, "all_fp32_from_fp32_params",
                                                                                     ())):
                if set_to_none:
                    param.grad = None
                elif param.grad is not None:
                    param.grad.detach_()
                    param.grad.zero_()
            for param in getattr(stash, "all_fp32_from_fp16_params", ()):
                param.grad = None           # master gradients are rebuilt from the model's each backward

        zero_grad._ortmod_fused = True
        optimizer.zero_grad = types.MethodType(zero_grad, optimizer)
    if left:
        warnings.warn(f"FP16_Optimizer: on {name} (Apex amp), Apex's own {'; '.join(left)} stays as it is",
                      UserWarning, stacklevel=3)
    return optimizer
