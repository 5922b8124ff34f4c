"""Rotary position embeddings with the teacher's convention (rotate-half, as HF Llama/Qwen), any HF rope type."""

from __future__ import annotations

import torch
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS


class RotaryEmbedding(nn.Module):
    """cos/sin tables for integer positions; the frequencies come from `config.rope_parameters` through
    transformers' own rope initialisers (default, linear, dynamic, yarn, llama3, longrope)."""

    def __init__(self, config):
        super().__init__()
        self.config = config
        inv_freq, self.attention_scaling = self.compute_inv_freq()
        self.register_buffer("inv_freq", inv_freq, persistent=False)

    def compute_inv_freq(self) -> tuple[torch.Tensor, float]:
        params = self.config.rope_parameters
        rope_type = params.get("rope_type", "default")
        if rope_type == "default":
            dim = self.config.head_dim
            exponents = torch.arange(0, dim, 2, dtype=torch.float32, device="cpu") / dim
            return 1.0 / (params["rope_theta"] ** exponents), 1.0
        inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](self.config, "cpu")
        return inv_freq.float(), scaling

    @torch.no_grad()
    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """position_ids: [B, T] -> cos, sin: [B, T, D]."""
        freqs = position_ids[..., None].to(torch.float32) * self.inv_freq.to(position_ids.device)
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.attention_scaling).to(dtype), (emb.sin() * self.attention_scaling).to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, T, H, D]; cos, sin: [B, T, D]."""
    return x * cos[:, :, None] + _rotate_half(x) * sin[:, :, None]
