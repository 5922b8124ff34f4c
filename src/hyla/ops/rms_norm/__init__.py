"""RMSNorm over the last dimension: for inference in float16/bfloat16 on CUDA a fused kernel (gpu.py: torch's, or for
rows of at most `ROWS_KERNEL_MAX_D` elements a Triton kernel that normalizes many rows a program), the float32
reference everywhere else (reference.py).

Inference only: where a gradient is wanted the reference runs (training's eager path is the reference, and its
compiled path fuses the reference's operations itself), and inside torch.compile too (its graphs, compiled prefill
and decode included, keep the operations they were measured with). The fused kernels round once where the reference
rounds twice (the normalized rows, then their product with the weight), so the two differ by bf16 rounding
(tests/ops/test_rms_norm.py). A 64K-token prefill of the converted 135M shape runs 130 RMSNorms, ~80 ms of its ~240 ms
of kernels through the reference on an H100 (docs/results/generate-speed.md); `use_backend("torch")` forces the
reference."""

from __future__ import annotations

import torch

from hyla.ops.dispatch import current_backend
from hyla.ops.rms_norm.reference import rms_norm_reference

HALF_DTYPES = (torch.float16, torch.bfloat16)
# Rows of at most this many elements take the Triton rows kernel (`rms_norm_rows`), wider ones torch's fused kernel;
# 0: torch's kernel for every width. `bench/rms_norm.py` on an H100 (2026-12-06): at a Lightning layer's q/k norm
# [1, 65536, 9, 64] the rows kernel 0.107 ms against torch's 0.377 (3.5x), at the block norm [1, 65536, 576] 0.111
# against 0.081, where torch's stays; a 64K prefill's 130 norms 14.3 against 24.2 ms.
ROWS_KERNEL_MAX_D = 256


def _on_cuda(tensor: torch.Tensor) -> bool:
    return tensor.is_cuda


def fused_rms_norm_applies(hidden_states: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `rms_norm` takes the fused kernel for these tensors: CUDA, float16/bfloat16 with a weight [D] of the
    same dtype, no gradient wanted, not being compiled, and the backend not forced to the reference."""
    if not (_on_cuda(hidden_states) and hidden_states.dtype in HALF_DTYPES):
        return False
    if weight.dim() != 1 or weight.dtype != hidden_states.dtype:
        return False
    if torch.is_grad_enabled() and (hidden_states.requires_grad or weight.requires_grad):
        return False
    return not torch.compiler.is_compiling() and current_backend() != "torch"


def rms_norm(hidden_states: torch.Tensor, weight: torch.Tensor, *, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension (hidden_states: [..., D]). weight: [D], or any shape that broadcasts against
    hidden_states (then always the reference). The output's dtype: the reference's rule (`rms_norm_reference`)."""
    if fused_rms_norm_applies(hidden_states, weight):
        from hyla.ops.rms_norm.gpu import rms_norm_fused, rms_norm_rows

        if 0 < hidden_states.shape[-1] <= ROWS_KERNEL_MAX_D:
            return rms_norm_rows(hidden_states, weight, eps=eps)
        return rms_norm_fused(hidden_states, weight, eps=eps)
    return rms_norm_reference(hidden_states, weight, eps=eps)


__all__ = ["fused_rms_norm_applies", "rms_norm", "rms_norm_reference"]
