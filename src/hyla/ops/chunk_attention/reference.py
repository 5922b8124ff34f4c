"""Softmax attention that also returns its log-sum-exp, written out in torch: the reference (CPU path and test
oracle) of the fused kernels in `hyla.ops.chunk_attention.gpu`."""

from __future__ import annotations

import torch

# Scores materialised at once: queries go through in tiles so that a tile's [B, H, tile, Tk] scores stay under this
# many elements (a 64K prompt would otherwise hold 64K x 64K scores per head).
_MAX_SCORES = 2**27


def attention_with_lse_reference(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """q: [B, H, Tq, D], k/v: [B, H, Tk, D] (same heads); causal means top-left aligned (Tq == Tk here).
    Returns (output [B, H, Tq, D] in q's dtype, natural-log log-sum-exp [B, H, Tq] in float32, float64 for
    float64)."""
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    batch, heads, query_length = q.shape[:3]
    key_length = k.shape[2]
    tile = max(1, _MAX_SCORES // max(1, batch * heads * key_length))
    keys, values = k.to(acc), v.to(acc)
    outputs, lses = [], []
    for first in range(0, query_length, tile):
        queries = q[:, :, first : first + tile].to(acc)
        scores = torch.einsum("bhid,bhjd->bhij", queries, keys) * scale
        if causal:
            rows = torch.arange(first, first + queries.shape[2], device=q.device)[:, None]
            scores = scores.masked_fill(torch.arange(key_length, device=q.device)[None, :] > rows, float("-inf"))
        lse = torch.logsumexp(scores, dim=-1)
        outputs.append(torch.einsum("bhij,bhjd->bhid", torch.exp(scores - lse[..., None]), values).to(q.dtype))
        lses.append(lse)
    return torch.cat(outputs, dim=2), torch.cat(lses, dim=2)


def merge_attention(
    first: torch.Tensor, first_lse: torch.Tensor, second: torch.Tensor, second_lse: torch.Tensor
) -> torch.Tensor:
    """Exact softmax over the union of two disjoint key sets, from each part's output and log-sum-exp."""
    total = torch.logaddexp(first_lse, second_lse)
    weight_first = torch.exp(first_lse - total)[..., None]
    weight_second = torch.exp(second_lse - total)[..., None]
    return (first.to(total.dtype) * weight_first + second.to(total.dtype) * weight_second).to(first.dtype)
