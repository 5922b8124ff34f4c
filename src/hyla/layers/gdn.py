"""Gated DeltaNet layer (docs/method.md, "Hybrid family"), after fla's GatedDeltaNet without the short convolution.

q = l2norm(silu(x Wq)), k = l2norm(silu(x Wk)), v = silu(x Wv) (full multi-head, the model's head dim);
with `gdn_rope`, q = l2norm(RoPE(silu(x Wq))) and k likewise (`GatedDeltaNet.prepare_qkv` says why there);
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
from hyla.layers.linear_mixer import GatedOutputMixer
from hyla.layers.norm import RMSNorm
from hyla.ops.gdn import gdn_attention


def l2_normalize(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """x / sqrt(|x|^2 + eps) over the last dim, computed in float32 (fla's l2norm)."""
    acc = x.to(torch.float64 if x.dtype == torch.float64 else torch.float32)
    return (acc * torch.rsqrt(acc.pow(2).sum(-1, keepdim=True) + eps)).to(x.dtype)


class GatedDeltaNet(GatedOutputMixer):
    op = staticmethod(gdn_attention)

    def __init__(self, config, layer_idx: int):
        super().__init__()
        self.config = config
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.use_rope = config.gdn_rope
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

    def project(self, hidden_states: torch.Tensor, context: MixerContext):
        """The mixer's input side: q, k, v [B, T, H, D] of hidden_states [B, T, hidden] (the linear maps, then
        `prepare_qkv`). The op's per-token gate and beta come from `token_inputs`."""
        q, k, v = self.q_proj(hidden_states), self.k_proj(hidden_states), self.v_proj(hidden_states)
        return self.prepare_qkv(q, k, v, context)

    def prepare_qkv(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, context: MixerContext):
        """q/k/v from their linear maps ([B, T, width] each) to [B, T, H, D]: SiLU, RoPE with `gdn_rope`, then
        L2-normalised q and k; shared with the inference engine's fused projections."""
        shape = q.shape[:2] + (self.num_heads, self.head_dim)
        # RoPE after the SiLU (an elementwise map applied after the rotation would break q_t k_s's dependence on
        # t - s alone) and before the L2 norm: for a plain rotation both orders are the same map (the norm is
        # rotation-invariant), but the norm last keeps |k| = 1, which the delta rule's (I - beta k^T k) needs,
        # whatever RoPE's cos/sin carry (yarn and longrope scale them by their attention factor; bfloat16 tables
        # round cos^2 + sin^2 away from 1).
        q, k = self.rotate(F.silu(q).view(shape), F.silu(k).view(shape), context)
        q, k = l2_normalize(q), l2_normalize(k)
        v = F.silu(v).view(shape)
        if context.token_mask is not None:
            # Padding does not write the state (k = 0); `token_inputs` keeps it from decaying the state.
            k = k * context.token_mask[:, :, None, None].to(k.dtype)
        return q, k, v

    def token_inputs(self, hidden_states: torch.Tensor, context: MixerContext) -> dict[str, torch.Tensor]:
        """The op's per-token inputs (`gdn_attention`'s `g` and `beta`, [B, T, H] float32)."""
        beta = torch.sigmoid(self.b_proj(hidden_states).float())
        g = -self.A_log.float().exp() * F.softplus(self.a_proj(hidden_states).float() + self.dt_bias.float())
        if context.token_mask is not None:
            g = g * context.token_mask[:, :, None].to(g.dtype)
        return {"g": g, "beta": beta}
