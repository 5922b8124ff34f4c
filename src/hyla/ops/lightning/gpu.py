"""Lightning attention on GPU through flash-linear-attention's simple-GLA kernels with our own fixed decay.

Imported only when a CUDA tensor asks for it, so that `import hyla` never imports triton.
"""

from __future__ import annotations

import torch

# fla's chunk kernel returns a NaN final state when |log-decay| per token exceeds ~1.41 and T is not a multiple of
# its chunk size (docs/method.md, "Kernel notes"); such decays go to the recurrent kernel instead.
_CHUNK_SAFE_LOG_DECAY = 1.4


def lightning_fla(
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
    """Same contract as `hyla.ops.lightning.reference.lightning_recurrent`, on CUDA."""
    from fla.ops.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla

    scale = q.shape[-1] ** -0.5 if scale is None else scale
    g_gamma = log_decay.to(device=q.device, dtype=torch.float32)
    if initial_state is not None:
        initial_state = initial_state.to(torch.float32)
    if cu_seqlens is not None:
        cu_seqlens = cu_seqlens.to(device=q.device, dtype=torch.long)
    single_token = q.shape[1] == 1 and not torch.is_grad_enabled()
    unsafe_chunk = bool((g_gamma.abs() > _CHUNK_SAFE_LOG_DECAY).any())
    kernel = fused_recurrent_simple_gla if (single_token or unsafe_chunk) else chunk_simple_gla
    output, final_state = kernel(
        q,
        k,
        v,
        g_gamma=g_gamma,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
    )
    return output, final_state
