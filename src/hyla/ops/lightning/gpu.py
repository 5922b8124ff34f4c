"""Lightning attention on GPU through flash-linear-attention's simple-GLA kernels with our own fixed decay.

Imported only when a CUDA tensor asks for it, so that `import hyla` never imports triton.
"""

from __future__ import annotations

import torch

from hyla.ops.lightning import decay_is_chunk_safe


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
    chunk_safe: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Same contract as `hyla.ops.lightning.reference.lightning_recurrent`, on CUDA. chunk_safe: whether every
    |log-decay| is within the chunk kernel's range, when the caller knows it (None: read off `log_decay`, which waits
    for the device)."""
    from fla.ops.simple_gla import chunk_simple_gla, fused_recurrent_simple_gla

    scale = q.shape[-1] ** -0.5 if scale is None else scale
    g_gamma = log_decay.to(device=q.device, dtype=torch.float32)
    if initial_state is not None:
        initial_state = initial_state.to(torch.float32)
    if cu_seqlens is not None:
        cu_seqlens = cu_seqlens.to(device=q.device, dtype=torch.long)
    single_token = q.shape[1] == 1 and not torch.is_grad_enabled()
    unsafe_chunk = not chunk_safe if chunk_safe is not None else not decay_is_chunk_safe(g_gamma)
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
