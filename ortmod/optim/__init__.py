"""Optimizers for ortmod: FusedAdam (multi-tensor Adam/AdamW in C) and FP16_Optimizer
(dynamic loss scaling, fused overflow check / unscale / clip, fp32 master weights)."""
from .fp16_optimizer import FP16_Optimizer
from .fused_adam import AdamWMode, FusedAdam

__all__ = ["AdamWMode", "FusedAdam", "FP16_Optimizer"]
