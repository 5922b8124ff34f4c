"""What every token mixer receives beside its hidden states."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from hyla.models.cache import HybridCache


@dataclass
class MixerContext:
    """position_ids: [B, T] absolute positions of the current tokens (per row, padding excluded).
    rope: (cos, sin) [B, T, head_dim] for those positions.
    token_mask: bool [B, T], False at padding of the current tokens; None when there is no padding.
    key_mask: bool [B, Tk], False at padding over cached + current keys; None when there is no padding.
    cu_seqlens: [N + 1] boundaries of packed documents (batch of one), or None.
    cache: the hybrid cache to read and update, or None."""

    position_ids: torch.Tensor
    rope: tuple[torch.Tensor, torch.Tensor]
    token_mask: torch.Tensor | None = None
    key_mask: torch.Tensor | None = None
    cu_seqlens: torch.Tensor | None = None
    cache: HybridCache | None = None
