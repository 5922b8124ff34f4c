"""GLA on GPU through flash-linear-attention's `chunk_gla` / `fused_recurrent_gla`.

Imported only when a CUDA tensor asks for it, so that `import hyla` never imports triton.
"""

from __future__ import annotations

import torch


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
    common = dict(scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                  cu_seqlens=cu_seqlens)
    if q.shape[1] == 1 and not torch.is_grad_enabled():
        return fused_recurrent_gla(q, k, v, gk=g, **common)
    return chunk_gla(q, k, v, g=g, **common)
