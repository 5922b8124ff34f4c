"""RMSNorm (computed in float32, as the Llama/Qwen teachers do)."""

from __future__ import annotations

import torch
from torch import nn


def rms_norm(hidden_states: torch.Tensor, weight: torch.Tensor, *, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension, in float32 (float64 for float64), cast back before the weight multiplies it.
    weight: [D], or any shape that broadcasts against hidden_states (per-layer weights of stacked layers)."""
    dtype = hidden_states.dtype
    x = hidden_states.to(torch.float64 if dtype == torch.float64 else torch.float32)
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return weight * x.to(dtype)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, *, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps
        # False: the output takes the weight's dtype where it is wider (a float32 weight on bf16 activations under
        # autocast gives float32, as the HF teachers' norms do). True: the weight is cast to the input's dtype, and
        # the output stays in it (training with the activations in the autocast dtype,
        # `hyla.models.modeling.use_autocast_activations`).
        self.keep_input_dtype = False

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        weight = self.weight.to(hidden_states.dtype) if self.keep_input_dtype else self.weight
        return rms_norm(hidden_states, weight, eps=self.eps)

    def extra_repr(self) -> str:
        return f"{self.weight.shape[0]}, eps={self.eps}"
