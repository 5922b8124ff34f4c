"""RMSNorm's reference: normalized in float32 (float64 for float64), as the Llama/Qwen teachers compute it, cast back
to the input's dtype before the weight multiplies it."""

from __future__ import annotations

import torch


def rms_norm_reference(hidden_states: torch.Tensor, weight: torch.Tensor, *, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension. weight: [D], or any shape that broadcasts against hidden_states (per-layer
    weights of stacked layers). The output takes the weight's dtype where it is wider (a float32 weight on bf16
    activations gives float32, as the HF teachers' norms do under autocast)."""
    dtype = hidden_states.dtype
    x = hidden_states.to(torch.float64 if dtype == torch.float64 else torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)
