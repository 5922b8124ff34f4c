"""The hybrid cache: a key/value cache for attention layers, a recurrent state for RNN layers.

Built on transformers' `Cache` so that `generate` (greedy, sampling, beam reordering) handles it like any other.
The number of tokens seen is counted here, since RNN layers have no length to ask.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer, LinearAttentionLayer


class HybridCache(Cache):
    def __init__(self, layer_types: list[str]):
        layers = [DynamicLayer() if kind == "attention" else LinearAttentionLayer() for kind in layer_types]
        super().__init__(layers=layers)
        self.layer_types = list(layer_types)
        self.seen_tokens = 0

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.seen_tokens

    def advance(self, num_tokens: int) -> None:
        """Called by the model once all layers have consumed `num_tokens` new positions."""
        self.seen_tokens += num_tokens

    def update_kv(
        self, layer_idx: int, key: torch.Tensor, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Append key/value [B, T, Hkv, D] and return the whole cached key/value [B, Tk, Hkv, D]."""
        keys, values = self.layers[layer_idx].update(key.transpose(1, 2), value.transpose(1, 2))
        return keys.transpose(1, 2), values.transpose(1, 2)

    def recurrent_state(self, layer_idx: int) -> torch.Tensor | None:
        layer = self.layers[layer_idx]
        return layer.recurrent_states[0] if layer.is_recurrent_states_initialized[0] else None

    def set_recurrent_state(self, layer_idx: int, state: torch.Tensor) -> None:
        layer = self.layers[layer_idx]
        layer.update_recurrent_state(state)
        layer.has_previous_state[0] = True

    def reset(self) -> None:
        super().reset()
        self.seen_tokens = 0
