"""Single-token attention over a static KV cache, each row's valid length read from a device tensor: the pure-torch
reference (CPU path and test oracle) of `hyla.ops.decode_attention.gpu`."""

from __future__ import annotations

import torch


def row_lengths(length: torch.Tensor | int, batch: int, device: torch.device) -> torch.Tensor:
    """int64 [B] valid positions per row from an int, a scalar tensor (the same for every row) or a [B] tensor."""
    lengths = torch.as_tensor(length, device=device).reshape(-1).long()
    if lengths.numel() not in (1, batch):
        raise ValueError(f"decode attention takes one length or one per row ({batch}), got {lengths.numel()}")
    return lengths.expand(batch)


def decode_attention_reference(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, length: torch.Tensor | int, *, scale: float
) -> torch.Tensor:
    """q: [B, H, D] (one query per row, at position length - 1 of its row); keys, values: [B, Hkv, Tmax, D] (static
    cache, positions >= the row's length ignored); length: int, scalar tensor, or int tensor [B] (per row). Query head
    j uses KV head j // (H / Hkv). Returns [B, H, D] in q's dtype. Masked over the whole buffer, so it never syncs
    with the host."""
    batch, num_heads, head_dim = q.shape
    num_kv_heads, max_length = keys.shape[1], keys.shape[2]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    grouped = q.reshape(batch, num_kv_heads, num_heads // num_kv_heads, head_dim).to(acc)
    scores = torch.einsum("bhgd,bhtd->bhgt", grouped, keys.to(acc)) * scale
    valid = torch.arange(max_length, device=q.device)[None, :] < row_lengths(length, batch, q.device)[:, None]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    output = torch.einsum("bhgt,bhtd->bhgd", torch.softmax(scores, dim=-1), values.to(acc))
    return output.reshape(batch, num_heads, head_dim).to(q.dtype)
