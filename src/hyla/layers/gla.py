"""GLA layer: gated linear attention with a data-dependent diagonal gate (docs/method.md, "Hybrid family"), after fla's
GLA layer.

q = x Wq, k = x Wk, v = x Wv (full multi-head, head dim of the model, no RoPE: the gates are the position signal);
log-gate g_t = logsigmoid(x W1 W2 + b) / n per key channel (low-rank W1 W2, n = gla_gate_logit_normalizer);
S_t = Diag(exp(g_t)) S_{t-1} + k_t^T v_t, o_t = q_t S_t / sqrt(d); per-head RMSNorm times swish(x Wg), then Wo.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hyla.layers.context import MixerContext
from hyla.layers.linear_mixer import run_linear_op
from hyla.layers.norm import RMSNorm
from hyla.ops.gla import gla_attention


class GatedLinearAttention(nn.Module):
    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        width = self.num_heads * self.head_dim
        self.q_proj = nn.Linear(config.hidden_size, width, bias=config.qkv_bias)
        self.k_proj = nn.Linear(config.hidden_size, width, bias=config.qkv_bias)
        self.v_proj = nn.Linear(config.hidden_size, width, bias=config.qkv_bias)
        self.gk_proj = nn.Sequential(
            nn.Linear(config.hidden_size, config.gla_gate_low_rank_dim, bias=False),
            nn.Linear(config.gla_gate_low_rank_dim, width, bias=True),
        )
        self.g_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.o_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.o_proj = nn.Linear(width, config.hidden_size, bias=config.o_bias)

    def _project(self, hidden_states: torch.Tensor, context: MixerContext):
        shape = hidden_states.shape[:2] + (self.num_heads, self.head_dim)
        q = self.q_proj(hidden_states).view(shape)
        k = self.k_proj(hidden_states).view(shape)
        v = self.v_proj(hidden_states).view(shape)
        # The gate in float32: its sum over many tokens is the decay, and bfloat16 would round small steps away.
        g = F.logsigmoid(self.gk_proj(hidden_states).float()).view(shape) / self.config.gla_gate_logit_normalizer
        if context.token_mask is not None:
            # Padding neither writes (k = 0) nor decays (g = 0) the state.
            keep = context.token_mask[:, :, None, None]
            k, g = k * keep.to(k.dtype), g * keep.to(g.dtype)
        return q, k, v, g

    def forward(self, hidden_states: torch.Tensor, context: MixerContext) -> torch.Tensor:
        q, k, v, g = self._project(hidden_states, context)
        output = run_linear_op(
            gla_attention, self.layer_idx, q, k, v, context,
            token_inputs=dict(g=g), scale=self.head_dim**-0.5,
        )
        output = self.o_norm(output) * F.silu(self.g_proj(hidden_states)).view(output.shape)
        return self.o_proj(output.reshape(hidden_states.shape[:2] + (-1,)))
