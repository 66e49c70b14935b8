"""Optimizers for ortmod (FusedAdam, FP16_Optimizer) — not in this slice yet."""

__all__ = []
