"""An object built to Apex amp's documented optimizer interface (O2: fp16 model, fp32 masters).

Apex is not on the package registry. This reproduces what ``apex.amp.initialize`` does to an
optimizer at O2 (``apex/amp/_process_optimizer.py``, ``apex/amp/scaler.py``), in plain torch,
with Apex's Python (non-``amp_C``) code paths: the ``_amp_stash`` fields, ``_amp_lazy_init``,
``_prepare_amp_backward`` / ``_post_amp_backward`` bound as methods, the ``LossScaler`` with
``loss_scale()``, ``dynamic``, ``_has_overflow``, ``_overflow_buf``, ``update_scale()``, and
``scale_loss`` skipping a step that overflowed. ortmod's FP16_Optimizer is held to it; it was
never run against real Apex.
"""
import contextlib
import types

import torch


class LossScaler:
    def __init__(self, init_scale=2.0 ** 12, scale_window=3, has_fused_kernel=False):
        self._loss_scale = init_scale
        self.dynamic = True
        self._max_loss_scale = 2.0 ** 24
        self._min_loss_scale = None
        self._scale_seq_len = scale_window
        self._unskipped = 0
        self._has_overflow = False
        self.has_fused_kernel = has_fused_kernel     # amp_C found: overflow reported in _overflow_buf
        self._overflow_buf = torch.zeros(1, dtype=torch.int32)

    def loss_scale(self):
        return self._loss_scale

    def clear_overflow_state(self):
        self._has_overflow = False
        if self.has_fused_kernel:
            self._overflow_buf.zero_()

    @staticmethod
    def _check_python(model_grad):
        s = float(model_grad.float().sum())
        return s in (float("inf"), -float("inf")) or s != s

    def unscale(self, model_grads, master_grads, unused_scale, models_are_masters=False, scale_override=None):
        scale = scale_override if scale_override is not None else self._loss_scale
        for model, master in zip(model_grads, master_grads):
            if model is None:
                continue
            if self.dynamic and self._check_python(model):
                self._has_overflow = True
                break
            if master is not model:
                master.copy_(model)
            if scale != 1.0:
                master.mul_(1.0 / scale)

    def unscale_with_stashed(self, model_grads, stashed_master_grads, master_grads, scale_override=None):
        grads_have_scale, stashed_have_scale, out_scale = self._loss_scale, 1.0, 1.0
        if scale_override is not None:
            grads_have_scale, stashed_have_scale, out_scale = scale_override
        a, b = out_scale / grads_have_scale, out_scale / stashed_have_scale
        for model, stashed, master in zip(model_grads, stashed_master_grads, master_grads):
            if self.dynamic and self._check_python(model):     # Apex checks the incoming model grads only
                self._has_overflow = True
                break
            master.copy_(a * model.float() + b * stashed.float())

    def update_scale(self):
        if self.has_fused_kernel and self.dynamic and not self._has_overflow:
            self._has_overflow = bool(self._overflow_buf.item())
        if self._has_overflow and self.dynamic:
            should_skip = True
            self._loss_scale = self._loss_scale / 2.0
            self._unskipped = 0
        else:
            should_skip = False
            self._unskipped += 1
        if self._unskipped == self._scale_seq_len and self.dynamic:
            self._loss_scale = min(self._max_loss_scale, self._loss_scale * 2.0)
            self._unskipped = 0
        return should_skip


def _post_backward_models_are_masters(scaler, params, stashed_grads, scale_override=None):
    grads_have_scale, stashed_have_scale, out_scale = scaler.loss_scale(), 1.0, 1.0
    if scaler.loss_scale() == 1.0 and not scaler.dynamic:
        for i in range(len(stashed_grads)):
            stashed_grads[i] = None
        return
    unscale, with_stash, stashed = [], [], []
    for param, stashed_grad in zip(params, stashed_grads):
        if param.grad is None and stashed_grad is not None:
            param.grad = stashed_grad
        elif param.grad is not None and stashed_grad is None:
            unscale.append(param.grad)
        elif param.grad is not None and stashed_grad is not None:
            with_stash.append(param.grad)
            stashed.append(stashed_grad)
    if unscale:
        scaler.unscale(unscale, unscale, None, models_are_masters=True, scale_override=grads_have_scale / out_scale)
    if with_stash:
        scaler.unscale_with_stashed(with_stash, stashed, with_stash,
                                    scale_override=(grads_have_scale, stashed_have_scale, out_scale))
    for i in range(len(stashed_grads)):
        stashed_grads[i] = None


