"""The call path shared by the linear mixers (Lightning, GLA, GDN): the recurrent state in the cache, or SWLA's
window states when the call's inference options turn EME on (`eme_window`, docs/method.md, "EME")."""

from __future__ import annotations

from collections.abc import Callable

import torch

from hyla.layers.context import MixerContext
from hyla.ops.swla import sliding_window_linear_attention


def run_linear_op(
    op: Callable,
    layer_idx: int,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    context: MixerContext,
    *,
    token_inputs: dict[str, torch.Tensor] | None = None,
    **constants,
) -> torch.Tensor:
    """o [B, T, H, V] of `op` (the `lightning_attention` contract) over this call's tokens, continuing from and
    updating the cache slot `layer_idx`. token_inputs: per-token gate tensors [B, T, ...]; constants: the rest."""
    token_inputs = token_inputs or {}
    # Under autocast the projections come out in bf16 but the q/k RMSNorms (float32 weights) in float32; the fused
    # kernels need one dtype: take the value projection's.
    q, k = q.to(v.dtype), k.to(v.dtype)
    cache, options = context.cache, context.options
    if options.eme_window is not None:
        if context.cu_seqlens is not None:
            raise ValueError("EME (SWLA) runs on unpacked batches: pass documents as rows, not with cu_seqlens")
        states = cache.swla_states(layer_idx, q.shape[0]) if cache is not None else None
        output, states = sliding_window_linear_attention(
            op, q, k, v, window=options.eme_window, stride=options.swla_stride, token_inputs=token_inputs,
            positions=context.position_ids, token_mask=context.token_mask, window_states=states, **constants,
        )
        if cache is not None:
            cache.set_swla_states(layer_idx, states)
        return output
    initial_state = cache.recurrent_state(layer_idx) if cache is not None else None
    output, final_state = op(
        q, k, v, **token_inputs, **constants, initial_state=initial_state, output_final_state=cache is not None,
        cu_seqlens=context.cu_seqlens,
    )
    if cache is not None:
        cache.set_recurrent_state(layer_idx, final_state)
    return output
