"""Rotary position embeddings with the teacher's convention (rotate-half, as HF Llama/Qwen), any HF rope type; the
rotation itself is `hyla.ops.rope`."""

from __future__ import annotations

import torch
from torch import nn
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from hyla.ops.rope import apply_rotary as rotary


class RotaryEmbedding(nn.Module):
    """cos/sin tables for integer positions; the frequencies come from `config.rope_parameters` through
    transformers' own rope initialisers (default, linear, dynamic, yarn, llama3, longrope).

    The frequencies are a constant of the config, kept outside the state dict and outside `module.to(dtype)`: a
    bfloat16 copy of them would misplace long positions.
    """

    def __init__(self, config):
        super().__init__()
        self.config = config
        self.attention_scaling = 1.0
        self._by_key: dict[tuple[torch.device, torch.dtype], torch.Tensor] = {}

    def compute_inv_freq(self, dtype: torch.dtype) -> torch.Tensor:
        """Inverse frequencies [D/2] computed in `dtype` (float32 exactly as the HF teachers compute them)."""
        params = self.config.rope_parameters
        rope_type = params.get("rope_type", "default")
        if rope_type == "default":
            dim = self.config.head_dim
            exponents = torch.arange(0, dim, 2, dtype=dtype, device="cpu") / dim
            return 1.0 / (params["rope_theta"] ** exponents)
        inv_freq, self.attention_scaling = ROPE_INIT_FUNCTIONS[rope_type](self.config, "cpu")
        return inv_freq.to(dtype)

    def inv_freq(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        key = (device, dtype)
        if key not in self._by_key:
            self._by_key[key] = self.compute_inv_freq(dtype).to(device)
        return self._by_key[key]

    @torch.no_grad()
    def forward(self, position_ids: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """position_ids: [B, T] -> cos, sin: [B, T, D] in `dtype` (angles in float32, float64 for float64)."""
        acc = torch.float64 if dtype == torch.float64 else torch.float32
        freqs = position_ids[..., None].to(acc) * self.inv_freq(position_ids.device, acc)
        emb = torch.cat((freqs, freqs), dim=-1)
        return (emb.cos() * self.attention_scaling).to(dtype), (emb.sin() * self.attention_scaling).to(dtype)


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, T, H, D]; cos, sin: [B, T, D]. In inference on CUDA one fused kernel, else the reference
    (`hyla.ops.rope`)."""
    return rotary(x, cos, sin)
