"""FP16_Optimizer around the optimizers DeepSpeed returns: patch what their step() calls.

DeepSpeed keeps its own loss scaler, master weights and partitioning; what ortmod replaces,
in place on the one optimizer object, is the per-tensor work of the step (as ONNX Runtime's
``_ds_modifier`` does): the inf/NaN check, the gradient L2 norm and the unscale/clip, each
with one fused multi-tensor pass of ``ortmod._C`` per device. Everything around those
passes stays DeepSpeed's: the all-reduces across the data- and model-parallel groups, the
−1 norm that marks inf/NaN, which gradients count (padding, pipeline-replicated and
model-parallel parameters), the clip formula, the skip and the scale update.

What step() calls, by optimizer (DeepSpeed 0.19):

- ``DeepSpeedZeroOptimizer`` (ZeRO 1/2): ``has_overflow_partitioned_grads_serial()`` (fp16, or
  bf16 with ``check_grad_overflow``), ``get_grad_norm_direct(gradients, params, norm_type)``
  (every step unless ``compute_grad_norm`` is off), ``unscale_and_clip_grads(grad_groups_flat,
  total_norm)``. ``has_overflow_serial`` is not called by its step.
- ``DeepSpeedZeroOptimizer_Stage3``: ``has_overflow(partition_gradients)`` (fp16),
  ``get_grad_norm_direct``, ``unscale_and_clip_grads(sub_group_id, total_norm)``.
- ``FP16_UnfusedOptimizer`` (fp16/bf16 without ZeRO) and DeepSpeed's ``FP16_Optimizer``:
  ``overflow_checker.has_overflow_serial(params)``; the unfused one also
  ``unscale_and_clip_grads(total_norm, apply_scale)``. Their gradient norm is the module
  function ``deepspeed.runtime.utils.get_weight_norm``, not a method: it stays DeepSpeed's.

A method is replaced only when it exists with the parameters listed here and the DeepSpeed
helpers its replacement calls are found; otherwise it is left as it is and one warning says
which and why. A gradient the C passes cannot take (sparse, strided, another dtype or device)
sends that call to DeepSpeed's own method. ``optimizer._ortmod_fused_calls`` counts the fused
calls per kind ("overflow", "norm", "clip").
"""
import collections
import inspect
import sys
import warnings

import torch

from . import _grads as _fp

TESTED = ((0, 19), (0, 20))      # [from, to): the versions whose step() was read and tested

_warned = set()


def _warn_once(key, message, stacklevel=4):
    """stacklevel 4: the caller of FP16_Optimizer(...) when called from modify()."""
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(message, UserWarning, stacklevel=stacklevel)


def _version():
    import deepspeed
    text = getattr(deepspeed, "__version__", "0")
    parts = []
    for piece in text.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in piece if ch.isdigit())
        parts.append(int(digits) if digits else 0)
    return tuple(parts + [0] * (2 - len(parts))), text


def _underlying(fn, name):
    """The function behind a (bound) method, through decorators: functools.wraps' __wrapped__,
    or a closure holding the function of that name (DeepSpeed's instrument_w_nvtx)."""
    f = getattr(fn, "__func__", fn)
    for _ in range(8):
        inner = getattr(f, "__wrapped__", None)
        if inner is None:
            cells = getattr(f, "__closure__", None) or ()
            inner = next((c.cell_contents for c in cells
                          if inspect.isfunction(getattr(c, "cell_contents", None))
                          and c.cell_contents.__name__ == name), None)
        if inner is None or inner is f:
            break
        f = inner
    return f


def _params_of(fn, name):
    """Parameter names of method fn (self excluded), or None."""
    f = _underlying(fn, name)
    try:
        params = list(inspect.signature(f).parameters)
    except (TypeError, ValueError):
        return None
    if params and params[0] == "self" and f is not fn:
        params = params[1:]
    return params


def _helpers(optimizer, names):
    """DeepSpeed helpers from the module that defines the optimizer's class (the names its own
    step uses), or None when one is missing."""
    mod = sys.modules.get(type(optimizer).__module__)
    found = {}
    for name in names:
        value = getattr(mod, name, None)
        if value is None:
            return None
        found[name] = value
    return found


def _grads_ok(grads):
    return all(_fp._c_able(g) for g in grads)


def _scale_(grads, factor):
    """grads *= factor in place: one C pass per device."""
    for device, c in _by_device(grads):
        _fp._C.grads_scale(list(map(_fp.to_dlpack, c)), float(factor), _fp.stream_of(device))


def _by_device(grads):
    return _fp._by_device(grads)


