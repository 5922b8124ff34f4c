"""SwiGLU feed-forward block."""

from __future__ import annotations

import torch
from torch import nn
from transformers.activations import ACT2FN

from hyla.layers.projections import fused_linear


class GatedMLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int, *, act: str = "silu", bias: bool = False):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=bias)
        self.act_fn = ACT2FN[act]
        # True: gate and up as one product (`hyla.layers.projections`; a training setting,
        # `hyla.models.modeling.use_fused_projections`).
        self.fuse_projections = False

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        if self.fuse_projections:
            gate, up = fused_linear(hidden_states, (self.gate_proj, self.up_proj))
        else:
            gate, up = self.gate_proj(hidden_states), self.up_proj(hidden_states)
        return self.down_proj(self.act_fn(gate) * up)
