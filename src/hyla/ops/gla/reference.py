"""Pure-torch GLA (gated linear attention with a data-dependent diagonal gate, docs/method.md, "Hybrid family").

    S_t = Diag(exp(g_t)) S_{t-1} + k_t^T v_t,      o_t = scale * q_t S_t

g_t: [K] log-gates (<= 0) per token and head. Two forms with one signature: `gla_recurrent` (token by token, the
definition) and `gla_chunked` (chunkwise-parallel, the CPU path). Both accumulate in float32 (float64 for float64
inputs); `hyla.ops.recurrence.run_by_segment` batches and packs them.
"""

from __future__ import annotations

import torch

from hyla.ops.recurrence import DEFAULT_CHUNK_SIZE, run_by_segment


def _token_update(q, k, v, g, state):
    """One token: q (pre-scaled), k, g [B, H, K]; v [B, H, V]; state [B, H, K, V] -> (o [B, H, V], new state)."""
    # Products and sums rather than einsum: compiled, the update and the read-out are one pass over the state.
    state = g[..., None].exp() * state + k[..., None] * v[..., None, :]
    return (q[..., None] * state).sum(-2), state


def _recurrent_step(q, k, v, g, state):
    # q, k, g: [B, T, H, K]; v: [B, T, H, V]; state: [B, H, K, V]
    outputs = []
    for t in range(q.shape[1]):
        o, state = _token_update(q[:, t], k[:, t], v[:, t], g[:, t], state)
        outputs.append(o)
    o = torch.stack(outputs, dim=1) if outputs else v.new_zeros(v.shape)
    return o, state


def gla_decode_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    g: torch.Tensor,
    state: torch.Tensor,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of `gla_recurrent` for every row, without its batching driver (no host reads: a decode step that a
    CUDA graph can capture). q, k, g: [B, H, K]; v: [B, H, V]; state: [B, H, K, V] float32 (float64 for float64
    inputs). Returns (o [B, H, V] in v's dtype, the new state in the state's dtype)."""
    acc = state.dtype
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    o, state = _token_update(q.to(acc) * scale, k.to(acc), v.to(acc), g.to(acc), state)
    return o.to(v.dtype), state


def _chunked_step(q, k, v, g, state, chunk_size=DEFAULT_CHUNK_SIZE):
    outputs = []
    for start in range(0, q.shape[1], chunk_size):
        qc, kc, vc, gc = (x[:, start : start + chunk_size] for x in (q, k, v, g))
        length = qc.shape[1]
        # G_i = sum_{j <= i} g_j inside the chunk; every exponent below is a difference G_i - G_j <= 0 (i >= j)
        cum = gc.cumsum(dim=1)
        causal = torch.ones(length, length, dtype=torch.bool, device=q.device).tril()
        lag = cum[:, :, None] - cum[:, None, :]  # [B, i, j, H, K]
        decay = torch.where(causal[None, :, :, None, None], lag, float("-inf")).exp()
        scores = torch.einsum("bihk,bjhk,bijhk->bhij", qc, kc, decay)
        intra = torch.einsum("bhij,bjhv->bihv", scores, vc)
        carried = torch.einsum("bihk,bhkv->bihv", qc * cum.exp(), state)
        outputs.append(intra + carried)
        total = cum[:, -1]  # [B, H, K]
        key_decay = (total[:, None] - cum).exp()
        state = total[..., None].exp() * state + torch.einsum("bjhk,bjhv->bhkv", kc * key_decay, vc)
    o = torch.cat(outputs, dim=1) if outputs else v.new_zeros(v.shape)
    return o, state


def gla_recurrent(
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
    """Token-by-token form. q, k, g: [B, T, H, K] (g = log-gates <= 0); v: [B, T, H, V];
    initial_state: [N, H, K, V] (N = B, or the number of packed sequences); returns o [B, T, H, V] and the final
    state [N, H, K, V] (float32, float64 for float64 inputs) when asked."""
    return run_by_segment(
        _recurrent_step, q, k, v, (g,),
        scale=scale, initial_state=initial_state, output_final_state=output_final_state, cu_seqlens=cu_seqlens,
    )


def gla_chunked(
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
    """Chunkwise-parallel form of `gla_recurrent` (same arguments, same results)."""
    return run_by_segment(
        _chunked_step, q, k, v, (g,),
        scale=scale, initial_state=initial_state, output_final_state=output_final_state, cu_seqlens=cu_seqlens,
    )
