"""GLA (gated linear attention, data-dependent diagonal gate, docs/method.md, "Hybrid family"): dispatch between the fla
kernels and the pure-torch reference."""

from __future__ import annotations

import torch

from hyla.ops.dispatch import resolve_backend
from hyla.ops.gla.reference import gla_chunked, gla_decode_step, gla_recurrent


def gla_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    g: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """o_t = scale * q_t S_t with S_t = Diag(exp(g_t)) S_{t-1} + k_t^T v_t.

    q, k, g: [B, T, H, K]; v: [B, T, H, V]; initial_state: [N, H, K, V] float32; cu_seqlens: [N + 1] boundaries of
    packed sequences (B = 1). Returns (o [B, T, H, V], final state or None).
    """
    kwargs = dict(
        g=g, scale=scale, initial_state=initial_state, output_final_state=output_final_state, cu_seqlens=cu_seqlens
    )
    if resolve_backend(q) == "fla":
        from hyla.ops.gla.gpu import gla_fla

        return gla_fla(q, k, v, **kwargs)
    if q.shape[1] == 1:
        return gla_recurrent(q, k, v, **kwargs)
    return gla_chunked(q, k, v, **kwargs)


__all__ = ["gla_attention", "gla_chunked", "gla_decode_step", "gla_recurrent"]