class _Patcher:
    """Replaces methods on one DeepSpeed optimizer object; collects what it could not."""

    def __init__(self, optimizer):
        self.opt = optimizer
        self.name = f"{type(optimizer).__module__}.{type(optimizer).__qualname__}"
        self.counts = getattr(optimizer, "_ortmod_fused_calls", None) or collections.Counter()
        optimizer._ortmod_fused_calls = self.counts
        self.patched, self.left = [], []

    def replace(self, owner, method, expected, helpers, make):
        """owner.method is replaced by make(original, helpers) when its parameters are expected
        (a list of names, self excluded) and helpers (names in the optimizer's module) exist."""
        original = getattr(owner, method, None)
        label = method if owner is self.opt else f"{type(owner).__name__}.{method}"
        if original is None:
            self.left.append(f"{label} (not found)")
            return
        if getattr(original, "_ortmod_fused", False):
            self.patched.append(label)
            return
        params = _params_of(original, method)
        if params != expected:
            self.left.append(f"{label} (parameters {params}, expected {expected})")
            return
        found = _helpers(self.opt, helpers) if helpers else {}
        if found is None:
            self.left.append(f"{label} (needs {', '.join(helpers)} from {type(self.opt).__module__})")
            return
        fused = make(original, found)
        fused._ortmod_fused = True
        fused.__name__ = method
        setattr(owner, method, fused)
        self.patched.append(label)

    def finish(self, extra_note=""):
        if self.left or extra_note:
            why = "; ".join(self.left)
            _warn_once((self.name, why, extra_note),
                       f"FP16_Optimizer: on {self.name}, DeepSpeed's own "
                       + (f"{why} stay as they are" if why else "")
                       + ("; " if why and extra_note else "") + extra_note
                       + (f"; fused: {', '.join(self.patched)}" if self.patched else "; nothing was fused"),
                       stacklevel=5)
        return self.opt


# ---- the replacements ----------------------------------------------------------------------

def _fused_found_inf(grads):
    found, _ = _fp._check_and_norm(grads, 1.0)
    return found


def _zero12(p, opt):
    """DeepSpeedZeroOptimizer (stage_1_and_2.py)."""
    def overflow(original, h):
        def has_overflow_partitioned_grads_serial():
            try:
                grads = [g for i in range(len(opt.bit16_groups)) for g in opt.averaged_gradients[i] if g is not None]
            except (TypeError, KeyError, AttributeError):
                return original()
            if not _grads_ok(grads):
                return original()
            found = _fused_found_inf(grads)
            p.counts["overflow"] += 1
            # DeepSpeed returns a bool tensor of one element on the accelerator; has_overflow
            # all-reduces it (MAX) over the data- and model-parallel groups
            return torch.tensor([found], dtype=torch.bool, device=h["get_accelerator"]().current_device_name())
        return has_overflow_partitioned_grads_serial

    def norm(original, h):
        def get_grad_norm_direct(gradients, params, norm_type=2):
            if float(norm_type) != 2.0:
                return original(gradients, params, norm_type)
            chosen = []
            param_gradients = (g for g in gradients if not getattr(g, "_zero_padding", False))
            for g, prm in zip(param_gradients, params):
                if hasattr(prm, h["PIPE_REPLICATED"]) and prm.ds_pipe_replicated:
                    continue   # pipeline parallelism replicates it: counted once
                if h["is_model_parallel_parameter"](prm) or opt.model_parallel_rank == 0:
                    chosen.append(g)
            if not _grads_ok(chosen):
                return original(gradients, params, norm_type)
            device = h["get_accelerator"]().current_device_name()
            if chosen:
                _, sq = _fp._check_and_norm(chosen, 1.0)     # inf when a gradient holds inf/NaN
                total_norm = torch.tensor(sq, dtype=torch.float32, device=device)
            else:
                total_norm = torch.tensor(0.0, dtype=torch.float32).to(opt.device)
            p.counts["norm"] += 1
            h["dist"].all_reduce(total_norm, op=h["dist"].ReduceOp.SUM, group=opt.dp_process_group)
            opt._model_parallel_all_reduce(tensor=total_norm, op=h["dist"].ReduceOp.SUM)
            total_norm = total_norm.pow(1. / 2)
            h["mask_nan_or_inf_with_val_inplace"](total_norm, device=opt.device)   # inf/NaN -> -1
            return total_norm
        return get_grad_norm_direct

    def clip(original, h):
        def unscale_and_clip_grads(grad_groups_flat, total_norm):
            if opt.clip_grad == 0.0 and opt.loss_scale == 1.0:
                return
            grads = [g for grad in grad_groups_flat for g in (grad if isinstance(grad, list) else [grad])]
            if not _grads_ok(grads):
                return original(grad_groups_flat, total_norm)
            combined_scale = opt.loss_scale
            if opt.clip_grad > 0.:
                clip_norm = total_norm
                if h["is_invalid_grad_norm"](clip_norm):     # the −1 sentinel is no clipping magnitude
                    clip_norm = torch.tensor(float("inf"), dtype=torch.float, device=opt.device)
                clip = ((clip_norm / opt.loss_scale) + 1e-6) / opt.clip_grad
                clip = torch.clamp(clip, min=1.0)
                combined_scale = clip * opt.loss_scale
            _scale_(grads, float(1. / combined_scale))
            p.counts["clip"] += 1
        return unscale_and_clip_grads

    p.replace(opt, "has_overflow_partitioned_grads_serial", [], ["get_accelerator"], overflow)
    p.replace(opt, "get_grad_norm_direct", ["gradients", "params", "norm_type"],
              ["PIPE_REPLICATED", "is_model_parallel_parameter", "get_accelerator", "dist",
               "mask_nan_or_inf_with_val_inplace"], norm)
    p.replace(opt, "unscale_and_clip_grads", ["grad_groups_flat", "total_norm"], ["is_invalid_grad_norm"], clip)
    if getattr(opt, "cpu_offload", False):
        p.left.append("the overflow check and norm under cpu_offload (computed during backward)")


