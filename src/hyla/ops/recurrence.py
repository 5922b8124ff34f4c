"""The batching and packing driver shared by the pure-torch linear-attention references (Lightning, GLA, GDN):
a `step` function runs one sequence batch from a state; this applies it to the batch, or to each packed sequence."""

from __future__ import annotations

from collections.abc import Callable

import torch

DEFAULT_CHUNK_SIZE = 64


def accumulation_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


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
