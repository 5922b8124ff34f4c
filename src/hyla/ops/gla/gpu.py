"""GLA on GPU through flash-linear-attention's `chunk_gla` / `fused_recurrent_gla`.

Imported only when a CUDA tensor asks for it, so that `import hyla` never imports triton.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# fla's chunk_gla takes its chunk size from the call's length, min(64, max(16, next power of two of T)): 16 or 32
# below 33 tokens. On the H200 with Triton 3.6 a float32 call at chunk 32 faulted (misaligned address) while fla
# autotuned its output kernel; lengths from 33 run at chunk 64. Shorter chunked calls are padded to 64 tokens, so
# that fla's GLA runs at chunk 64 only (docs/method.md, "Kernel notes").
FLA_GLA_CHUNK = 64


def pad_to_one_chunk(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, cu_seqlens: torch.Tensor | None,
    *, length: int = FLA_GLA_CHUNK,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """q, k, g [B, T, H, K] and v [B, T, H, V] with zeros appended along T up to `length` tokens (T < length), and
    cu_seqlens [N + 1] with the last sequence taking them. A zero key and value write nothing into the state and a
    zero log-gate decays nothing, so every real token's output, each sequence's final state and every gradient are
    those of the unpadded call; the caller keeps the first T outputs."""
    pad = (0, 0, 0, 0, 0, length - q.shape[1])
    q, k, v, g = (F.pad(x, pad) for x in (q, k, v, g))
    if cu_seqlens is not None:
        cu_seqlens = torch.cat([cu_seqlens[:-1], cu_seqlens.new_tensor([length])])
    return q, k, v, g, cu_seqlens


def gla_fla(
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
    """Same contract as `hyla.ops.gla.reference.gla_recurrent`, on CUDA."""
    from fla.ops.gla import chunk_gla, fused_recurrent_gla

    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if initial_state is not None:
        initial_state = initial_state.to(torch.float32)
    if cu_seqlens is not None:
        cu_seqlens = cu_seqlens.to(device=q.device, dtype=torch.long)
    # The gate is kept in float32: a bfloat16 log-gate summed over a chunk loses the small decays.
    g = g.to(torch.float32)
    common = dict(scale=scale, initial_state=initial_state, output_final_state=output_final_state)
    length = q.shape[1]
    if length == 1 and not torch.is_grad_enabled():
        return fused_recurrent_gla(q, k, v, gk=g, cu_seqlens=cu_seqlens, **common)
    if length >= FLA_GLA_CHUNK:
        return chunk_gla(q, k, v, g=g, cu_seqlens=cu_seqlens, **common)
    q, k, v, g, cu_seqlens = pad_to_one_chunk(q, k, v, g, cu_seqlens)
    output, final_state = chunk_gla(q, k, v, g=g, cu_seqlens=cu_seqlens, **common)
    return output[:, :length].contiguous(), final_state