def _zero3(p, opt):
    """DeepSpeedZeroOptimizer_Stage3 (stage3.py)."""
    def overflow(original, h):
        def has_overflow(partition_gradients=True):
            buf = getattr(opt, "grad_partitions_flat_buffer", None)
            tracker = getattr(opt, "inf_or_nan_tracker", None)
            if (not partition_gradients or buf is None or tracker is None or not _grads_ok([buf])
                    or getattr(opt, "offload_optimizer", False)):
                return original(partition_gradients)
            found = _fused_found_inf([buf])
            p.counts["overflow"] += 1
            overflow_gpu = (tracker.bool() | found).to(h["get_accelerator"]().current_device_name()).to(torch.uint8)
            tracker.zero_()
            h["dist"].all_reduce(overflow_gpu, op=h["dist"].ReduceOp.MAX, group=opt.dp_process_group)
            opt._model_parallel_all_reduce(tensor=overflow_gpu, op=h["dist"].ReduceOp.MAX)
            return bool(overflow_gpu.reshape(-1)[0].item())
        return has_overflow

    def norm(original, h):
        def get_grad_norm_direct(gradients, params, norm_type=2):
            if float(norm_type) != 2.0:
                return original(gradients, params, norm_type)
            opt._assert_same_partition_group(params)
            process_group = opt._get_param_partition_group(params[0])
            counts_every_rank = opt._grad_norm_counts_every_rank(params, process_group)
            chosen = [g for g, prm in zip(gradients, params)
                      if counts_every_rank or h["is_model_parallel_parameter"](prm) or opt.model_parallel_rank == 0]
            if not _grads_ok(chosen):
                return original(gradients, params, norm_type)
            device = h["get_accelerator"]().device_name()
            norm_dtype = h["get_norm_dtype"]()
            if chosen:
                _, sq = _fp._check_and_norm(chosen, 1.0)
                total = torch.tensor(sq, dtype=norm_dtype, device=device)
            else:
                total = torch.tensor(0, dtype=gradients[0].dtype).to(device).to(norm_dtype)
            p.counts["norm"] += 1
            dist = h["dist"]
            dist.all_reduce(total, op=dist.ReduceOp.SUM, group=process_group)
            if not counts_every_rank:
                opt._model_parallel_all_reduce(tensor=total, op=dist.ReduceOp.SUM)
            ep_group = opt._autoep_expert_parallel_group(params)
            if h["pg_utils"].is_parallel(ep_group):
                dist.all_reduce(total, op=dist.ReduceOp.SUM, group=ep_group)
            total_norm = total ** (1. / 2)
            inf_or_nan = total_norm.isnan().logical_or(total_norm.isinf())
            return torch.where(inf_or_nan, torch.tensor(-1.0, device=opt.device, dtype=torch.float), total_norm)
        return get_grad_norm_direct

    def clip(original, h):
        def unscale_and_clip_grads(sub_group_id, total_norm):
            grad = opt.fp32_partitioned_groups_flat[sub_group_id].grad
            if grad is None or not _grads_ok([grad]):
                return original(sub_group_id, total_norm)
            combined_scale = opt.loss_scale
            if opt.clip_grad > 0.:
                clip = ((total_norm / opt.loss_scale) + 1e-6) / opt.clip_grad
                clip = torch.clamp(clip, min=1.0)
                combined_scale = clip * opt.loss_scale
            factor = float(1. / combined_scale)
            if factor != 1.0:          # DeepSpeed multiplies by 1.0 too: the same numbers
                _scale_([grad], factor)
                p.counts["clip"] += 1
        return unscale_and_clip_grads

    needs = [name for name in ("_assert_same_partition_group", "_get_param_partition_group",
                               "_grad_norm_counts_every_rank", "_autoep_expert_parallel_group",
                               "_model_parallel_all_reduce") if not hasattr(opt, name)]
    p.replace(opt, "has_overflow", ["partition_gradients"], ["get_accelerator", "dist"], overflow)
    if needs:
        p.left.append(f"get_grad_norm_direct (this version has no {', '.join(needs)})")
    else:
        p.replace(opt, "get_grad_norm_direct", ["gradients", "params", "norm_type"],
                  ["is_model_parallel_parameter", "get_accelerator", "get_norm_dtype", "dist", "pg_utils"], norm)
    p.replace(opt, "unscale_and_clip_grads", ["sub_group_id", "total_norm"], [], clip)


