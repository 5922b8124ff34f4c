"""Softmax attention written out (einsum + softmax): the oracle for the SDPA path."""

from __future__ import annotations

import torch


def softmax_attention_reference(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    causal: bool = True,
    attention_mask: torch.Tensor | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """q: [B, Tq, H, D]; k, v: [B, Tk, Hkv, D] (H a multiple of Hkv; query head j uses KV head j // (H/Hkv));
    attention_mask: bool [B, 1, Tq, Tk], True = may attend. Causal alignment puts the queries at the end of the
    keys (query i sits at key position Tk - Tq + i); window W (causal only) keeps the keys at positions p - W < j <= p
    of the query at p. Returns [B, Tq, H, D] in q's dtype."""
    groups = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(groups, dim=2)
    v = v.repeat_interleave(groups, dim=2)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    scores = torch.einsum("bihd,bjhd->bhij", q.to(acc), k.to(acc)) * scale
    allowed = torch.ones(scores.shape[-2:], dtype=torch.bool, device=q.device)
    if causal:
        offset = k.shape[1] - q.shape[1]
        allowed = torch.ones_like(allowed).tril(diagonal=offset)
        if window is not None:
            allowed = allowed & ~torch.ones_like(allowed).tril(diagonal=offset - window)
    allowed = allowed[None, None] if attention_mask is None else allowed & attention_mask
    scores = scores.masked_fill(~allowed, float("-inf"))
    weights = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    return torch.einsum("bhij,bjhd->bihd", weights, v.to(acc)).to(q.dtype)
