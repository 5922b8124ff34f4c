"""Pure-torch gated delta rule (GDN, docs/method.md, "Hybrid family"), in fla's convention (state [K, V], row vectors):

    S_t = exp(g_t) S_{t-1} + k_t^T u_t,   u_t = beta_t (v_t - k_t exp(g_t) S_{t-1}),   o_t = scale * q_t S_t

i.e. S_t = exp(g_t) (I - beta_t k_t^T k_t) S_{t-1} + beta_t k_t^T v_t. g: [B, T, H] log-decay (<= 0), beta: [B, T, H]
in (0, 1). Callers L2-normalise q and k (the layer does). `gdn_recurrent` is the definition; `gdn_chunked` the
chunkwise WY form, with u of a chunk from one unit-lower-triangular solve.
"""

from __future__ import annotations

import torch

from hyla.ops.recurrence import DEFAULT_CHUNK_SIZE, run_by_segment


def _token_update(q, k, v, g, beta, state):
    """One token: q (pre-scaled), k [B, H, K]; v [B, H, V]; g, beta [B, H]; state [B, H, K, V] -> (o [B, H, V],
    new state)."""
    # Products and sums rather than einsum: compiled, the update and the read-outs fuse around the state.
    state = g[..., None, None].exp() * state
    predicted = (k[..., None] * state).sum(-2)
    update = beta[..., None] * (v - predicted)
    state = state + k[..., None] * update[..., None, :]
    return (q[..., None] * state).sum(-2), state


def _recurrent_step(q, k, v, g, beta, state):
    # q, k: [B, T, H, K]; v: [B, T, H, V]; g, beta: [B, T, H]; state: [B, H, K, V]
    outputs = []
    for t in range(q.shape[1]):
        o, state = _token_update(q[:, t], k[:, t], v[:, t], g[:, t], beta[:, t], state)
        outputs.append(o)
    o = torch.stack(outputs, dim=1) if outputs else v.new_zeros(v.shape)
    return o, state


def gdn_decode_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    g: torch.Tensor,
    beta: torch.Tensor,
    state: torch.Tensor,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of `gdn_recurrent` for every row, without its batching driver (no host reads: a decode step that a
    CUDA graph can capture). q, k: [B, H, K]; v: [B, H, V]; g, beta: [B, H]; state: [B, H, K, V] float32 (float64 for
    float64 inputs). Returns (o [B, H, V] in v's dtype, the new state in the state's dtype)."""
    acc = state.dtype
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    o, state = _token_update(q.to(acc) * scale, k.to(acc), v.to(acc), g.to(acc), beta.to(acc), state)
    return o.to(v.dtype), state


def _chunk(qc, kc, vc, gc, bc, state):
    """One chunk: returns (o [B, C, H, V], state at the chunk end)."""
    length = qc.shape[1]
    cum = gc.cumsum(dim=1)  # G_i, [B, C, H]
    lower = torch.ones(length, length, dtype=torch.bool, device=qc.device).tril()
    lag = cum[:, :, None] - cum[:, None, :]  # G_i - G_j, [B, i, j, H]
    decay = torch.where(lower[None, :, :, None], lag, float("-inf")).exp()
    # u_i = beta_i (v_i - e^{G_i} k_i S0 - sum_{j<i} e^{G_i - G_j} (k_i . k_j) u_j): (I + A) u = rhs
    kk = torch.einsum("bihk,bjhk->bhij", kc, kc) * decay.permute(0, 3, 1, 2)
    strict = kk.tril(diagonal=-1) * bc.permute(0, 2, 1)[..., None]
    eye = torch.eye(length, dtype=qc.dtype, device=qc.device)
    predicted = torch.einsum("bihk,bhkv->bhiv", kc * cum.exp()[..., None], state)
    rhs = bc.permute(0, 2, 1)[..., None] * (vc.permute(0, 2, 1, 3) - predicted)
    u = torch.linalg.solve_triangular(eye + strict, rhs, upper=False, unitriangular=True)  # [B, H, C, V]
    qk = torch.einsum("bihk,bjhk->bhij", qc, kc) * decay.permute(0, 3, 1, 2)
    o = torch.einsum("bhij,bhjv->bihv", qk, u)
    o = o + torch.einsum("bihk,bhkv->bihv", qc * cum.exp()[..., None], state)
    total = cum[:, -1]  # [B, H]
    key_decay = (total[:, None] - cum).exp()[..., None]
    state = total.exp()[..., None, None] * state + torch.einsum("bjhk,bhjv->bhkv", kc * key_decay, u)
    return o, state


def _chunked_step(q, k, v, g, beta, state, chunk_size=DEFAULT_CHUNK_SIZE):
    outputs = []
    for start in range(0, q.shape[1], chunk_size):
        o, state = _chunk(*(x[:, start : start + chunk_size] for x in (q, k, v, g, beta)), state)
        outputs.append(o)
    o = torch.cat(outputs, dim=1) if outputs else v.new_zeros(v.shape)
    return o, state


def gdn_recurrent(
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
    """Token-by-token form. q, k: [B, T, H, K]; v: [B, T, H, V]; g (log-decay <= 0), beta: [B, T, H];
    initial_state: [N, H, K, V] (N = B, or the number of packed sequences); returns o [B, T, H, V] and the final
    state [N, H, K, V] (float32, float64 for float64 inputs) when asked."""
    return run_by_segment(
        _recurrent_step, q, k, v, (g, beta),
        scale=scale, initial_state=initial_state, output_final_state=output_final_state, cu_seqlens=cu_seqlens,
    )


def gdn_chunked(
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
    """Chunkwise form of `gdn_recurrent` (same arguments, same results)."""
    return run_by_segment(
        _chunked_step, q, k, v, (g, beta),
        scale=scale, initial_state=initial_state, output_final_state=output_final_state, cu_seqlens=cu_seqlens,
    )