def _overflow_checker(p, opt):
    """DeepSpeed's FP16_Optimizer / FP16_UnfusedOptimizer: CheckOverflow.has_overflow_serial
    (CheckOverflow.has_overflow all-reduces its answer)."""
    checker = getattr(opt, "overflow_checker", None)
    if checker is None:
        p.left.append("overflow_checker (not found)")
        return

    def overflow(original, h):
        def has_overflow_serial(params):
            params = list(params)
            grads = [q.grad for q in params if q.grad is not None]
            if not _grads_ok(grads):
                return original(params)
            p.counts["overflow"] += 1
            return _fused_found_inf(grads)
        return has_overflow_serial

    p.replace(checker, "has_overflow_serial", ["params"], [], overflow)


def _unfused(p, opt):
    """FP16_UnfusedOptimizer (unfused_optimizer.py): its unscale/clip of the fp32 master grads."""
    def clip(original, h):
        def unscale_and_clip_grads(total_norm, apply_scale=True):
            combined_scale = opt.loss_scale_config.cur_scale
            if opt.clip_grad > 0.:
                clip = ((total_norm / opt.loss_scale_config.cur_scale) + 1e-6) / opt.clip_grad
                if clip > 1:
                    combined_scale = clip * opt.loss_scale_config.cur_scale
            if apply_scale:
                grads = [q.grad for group in opt.fp32_groups for q in group if q.grad is not None]
                if not _grads_ok(grads):
                    return original(total_norm, apply_scale)
                factor = 1. / combined_scale
                if factor != 1.0:
                    _scale_(grads, factor)
                    p.counts["clip"] += 1
            return combined_scale
        return unscale_and_clip_grads

    p.replace(opt, "unscale_and_clip_grads", ["total_norm", "apply_scale"], [], clip)


def modify(optimizer, kwargs):
    """FP16_Optimizer(<a DeepSpeed optimizer>): patch it in place and return it."""
    if kwargs:
        _warn_once(("kwargs", tuple(sorted(kwargs))),
                   f"FP16_Optimizer: options {sorted(kwargs)} are ignored for DeepSpeed optimizers "
                   "(DeepSpeed keeps its own loss scaler)")
    version, text = _version()
    p = _Patcher(optimizer)
    cls = type(optimizer).__name__
    note = ""
    if not (TESTED[0] <= version < TESTED[1]):
        note = (f"DeepSpeed {text} is outside the versions FP16_Optimizer was tested with "
                f"({TESTED[0][0]}.{TESTED[0][1]}.x); methods were patched where their parameters match")
    if cls == "DeepSpeedZeroOptimizer":
        _zero12(p, optimizer)
    elif cls == "DeepSpeedZeroOptimizer_Stage3":
        _zero3(p, optimizer)
    elif cls in ("FP16_UnfusedOptimizer", "FP16_Optimizer"):
        _overflow_checker(p, optimizer)
        if cls == "FP16_UnfusedOptimizer":
            _unfused(p, optimizer)
        else:
            p.left.append("unscale_and_clip_grads (not ported for the fused FP16_Optimizer)")
        p.left.append("the gradient norm (deepspeed.runtime.utils.get_weight_norm, a module function)")
    else:
        _warn_once(("unknown", cls),
                   f"FP16_Optimizer: {p.name} is a DeepSpeed optimizer FP16_Optimizer does not know; returned "
                   "unchanged (DeepSpeed's own step, nothing fused)")
        return optimizer
    return p.finish(note)


def engine_of(optimizer):
    """The DeepSpeed engine that steps this torch optimizer itself, or None. (deepspeed.initialize
    returns the client's optimizer unchanged for fp32 without ZeRO; the engine keeps it as
    ``optimizer`` / ``basic_optimizer``.)"""
    if "deepspeed" not in sys.modules:
        return None
    import gc
    for ref in gc.get_referrers(optimizer):
        if isinstance(ref, dict) and ref.get("optimizer") is optimizer and "_config" in ref \
                and type(ref["_config"]).__module__.startswith("deepspeed"):
            return ref
    return None


__all__ = ["modify", "engine_of", "TESTED"]
