"""RoPE softmax attention layers (docs/method.md, "Hybrid family"): full RoPE attention ("attention_rope") and
sliding-window attention ("swa", window `swa_window`). Both are the `Attention` layer with RoPE on. Full RoPE
attention keeps the per-query logit scaling s_t when the model sets a, but not EME's c(L), which is for NoPE; under
EME (`eme_window`) it becomes sliding-window attention with that window. SWA keeps its own window and scales no
logits. The cache keeps every key (a full DynamicLayer); each call reads only the window it needs.
"""

from __future__ import annotations

import torch

from hyla.layers.attention import Attention
from hyla.layers.context import InferenceOptions, MixerContext


class RopeAttention(Attention):
    use_rope = True


class SlidingWindowAttention(RopeAttention):
    def logit_scale(self, context: MixerContext) -> torch.Tensor | None:
        return None

    def window(self, options: InferenceOptions) -> int:
        """A query sees itself and the `swa_window` - 1 keys before it."""
        return self.config.swa_window
