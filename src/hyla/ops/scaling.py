"""Logit scaling for NoPE attention (docs/method.md, "Attention layer and logit scaling", "EME")."""

from __future__ import annotations

import math

import torch


def attention_logit_scale(positions: torch.Tensor, *, a: float) -> torch.Tensor:
    """Per-query dynamic scaling s_t = log(t + a) / log(a), t the 0-based absolute position (s_0 = 1).

    positions: [B, T] integer positions; returns float64 [B, T] (callers cast to their dtype).
    """
    if a <= 1:
        raise ValueError(f"logit scaling constant a must be > 1, got {a}")
    return torch.log(positions.to(torch.float64) + a) / math.log(a)


def length_logit_scale(length: int, *, train_length: int) -> float:
    """Per-length scaling c(L) = log L / log L0 for L >= L0, else 1 (docs/method.md, "EME")."""
    if train_length < 2:
        raise ValueError(f"train_length must be >= 2, got {train_length}")
    return max(1.0, math.log(length) / math.log(train_length)) if length > 0 else 1.0
