"""A preallocated hybrid cache for fast inference: static KV buffers for attention layers, fp32 recurrent states for
the linear mixers (Lightning, GLA, GDN), and each row's number of cached positions as a device tensor (read inside
captured CUDA graphs).

Rows may hold prompts of different lengths: row b's tokens sit at positions 0 .. length[b] - 1 of its buffers, with
no padding anywhere (a left-padded batch is stripped of its padding when prefilled), so a recurrent state never sees
a padding token and attention never needs a padding mask, only each row's length.

Sliding-window attention layers ("swa", and RoPE attention under EME) keep only their window: a ring of
min(window, max_length) slots where position p sits at slot p % slots. Their keys are cached after RoPE, so the
order of the slots does not matter to attention: a query at position p reads the first min(p + 1, slots) slots,
which hold exactly its window.

Under EME the linear mixers run as SWLA (`hyla.ops.swla`): each such layer keeps a ring of its open windows' states
[B, n, H, D, D], n = ceil(W / S), window start s in slot (s // S) % n."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

# Layers whose keys and values the cache holds: over every position, or over the window's ring ("swa").
KV_CACHE_LAYER_TYPES = ("attention", "attention_rope", "swa")
# Layers with a window of their own (without EME options, the only sliding-window layers).
WINDOW_LAYER_TYPES = ("swa",)
# Layers whose recurrent state [B, H, K, V] the cache holds.
STATE_LAYER_TYPES = ("lightning", "gla", "gdn")


@dataclass
class StaticHybridCache:
    """keys/values: layer index -> [B, Hkv, max_length, D] ([B, Hkv, slots, D] for sliding-window layers);
    states: layer index -> [B, H, D, D] float32 (float64 for a float64 model), under SWLA [B, n, H, D, D];
    length: int64 [B] on the device, the positions cached in each row; window_slots: layer index -> the ring's
    slots, min(window, max_length), of each sliding-window layer."""

    keys: dict[int, torch.Tensor]
    values: dict[int, torch.Tensor]
    states: dict[int, torch.Tensor]
    length: torch.Tensor
    max_length: int
    batch_size: int
    window_slots: dict[int, int] = field(default_factory=dict)

    @classmethod
    def allocate(cls, config, *, batch_size: int, max_length: int, device, dtype: torch.dtype,
                 windows: dict[int, int] | None = None, swla_slots: int | None = None) -> StaticHybridCache:
        """windows: layer index -> window of each sliding-window attention layer (None: the "swa" layers with
        `swa_window`); swla_slots: the SWLA ring's n of every linear-mixer layer (None: one state a layer)."""
        if batch_size < 1 or max_length < 1:
            raise ValueError(f"batch_size and max_length must be >= 1, got {batch_size} and {max_length}")
        unknown = sorted(set(config.layer_types) - set(KV_CACHE_LAYER_TYPES) - set(STATE_LAYER_TYPES))
        if unknown:
            raise ValueError(f"the static cache holds {', '.join(KV_CACHE_LAYER_TYPES + STATE_LAYER_TYPES)} layers, "
                             f"not {unknown}")
        if windows is None:
            windows = {i: config.swa_window for i, kind in enumerate(config.layer_types) if kind in WINDOW_LAYER_TYPES}
        window_slots = {index: min(window, max_length) for index, window in windows.items()}
        state_shape = (batch_size, config.num_attention_heads, config.head_dim, config.head_dim)
        if swla_slots is not None:
            state_shape = state_shape[:1] + (swla_slots,) + state_shape[1:]
        state_dtype = torch.float64 if dtype == torch.float64 else torch.float32
        keys, values, states = {}, {}, {}
        for index, kind in enumerate(config.layer_types):
            if kind in KV_CACHE_LAYER_TYPES:
                slots = window_slots.get(index, max_length)
                kv_shape = (batch_size, config.num_key_value_heads, slots, config.head_dim)
                keys[index] = torch.zeros(kv_shape, device=device, dtype=dtype)
                values[index] = torch.zeros(kv_shape, device=device, dtype=dtype)
            else:
                states[index] = torch.zeros(state_shape, device=device, dtype=state_dtype)
        length = torch.zeros(batch_size, dtype=torch.int64, device=device)
        return cls(keys, values, states, length, max_length, batch_size, window_slots)

    def reset(self) -> None:
        for state in self.states.values():
            state.zero_()
        self.length.zero_()

    def num_bytes(self) -> int:
        tensors = [*self.keys.values(), *self.values.values(), *self.states.values()]
        return sum(t.numel() * t.element_size() for t in tensors)
