"""Gated delta rule on GPU through flash-linear-attention's `chunk_gated_delta_rule` /
`fused_recurrent_gated_delta_rule` (q/k normalised by the caller, gate and beta already activated).

Imported only when a CUDA tensor asks for it, so that `import hyla` never imports triton.
"""

from __future__ import annotations

import torch


def gdn_fla(
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
    """Same contract as `hyla.ops.gdn.reference.gdn_recurrent`, on CUDA."""
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule, fused_recurrent_gated_delta_rule

    scale = q.shape[-1] ** -0.5 if scale is None else scale
    if initial_state is not None:
        initial_state = initial_state.to(torch.float32)
    if cu_seqlens is not None:
        cu_seqlens = cu_seqlens.to(device=q.device, dtype=torch.long)
    common = dict(
        g=g.to(torch.float32), beta=beta.to(q.dtype), scale=scale, initial_state=initial_state,
        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
    )
    if q.shape[1] == 1 and not torch.is_grad_enabled():
        return fused_recurrent_gated_delta_rule(q, k, v, **common)
    return chunk_gated_delta_rule(q, k, v, **common)
