"""RoPE softmax attention layers (docs/method.md, "Hybrid family"): full RoPE attention ("attention_rope") and
sliding-window attention ("swa", window `sliding_window`). Both are the `Attention` layer with RoPE always on and no
NoPE logit scaling; under EME (`eme_window`) full RoPE attention becomes sliding-window attention with that window,
while SWA keeps its own window. The cache keeps every key (a full DynamicLayer); each call reads only the window it
needs.
"""

from __future__ import annotations

from hyla.layers.attention import Attention


class RopeAttention(Attention):
    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.use_rope = True
        self.scales_logits = False


class SlidingWindowAttention(RopeAttention):
    def window(self) -> int:
        """A query sees itself and the `sliding_window` - 1 keys before it."""
        return self.config.sliding_window
