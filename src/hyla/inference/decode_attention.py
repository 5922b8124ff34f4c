"""Single-token attention over a static KV cache whose valid length is a device tensor (graph-safe).

The length lives on the device so that one captured CUDA graph serves every decode step: the kernel reads it, and no
host synchronisation or re-capture is needed as the cache grows. SDPA cannot do this without an explicit mask, and a
mask sends it to its math backend (~30x slower at 512K, docs/method.md, "Reference GPU").
"""

from __future__ import annotations

import importlib.util

import torch

from hyla.ops.dispatch import current_backend


def decode_attention_reference(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, length: torch.Tensor | int, *, scale: float
) -> torch.Tensor:
    """q: [B, H, D] (one query per row, at position length - 1); keys, values: [B, Hkv, Tmax, D] (static cache,
    positions >= length ignored); length: int or int tensor (scalar) of valid positions. Query head j uses KV head
    j // (H / Hkv). Returns [B, H, D] in q's dtype. Masked over the whole buffer, so it never syncs with the host."""
    batch, num_heads, head_dim = q.shape
    num_kv_heads, max_length = keys.shape[1], keys.shape[2]
    acc = torch.float64 if q.dtype == torch.float64 else torch.float32
    grouped = q.reshape(batch, num_kv_heads, num_heads // num_kv_heads, head_dim).to(acc)
    scores = torch.einsum("bhgd,bhtd->bhgt", grouped, keys.to(acc)) * scale
    valid = torch.arange(max_length, device=q.device) < torch.as_tensor(length, device=q.device)
    scores = scores.masked_fill(~valid, float("-inf"))
    output = torch.einsum("bhgt,bhtd->bhgd", torch.softmax(scores, dim=-1), values.to(acc))
    return output.reshape(batch, num_heads, head_dim).to(q.dtype)


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def decode_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, length: torch.Tensor, *, scale: float
) -> torch.Tensor:
    """Same contract as `decode_attention_reference`; a Triton split-K flash-decoding kernel on CUDA."""
    if q.is_cuda and current_backend() != "torch" and triton_available():
        from hyla.inference.decode_triton import decode_attention_triton

        return decode_attention_triton(q, keys, values, length, scale=scale)
    return decode_attention_reference(q, keys, values, length, scale=scale)