def _lazy_init_with_master_weights(self):
    stash = self._amp_stash
    if stash.lazy_init_called:
        return
    stash.lazy_init_called = True
    stash.all_fp16_params, stash.all_fp32_from_fp16_params, stash.all_fp32_from_fp32_params = [], [], []
    for group in self.param_groups:
        for i, param in enumerate(group["params"]):
            model = stash.model_of.get(id(param))
            if model is not None:
                stash.all_fp16_params.append(model)
                stash.all_fp32_from_fp16_params.append(param)
            else:
                stash.all_fp32_from_fp32_params.append(param)
    stash.all_fp32_from_fp32_grad_stash = [None for _ in stash.all_fp32_from_fp32_params]


def _prepare_backward_with_master_weights(self):
    stash = self._amp_stash
    self._amp_lazy_init()
    for param in stash.all_fp16_params:
        param.grad = None
    for i, param in enumerate(stash.all_fp32_from_fp32_params):
        stash.all_fp32_from_fp32_grad_stash[i] = param.grad
        param.grad = None


def post_backward_with_master_weights(self, scaler):
    stash = self._amp_stash
    self._amp_lazy_init()
    fp16_needing_unscale, new_fp32, fp16_with_stash, preexisting = [], [], [], []
    for fp16_param, fp32_param in zip(stash.all_fp16_params, stash.all_fp32_from_fp16_params):
        if fp16_param.grad is None and fp32_param.grad is not None:
            continue
        elif fp16_param.grad is not None and fp32_param.grad is None:
            fp32_param.grad = torch.empty_like(fp32_param)
            fp16_needing_unscale.append(fp16_param.grad)
            new_fp32.append(fp32_param.grad)
        elif fp16_param.grad is not None and fp32_param.grad is not None:
            fp16_with_stash.append(fp16_param.grad)
            preexisting.append(fp32_param.grad)
    if fp16_needing_unscale:
        scaler.unscale(fp16_needing_unscale, new_fp32, scaler.loss_scale(), models_are_masters=False)
    if fp16_with_stash:
        scaler.unscale_with_stashed(fp16_with_stash, preexisting, preexisting)
    _post_backward_models_are_masters(scaler, stash.all_fp32_from_fp32_params, stash.all_fp32_from_fp32_grad_stash)


def _zero_grad_apex(self, set_to_none=False):
    stash = self._amp_stash
    self._amp_lazy_init()
    for param in stash.all_fp16_params + stash.all_fp32_from_fp32_params:
        if param.grad is not None:
            param.grad.detach_()
            param.grad.zero_()
    for param in stash.all_fp32_from_fp16_params:
        param.grad = None


def initialize(model, optimizer, scaler):
    """O2: fp16 parameters in the model, fp32 masters in the optimizer (params that were fp32,
    e.g. norms, stay their own masters)."""
    stash = types.SimpleNamespace(lazy_init_called=False, model_of={})
    for group in optimizer.param_groups:
        for i, p in enumerate(group["params"]):
            if p.dtype == torch.float16:
                master = p.detach().clone().float().requires_grad_()
                stash.model_of[id(master)] = p
                group["params"][i] = master
    optimizer._amp_stash = stash
    optimizer._amp_lazy_init = types.MethodType(_lazy_init_with_master_weights, optimizer)
    optimizer._prepare_amp_backward = types.MethodType(_prepare_backward_with_master_weights, optimizer)
    optimizer._post_amp_backward = types.MethodType(post_backward_with_master_weights, optimizer)
    optimizer.zero_grad = types.MethodType(_zero_grad_apex, optimizer)
    inner_step = optimizer.step

    def step(self, closure=None):
        out = inner_step(closure)
        with torch.no_grad():        # masters -> model (apex: _master_params_to_model_params)
            for p16, p32 in zip(self._amp_stash.all_fp16_params, self._amp_stash.all_fp32_from_fp16_params):
                p16.copy_(p32)
        return out

    optimizer.step = types.MethodType(step, optimizer)
    optimizer._amp_scaler = scaler
    return model, optimizer


@contextlib.contextmanager
def scale_loss(loss, optimizer):
    scaler = optimizer._amp_scaler
    scaler.clear_overflow_state()
    optimizer._prepare_amp_backward()
    yield loss.float() * scaler.loss_scale()
    optimizer._post_amp_backward(scaler)
    if scaler.update_scale():      # skip the next step, as apex's patched step does
        real = optimizer.step

        def skip_step(closure=None):
            optimizer.step = real
        optimizer.step = skip_step


__all__ = ["LossScaler", "initialize", "scale_loss"]
