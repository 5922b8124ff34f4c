"""Pure-torch Lightning attention: a linear-attention RNN with a fixed per-head decay (docs/method.md, "Lightning
layer").

    S_t = exp(g_h) * S_{t-1} + k_t^T v_t,      o_t = scale * q_t S_t

Two forms with one signature: `lightning_recurrent` (token by token, the definition) and `lightning_chunked`
(chunkwise-parallel, the CPU path). Both accumulate in float32 (float64 for float64 inputs) and return the state
in that precision.
"""

from __future__ import annotations

import torch

from hyla.ops.recurrence import DEFAULT_CHUNK_SIZE, accumulation_dtype, run_by_segment


def _run(step, q, k, v, log_decay, scale, initial_state, output_final_state, cu_seqlens):
    """`step(q, k, v, g, state)` with the fixed per-head log-decay g, through the shared batching/packing driver."""
    g = log_decay.to(device=q.device, dtype=accumulation_dtype(q.dtype))
    return run_by_segment(
        lambda q, k, v, state: step(q, k, v, g, state), q, k, v, (),
        scale=scale, initial_state=initial_state, output_final_state=output_final_state, cu_seqlens=cu_seqlens,
    )


def _recurrent_step(q, k, v, g, state):
    # q, k: [B, T, H, K]; v: [B, T, H, V]; state: [B, H, K, V]
    gamma = g.exp()[:, None, None]
    outputs = []
    for t in range(q.shape[1]):
        state = gamma * state + k[:, t, :, :, None] * v[:, t, :, None, :]
        outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], state))
    o = torch.stack(outputs, dim=1) if outputs else v.new_zeros(v.shape)
    return o, state


def _chunked_step(q, k, v, g, state, chunk_size=DEFAULT_CHUNK_SIZE):
    outputs = []
    for start in range(0, q.shape[1], chunk_size):
        qc, kc, vc = (x[:, start : start + chunk_size] for x in (q, k, v))
        length = qc.shape[1]
        steps = torch.arange(length, device=q.device, dtype=g.dtype)
        # decay[h, i, j] = exp(g_h (i - j)) for i >= j: the lag inside the chunk
        lag = steps[:, None] - steps[None, :]
        decay = torch.exp(g[:, None, None] * lag.clamp(min=0)) * (lag >= 0)
        scores = torch.einsum("bihk,bjhk->bhij", qc, kc) * decay
        intra = torch.einsum("bhij,bjhv->bihv", scores, vc)
        # query i sees the carried state decayed i + 1 times
        query_decay = torch.exp(g[None, :] * (steps[:, None] + 1))[None, :, :, None]
        carried = torch.einsum("bihk,bhkv->bihv", qc * query_decay, state)
        outputs.append(intra + carried)
        # key j reaches the chunk end decayed (length - 1 - j) times
        key_decay = torch.exp(g[None, :] * (length - 1 - steps)[:, None])[None, :, :, None]
        state = torch.exp(g * length)[None, :, None, None] * state + torch.einsum(
            "bjhk,bjhv->bhkv", kc * key_decay, vc
        )
    o = torch.cat(outputs, dim=1) if outputs else v.new_zeros(v.shape)
    return o, state


def lightning_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    log_decay: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Token-by-token form. q, k: [B, T, H, K]; v: [B, T, H, V]; log_decay: [H] (<= 0);
    initial_state: [N, H, K, V] (N = B, or the number of packed sequences); returns o [B, T, H, V] and
    the final state [N, H, K, V] (float32, float64 for float64 inputs) when asked."""
    return _run(_recurrent_step, q, k, v, log_decay, scale, initial_state, output_final_state, cu_seqlens)


def lightning_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    log_decay: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Chunkwise-parallel form of `lightning_recurrent` (same arguments, same results)."""
    return _run(_chunked_step, q, k, v, log_decay, scale, initial_state, output_final_state, cu_seqlens)


def lightning_decode_step(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    decay: torch.Tensor,
    state: torch.Tensor,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token of `lightning_recurrent` for every row, without its batching driver (no host reads: a decode step
    that a CUDA graph can capture). q, k: [B, H, K]; v: [B, H, V]; decay: [H, 1, 1] = exp(log-decay) in the state's
    dtype; state: [B, H, K, V] float32 (float64 for float64 inputs). Returns (o [B, H, V] in v's dtype, the new
    state in the state's dtype)."""
    acc = state.dtype
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    # A product and a sum rather than a batched matrix-vector product: compiled, the update and q S are one kernel
    # that reads the state once.
    updated = state * decay + k[..., :, None].to(acc) * v[..., None, :].to(acc)
    output = (q[..., :, None].to(acc) * updated).sum(-2) * scale
    return output.to(v.dtype), updated
