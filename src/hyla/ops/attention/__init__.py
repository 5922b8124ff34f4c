"""Softmax attention (GQA, causal, optional mask) through torch's scaled_dot_product_attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hyla.ops.attention.reference import softmax_attention_reference
from hyla.ops.dispatch import resolve_backend


def causal_mask(
    query_length: int, key_length: int, *, device: torch.device, window: int | None = None
) -> torch.Tensor:
    """bool [Tq, Tk]: query i (at key position p = Tk - Tq + i) may attend to keys at or before it, and with a
    window W only to those after p - W."""
    offset = key_length - query_length
    ones = torch.ones(query_length, key_length, dtype=torch.bool, device=device)
    allowed = ones.tril(diagonal=offset)
    if window is not None:
        allowed = allowed & ~ones.tril(diagonal=offset - window)
    return allowed


def softmax_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    scale: float | None = None,
    causal: bool = True,
    attention_mask: torch.Tensor | None = None,
    window: int | None = None,
) -> torch.Tensor:
    """Same contract as `softmax_attention_reference`: q [B, Tq, H, D], k/v [B, Tk, Hkv, D] -> [B, Tq, H, D].

    Without a mask SDPA can use its flash/cuDNN kernels: full causal when Tq == Tk, no mask at all for a single
    query over a cache. Other shapes and padding masks build an explicit boolean mask. A sliding window (causal
    only) runs fla's `parallel_attn(window_size=W)` on CUDA for unmasked prefill, otherwise a windowed mask.
    """
    query_length, key_length = q.shape[1], k.shape[1]
    if window is not None:
        if window < 1 or not causal:
            raise ValueError(f"a sliding window needs causal attention and window >= 1, got {window}")
        if key_length <= window:
            window = None
        elif attention_mask is None and query_length == key_length and resolve_backend(q) == "fla":
            from fla.ops.attn import parallel_attn

            # Under autocast q and k leave RoPE in float32 while v is bf16; fla's kernel needs one dtype.
            return parallel_attn(q.to(v.dtype), k.to(v.dtype), v, scale=scale, window_size=window)
    mask = attention_mask
    is_causal = False
    if causal:
        if mask is None and query_length == key_length and window is None:
            is_causal = True
        elif mask is None and query_length == 1 and window is None:
            pass
        else:
            allowed = causal_mask(query_length, key_length, device=q.device, window=window)[None, None]
            mask = allowed if mask is None else mask & allowed
    if mask is not None:
        # A query row with nothing to attend to (left padding before the first real token) would give NaN; let it
        # see its own key: its output is discarded by the caller anyway.
        empty_rows = ~mask.any(dim=-1, keepdim=True)
        if bool(empty_rows.any()):
            mask = mask | (empty_rows & _diagonal(query_length, key_length, q.device))
    grouped = q.shape[2] != k.shape[2]
    if (grouped and q.is_cuda and q.dtype == torch.float32 and not torch.is_autocast_enabled("cuda")
            and query_length > 2 * q.shape[-1]):
        # SDPA's kernel with grouped-query support (flash) takes fp16/bf16 only: in float32, enable_gqa leaves the
        # math path, which holds float32 [B, H, Tq, Tk] scores (36 GiB for 9 heads at 32K). With k/v repeated to
        # every query head the memory-efficient kernel runs instead. The copies hold [B, H, Tk, 2D]: worth it only
        # where the scores would be larger (Tq > 2D), not for decode steps over a cache.
        groups = q.shape[2] // k.shape[2]
        k, v, grouped = k.repeat_interleave(groups, dim=2), v.repeat_interleave(groups, dim=2), False
    output = F.scaled_dot_product_attention(
        q.transpose(1, 2),
        k.transpose(1, 2),
        v.transpose(1, 2),
        attn_mask=mask,
        is_causal=is_causal,
        scale=scale,
        enable_gqa=grouped,
    )
    return output.transpose(1, 2)


def _diagonal(query_length: int, key_length: int, device: torch.device) -> torch.Tensor:
    """bool [Tq, Tk]: each query's own key position."""
    offset = key_length - query_length
    eye = torch.zeros(query_length, key_length, dtype=torch.bool, device=device)
    eye[torch.arange(query_length), torch.arange(query_length) + offset] = True
    return eye


__all__ = ["causal_mask", "softmax_attention", "softmax_attention_reference"]
