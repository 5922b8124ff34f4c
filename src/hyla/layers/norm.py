"""RMSNorm (computed in float32, as the Llama/Qwen teachers do; in inference on CUDA through torch's fused kernel:
`hyla.ops.rms_norm`)."""

from __future__ import annotations

import torch
from torch import nn

from hyla.ops.rms_norm import rms_norm


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
