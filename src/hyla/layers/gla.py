"""GLA layer: gated linear attention with a data-dependent diagonal gate (docs/method.md, "Hybrid family"), after fla's
GLA layer.

q = x Wq, k = x Wk, v = x Wv (full multi-head, head dim of the model), RoPE on q and k only with `gla_rope` (off by
default: the gates are then the only position signal); log-gate g_t = logsigmoid(x W1 W2 + b) / n per key channel
(low-rank W1 W2, n = gla_gate_logit_normalizer);
S_t = Diag(exp(g_t)) S_{t-1} + k_t^T v_t, o_t = q_t S_t / sqrt(d); per-head RMSNorm times swish(x Wg), then Wo.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from hyla.layers.context import MixerContext
from hyla.layers.linear_mixer import GatedOutputMixer
from hyla.layers.norm import RMSNorm
from hyla.ops.gla import gla_attention


class GatedLinearAttention(GatedOutputMixer):
    op = staticmethod(gla_attention)

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.use_rope = config.gla_rope
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

    def project(self, hidden_states: torch.Tensor, context: MixerContext):
        """The mixer's input side: q, k, v [B, T, H, D] of hidden_states [B, T, hidden] (the linear maps, then
        `prepare_qkv`). The op's per-token gate comes from `token_inputs`."""
        q, k, v = self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)
        return self.prepare_qkv(q, k, v, context)

    def prepare_qkv(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: MixerContext):
        """q/k/v from their linear maps ([B, T, width] each) to [B, T, H, D], RoPE on q and k with `gla_rope`;
        shared with the inference engine's fused projections."""
        shape = q.shape[:2] + (self.num_heads, self.head_dim)
        q, k = self.rotate(q.view(shape), k.view(shape), context)
        v = v.view(shape)
        if context.token_mask is not None:
            # Padding does not write the state (k = 0); `token_inputs` keeps it from decaying the state.
            k = k * context.token_mask[:, :, None, None].to(k.dtype)
        return q, k, v

    def token_inputs(self, hidden_states: torch.Tensor, context: MixerContext) -> dict[str, torch.Tensor]:
        """The op's per-token inputs: the log-gate g [B, T, H, D] (`gla_attention`'s `g`)."""
        shape = hidden_states.shape[:2] + (self.num_heads, self.head_dim)
        # The gate in float32: its sum over many tokens is the decay, and bfloat16 would round small steps away.
        g = F.logsigmoid(self.gk_proj(hidden_states).float()).view(shape) / self.config.gla_gate_logit_normalizer
        if context.token_mask is not None:
            g = g * context.token_mask[:, :, None, None].to(g.dtype)
        return {"g": g}
