"""Rotary position embeddings (rotate-half, as the HF Llama/Qwen teachers): one Triton kernel for inference in
float16/bfloat16 on CUDA (gpu.py), the reference everywhere else (reference.py).

Inference only: where a gradient is wanted the reference runs (training's eager path is the reference, and its
compiled path fuses the reference's operations itself), and inside torch.compile too (its graphs, compiled prefill
and decode included, keep the operations they were measured with). The kernel computes in float32 and rounds once
where the reference rounds three times (two products and their sum), so the two differ by bf16 rounding
(tests/ops/test_rope_gpu.py). A 64K-token prefill of the converted 135M shape runs 46 rotations (q and k of each
RoPE layer) of [1, T, 9, 64], five kernels each through the reference; `bench/rope.py` times both forms;
`use_backend("torch")` forces the reference."""

from __future__ import annotations

import torch

from hyla.ops.dispatch import current_backend
from hyla.ops.rope.reference import apply_rotary_reference

HALF_DTYPES = (torch.float16, torch.bfloat16)


def _on_cuda(tensor: torch.Tensor) -> bool:
    return tensor.is_cuda


def _tables_fit(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """x [B, T, H, D] with D even, cos and sin [B or 1, T, D] in x's dtype."""
    if x.dim() != 4 or x.shape[-1] % 2:
        return False
    batch, seq_len, _, head_dim = x.shape
    return all(table.dim() == 3 and table.shape[0] in (1, batch) and table.shape[1:] == (seq_len, head_dim)
               and table.dtype == x.dtype for table in (cos, sin))


def fused_rotary_applies(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> bool:
    """Whether `apply_rotary` takes the fused kernel for these tensors: CUDA, float16/bfloat16 with cos/sin of the
    same dtype and of shape [B or 1, T, D] (D even), no gradient wanted, not being compiled, and the backend not forced
    to the reference."""
    if not (_on_cuda(x) and x.dtype in HALF_DTYPES and _tables_fit(x, cos, sin)):
        return False
    if torch.is_grad_enabled() and (x.requires_grad or cos.requires_grad or sin.requires_grad):
        return False
    return not torch.compiler.is_compiling() and current_backend() != "torch"


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: [B, T, H, D]; cos, sin: [B, T, D] -> [B, T, H, D]: each head's halves (x1, x2) rotated to
    (x1 * cos1 - x2 * sin1, x2 * cos2 + x1 * sin2) (`apply_rotary_reference`)."""
    if fused_rotary_applies(x, cos, sin):
        from hyla.ops.rope.gpu import apply_rotary_fused

        return apply_rotary_fused(x, cos, sin)
    return apply_rotary_reference(x, cos, sin)


__all__ = ["apply_rotary", "apply_rotary_reference", "fused_rotary_applies"]
