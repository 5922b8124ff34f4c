"""Gated delta rule on GPU through flash-linear-attention's `chunk_gated_delta_rule` /
`fused_recurrent_gated_delta_rule` (q/k normalised by the caller, gate and beta already activated).

Imported only when a CUDA tensor asks for it, so that `import hyla` never imports triton.
"""

from __future__ import annotations

import functools
import os
import warnings

import torch
import torch.utils.checkpoint

from hyla.ops.gdn.reference import gdn_chunked


@functools.cache
def fla_backward_blocker() -> str | None:
    """Why fla cannot differentiate `chunk_gated_delta_rule` on this machine, or None when it can.

    fla 0.6.0 raises a RuntimeError in the backward (`fla.ops.common.chunk_o.chunk_bwd_dqkwg`, for any gated call) on
    Hopper with 3.4.0 <= Triton < 3.7.1, which miscompile that kernel (fla issue #640), unless its TileLang backend for
    the kernel is usable. The forward and the no-grad paths are unaffected. This mirrors that guard.
    """
    import triton
    from fla import utils

    if not (utils.IS_NVIDIA_HOPPER and utils.TRITON_ABOVE_3_4_0 and not utils.TRITON_ABOVE_3_7_1):
        return None
    from fla.ops.common.backends.tilelang import CommonTileLangBackend

    dispatch_on = os.environ.get("FLA_DISABLE_BACKEND_DISPATCH") != "1"
    if dispatch_on and CommonTileLangBackend.is_available() and CommonTileLangBackend().is_enabled():
        return None
    return (
        f"fla refuses the backward of chunk_gated_delta_rule on Hopper with Triton {triton.__version__} "
        "(miscompiled for 3.4.0 <= Triton < 3.7.1, fla issue #640); install triton >= 3.7.1, or tilelang with nvcc"
    )


@torch.compiler.disable
def gdn_chunked_eager(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`gdn_chunked` kept out of dynamo, as fla's kernels are: a compiled block breaks its graph around the call
    instead of unrolling the loop over chunks (64 per layer at 4096 tokens) into its graph, forward and backward.
    Under autograd it keeps only its inputs and computes its intermediates again in the backward (activation
    checkpointing): the chunked form would keep ~45 KiB a token and layer (its float32 [C, C] products of every
    chunk), 65 GiB for 23 GDN layers at 16 x 4,096 tokens."""
    if torch.is_grad_enabled():
        return torch.utils.checkpoint.checkpoint(gdn_chunked, q, k, v, use_reentrant=False, **kwargs)
    return gdn_chunked(q, k, v, **kwargs)


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
    """Same contract as `hyla.ops.gdn.reference.gdn_recurrent`, on CUDA. A call that will be differentiated runs
    the pure-torch chunked form, uncompiled (`gdn_chunked_eager`), with a warning, where fla cannot run the backward
    (`fla_backward_blocker`)."""
    needs_backward = torch.is_grad_enabled() and any(
        x is not None and x.requires_grad for x in (q, k, v, g, beta, initial_state)
    )
    blocker = fla_backward_blocker() if needs_backward else None
    if blocker is not None:
        warnings.warn(f"GDN runs its pure-torch chunked form: {blocker}", stacklevel=2)
        return gdn_chunked_eager(
            q, k, v, g=g, beta=beta, scale=scale, initial_state=initial_state,
            output_final_state=output_final_state, cu_seqlens=cu_seqlens,
        )
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
