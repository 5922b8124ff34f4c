"""The fused attention kernels behind `hyla.ops.chunk_attention` on CUDA: cuDNN's and flash's SDPA kernels, which
return their log-sum-exp (float16/bfloat16 only). No mask: the callers split the work into a dense rectangle and a
square causal part (`chunk_attention`)."""

from __future__ import annotations

import torch


def fused_attention_with_lse(q, k, v, *, causal: bool, scale: float, backend: str):
    """q, k, v: [B, H, T, D] contiguous, same heads; backend "cudnn" or "flash". Returns (output [B, H, Tq, D],
    log-sum-exp [B, H, Tq] float32)."""
    if backend == "cudnn":
        result = torch.ops.aten._scaled_dot_product_cudnn_attention(
            q, k, v, None, True, 0.0, causal, False, scale=scale
        )
    else:
        result = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal, False, scale=scale)
    output, lse = result[0], result[1]
    return output, lse.reshape(q.shape[:3]).float()
