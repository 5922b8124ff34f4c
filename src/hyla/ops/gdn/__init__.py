"""Gated delta rule (GDN, docs/method.md, "Hybrid family"): dispatch between the fla kernels and the pure-torch
reference."""

from __future__ import annotations

import torch

from hyla.ops.dispatch import resolve_backend
from hyla.ops.gdn.reference import gdn_chunked, gdn_decode_step, gdn_recurrent


def gdn_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """o_t = scale * q_t S_t with S_t = exp(g_t) (I - beta_t k_t^T k_t) S_{t-1} + beta_t k_t^T v_t.

    q, k: [B, T, H, K] (L2-normalised by the caller); v: [B, T, H, V]; g, beta: [B, T, H]; initial_state:
    [N, H, K, V] float32; cu_seqlens: [N + 1] (B = 1). Returns (o [B, T, H, V], final state or None).
    """
    kwargs = dict(
        g=g, beta=beta, scale=scale, initial_state=initial_state, output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
    )
    if resolve_backend(q) == "fla":
        from hyla.ops.gdn.gpu import gdn_fla

        return gdn_fla(q, k, v, **kwargs)
    if q.shape[1] == 1:
        return gdn_recurrent(q, k, v, **kwargs)
    return gdn_chunked(q, k, v, **kwargs)


__all__ = ["gdn_attention", "gdn_chunked", "gdn_decode_step", "gdn_recurrent"]
