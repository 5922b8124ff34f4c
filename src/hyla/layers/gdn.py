"""Gated DeltaNet layer (docs/method.md, "Hybrid family"), after fla's GatedDeltaNet without the short convolution.

q = l2norm(silu(x Wq)), k = l2norm(silu(x Wk)), v = silu(x Wv) (full multi-head, the model's head dim, no RoPE);
beta_t = sigmoid(x Wb) and g_t = -exp(A_log) * softplus(x Wa + dt_bias) per head;
S_t = exp(g_t) (I - beta_t k_t^T k_t) S_{t-1} + beta_t k_t^T v_t, o_t = q_t S_t / sqrt(d); per-head RMSNorm times
swish(x Wg), then Wo. The short convolution of fla's layer is left out: it would add a second recurrent state to the
cache and to every padding rule for a small gain that the paper's comparison does not depend on.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from hyla.layers.context import MixerContext
from hyla.layers.linear_mixer import run_linear_op
from hyla.layers.norm import RMSNorm
from hyla.ops.gdn import gdn_attention


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(|x|^2 + eps) over the last dim, computed in float32 (fla's l2norm)."""
    acc = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
    return (acc * torch.rsqrt(acc.pow(2).sum(-1, keepdim=True) + eps)).to(x.dtype)


class GatedDeltaNet(nn.Module):
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
        self.a_proj = nn.Linear(config.hidden_size, self.num_heads, bias=False)
        self.b_proj = nn.Linear(config.hidden_size, self.num_heads, bias=False)
        self.A_log = nn.Parameter(torch.empty(self.num_heads))
        self.dt_bias = nn.Parameter(torch.empty(self.num_heads))
        self.g_proj = nn.Linear(config.hidden_size, width, bias=False)
        self.o_norm = RMSNorm(self.head_dim, eps=config.rms_norm_eps)
        self.o_proj = nn.Linear(width, config.hidden_size, bias=config.o_bias)
        self.reset_gate_parameters()

    @torch.no_grad()
    def reset_gate_parameters(self) -> None:
        """fla's initialisation: A ~ U(0, 16); dt log-uniform in [1e-3, 0.1], stored as softplus^-1(dt)."""
        if self.A_log.is_meta:
            return
        self.A_log.copy_(torch.empty_like(self.A_log).uniform_(0, 16).log())
        log_dt = torch.rand_like(self.dt_bias) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3)
        dt = log_dt.exp().clamp(min=1e-4)
        self.dt_bias.copy_(dt + torch.log(-torch.expm1(-dt)))

    def _project(self, hidden_states: torch.Tensor, context: MixerContext):
        shape = hidden_states.shape[:2] + (self.num_heads, self.head_dim)
        q = l2_normalize(F.silu(self.q_proj(hidden_states)).view(shape))
        k = l2_normalize(F.silu(self.k_proj(hidden_states)).view(shape))
        v = F.silu(self.v_proj(hidden_states)).view(shape)
        beta = torch.sigmoid(self.b_proj(hidden_states).float())
        g = -self.A_log.float().exp() * F.softplus(self.a_proj(hidden_states).float() + self.dt_bias.float())
        if context.token_mask is not None:
            # Padding neither writes (k = 0) nor decays (g = 0) the state.
            keep = context.token_mask
            k, g = k * keep[:, :, None, None].to(k.dtype), g * keep[:, :, None].to(g.dtype)
        return q, k, v, g, beta

    def forward(self, hidden_states: torch.Tensor, context: MixerContext) -> torch.Tensor:
        q, k, v, g, beta = self._project(hidden_states, context)
        output = run_linear_op(
            gdn_attention, self.layer_idx, q, k, v, context,
            token_inputs=dict(g=g, beta=beta), scale=self.head_dim**-0.5,
        )
        output = self.o_norm(output) * F.silu(self.g_proj(hidden_states)).view(output.shape)
        return self.o_proj(output.reshape(hidden_states.shape[:2] + (-1,)))
