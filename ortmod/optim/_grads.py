"""The gradient passes the optimizer wrappers share (FP16_Optimizer's own, the DeepSpeed and Apex
patches): which tensors the C passes take, grouped per device, the overflow check and norm.

A leaf of ortmod.optim: fp16_optimizer, _apex and _deepspeed import it; it imports none of them
(they were a circle through fp16_optimizer, which dispatches to the two patches)."""
import math

import torch
from torch.utils.dlpack import to_dlpack    # noqa: F401  (the patches' _fp.to_dlpack)

from .. import _C
from .fused_adam import stream_of           # noqa: F401  (the patches' _fp.stream_of)

_FLOAT = (torch.float32, torch.float16, torch.bfloat16)


def _c_able(t):
    """Tensors the C passes take: dense CPU or CUDA float32/float16/bfloat16."""
    return t.device.type in ("cpu", "cuda") and t.dtype in _FLOAT and t.is_contiguous()


def _by_device(items, key=lambda x: x):
    """items grouped by the device of key(item): one C call per device."""
    groups = {}
    for it in items:
        groups.setdefault(key(it).device, []).append(it)
    return groups.items()


def _check_and_norm(grads, scale):
    """(found_inf, squared L2 norm of grads / scale) in one pass per device; torch for tensors C
    cannot take. On CUDA the call waits for its result (the step's one synchronization)."""
    found_inf, sq = False, 0.0
    for device, c in _by_device(g for g in grads if _c_able(g)):
        f, s = _C.grads_check_and_norm(list(map(to_dlpack, c)), float(scale), stream_of(device))
        found_inf, sq = found_inf or f, sq + s
    for g in grads:
        if not _c_able(g):
            s = float(torch.sum((g.detach().double() / scale) ** 2))
            found_inf = found_inf or not math.isfinite(s)
            sq += s
    return bool(found_inf), (math.inf if found_inf else sq)
