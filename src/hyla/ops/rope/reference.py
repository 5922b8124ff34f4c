"""RoPE's reference: the rotate-half convention of the HF Llama/Qwen teachers, `x * cos + rotate_half(x) * sin`, in
x's dtype (each product and the sum rounded to it)."""

from __future__ import annotations

import torch


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    """[x1, x2] -> [-x2, x1] over the last dimension's two halves."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, T, H, D]; cos, sin: [B, T, D] (or [1, T, D], broadcast over the batch). Element d < D/2 of a head is
    paired with element d + D/2: (x1, x2) -> (x1 * cos1 - x2 * sin1, x2 * cos2 + x1 * sin2), cos1/sin1 the first
    half of cos/sin and cos2/sin2 the second."""
    return x * cos[:, :, None] + _rotate_half(x) * sin[:, :, None]
