"""The hybrid cache: a key/value cache for attention layers, a recurrent state for RNN layers.

Built on transformers' `Cache` so that `generate` (greedy, sampling, beam reordering) handles it like any other.
The number of tokens seen is counted here, since RNN layers have no length to ask.
"""

from __future__ import annotations

import torch
from transformers.cache_utils import Cache, DynamicLayer, LinearAttentionLayer

from hyla.models.configuration import HEADWISE_LAYER_TYPES, KV_LAYER_TYPES


def _cache_layer(kind: str):
    # Sliding-window layers keep the full key/value history (a DynamicLayer); the layer reads only its window.
    return DynamicLayer() if kind in KV_LAYER_TYPES else LinearAttentionLayer()


class HybridCache(Cache):
    def __init__(self, layer_types: list[str]):
        branches = [kind.removeprefix("hh_") for kind in layer_types if kind in HEADWISE_LAYER_TYPES]
        super().__init__(layers=[_cache_layer(kind) for kind in list(layer_types) + branches])
        self.layer_types = list(layer_types)
        self.seen_tokens = 0
        # SWLA (EME): per layer, per batch row, the open windows' states {window start: [H, K, V]}.
        self.window_states: dict[int, list[dict[int, torch.Tensor]]] = {}

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

    def swla_states(self, layer_idx: int, batch_size: int) -> list[dict[int, torch.Tensor]]:
        """The open SWLA windows of a layer, one dict per batch row (empty before the first call)."""
        return self.window_states.get(layer_idx) or [{} for _ in range(batch_size)]

    def set_swla_states(self, layer_idx: int, states: list[dict[int, torch.Tensor]]) -> None:
        self.window_states[layer_idx] = states

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        super().reorder_cache(beam_idx)
        for layer_idx, states in self.window_states.items():
            self.window_states[layer_idx] = [dict(states[i]) for i in beam_idx.tolist()]

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat every row `repeats` times (several continuations of one cached context)."""
        for layer in self.layers:
            if isinstance(layer, LinearAttentionLayer):
                if layer.is_recurrent_states_initialized[0]:
                    layer.recurrent_states[0] = layer.recurrent_states[0].repeat_interleave(repeats, dim=0)
            elif layer.is_initialized:
                layer.batch_repeat_interleave(repeats)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        for layer in self.layers:
            if isinstance(layer, LinearAttentionLayer):
                if layer.is_recurrent_states_initialized[0]:
                    layer.recurrent_states[0] = layer.recurrent_states[0][indices]
            elif layer.is_initialized:
                layer.batch_select_indices(indices)

    def reset(self) -> None:
        super().reset()
        self.seen_tokens = 0
        self.window_states = {}
