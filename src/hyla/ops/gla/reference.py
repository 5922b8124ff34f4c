"""Pure-torch GLA (gated linear attention with a data-dependent diagonal gate, SPEC §3).

    S_t = Diag(exp(g_t)) S_{t-1} + k_t^T v_t,      o_t = scale * q_t S_t

g_t: [K] log-gates (<= 0) per token and head. Two forms with one signature: `gla_recurrent` (token by token, the
definition) and `gla_chunked` (chunkwise-parallel, the CPU path). Both accumulate in float32 (float64 for float64
inputs). `run_by_segment` is the batching/packing driver shared with the other gated linear ops.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from hyla.ops.lightning.reference import DEFAULT_CHUNK_SIZE, accumulation_dtype


def packed_segments(batch: int, length: int, cu_seqlens: torch.Tensor | None) -> list[slice]:
    """Time slices of the packed sequences of a batch of one (one slice covering all when not packed)."""
    if cu_seqlens is None:
        return [slice(None)]
    if batch != 1:
        raise ValueError(f"packed sequences (cu_seqlens) need batch size 1, got {batch}")
    bounds = cu_seqlens.tolist()
    if bounds[0] != 0 or bounds[-1] != length or any(b > e for b, e in zip(bounds, bounds[1:])):
        raise ValueError(f"cu_seqlens must rise from 0 to T={length}, got {bounds}")
    return [slice(b, e) for b, e in zip(bounds, bounds[1:])]


def run_by_segment(
    step: Callable,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    gates: tuple[torch.Tensor, ...],
    *,
    scale: float | None,
    initial_state: torch.Tensor | None,
    output_final_state: bool,
    cu_seqlens: torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Apply `step(q, k, v, *gates, state) -> (o, state)` (per-token tensors [B, T, H, ...], state [B, H, K, V]) to
    the whole batch, or to each packed sequence as a batch of one. q is pre-multiplied by the scale."""
    batch, length, num_heads, key_dim = q.shape
    value_dim = v.shape[-1]
    acc = accumulation_dtype(q.dtype)
    scale = key_dim**-0.5 if scale is None else scale
    segments = packed_segments(batch, length, cu_seqlens)
    num_states = batch if cu_seqlens is None else len(segments)
    if initial_state is not None and tuple(initial_state.shape) != (num_states, num_heads, key_dim, value_dim):
        raise ValueError(
            f"initial_state must be [{num_states}, {num_heads}, {key_dim}, {value_dim}], "
            f"got {list(initial_state.shape)}"
        )
    states = (
        initial_state.to(acc)
        if initial_state is not None
        else q.new_zeros(num_states, num_heads, key_dim, value_dim, dtype=acc)
    )
    outputs, final_states = [], []
    for index, time in enumerate(segments):
        state = states if cu_seqlens is None else states[index : index + 1]
        pieces = [x[:, time].to(acc) for x in (q, k, v, *gates)]
        pieces[0] = pieces[0] * scale
        o, state = step(*pieces, state)
        outputs.append(o.to(v.dtype))
        final_states.append(state)
    output = torch.cat(outputs, dim=1)
    final_state = torch.cat(final_states) if output_final_state else None
    return output, final_state


def _recurrent_step(q, k, v, g, state):
    # q, k, g: [B, T, H, K]; v: [B, T, H, V]; state: [B, H, K, V]
    outputs = []
    for t in range(q.shape[1]):
        state = g[:, t, :, :, None].exp() * state + k[:, t, :, :, None] * v[:, t, :, None, :]
        outputs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], state))
    o = torch.stack(outputs, dim=1) if outputs else v.new_zeros(v.shape)
    return o, state


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
