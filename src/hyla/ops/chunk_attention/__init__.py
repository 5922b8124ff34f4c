"""Causal attention of a chunk of queries over a static KV cache that already holds every earlier position (the
inference engine's prefill).

Chunk queries see all cached keys before the chunk (a dense rectangle, no mask) and the chunk's own keys causally (a
square, top-left causal = bottom-right causal). Each part runs through a fused kernel that also returns its
log-sum-exp (`gpu.py`), and the two are merged exactly. That keeps both parts on kernels that need no mask: cuDNN's,
measured at 508-618 TFLOP/s on the reference GPU against ~317 for flash (docs/method.md, "Reference GPU"); SDPA's
public entry offers a bottom-right causal mask only through flash. `reference.py` is the pure-torch form.

cuDNN builds an execution plan for every new shape (tens of milliseconds at 64K, more than the attention itself:
`bench/attention_first_call.py`), and prompts rarely share a length. `cudnn-padded` runs cuDNN on lengths rounded up
to a bucket (`bucket_length`), zeros past the end: in the causal square the padded keys come after every real
query's and stay invisible to it, the padded queries' rows are dropped, so prompts of nearby lengths share one plan
for the price of a little more work (at 64K at most 1/16).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from hyla.ops.chunk_attention.reference import attention_with_lse_reference, merge_attention

ATTENTION_BACKENDS = ("cudnn", "cudnn-padded", "flash", "torch")
# Keep every tensor a kernel sees under 2^30 elements: 32-bit offsets inside fused kernels (1M tokens x 16 heads x
# 128 dims is exactly 2^31).
_MAX_ELEMENTS = 2**30


def fused_kernels_run(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether cuDNN's and flash's fused kernels run a model on `device` in `dtype` (float16/bfloat16 on CUDA)."""
    return device.type == "cuda" and dtype in (torch.float16, torch.bfloat16)


def pick_attention_backend(requested: str, device: torch.device, dtype: torch.dtype) -> str:
    """The prefill attention kernel for `requested` ("auto" or one of ATTENTION_BACKENDS) on `device` in `dtype`.

    cuDNN's and flash's fused kernels take float16/bfloat16 only: "auto" picks cuDNN there and the pure-torch path
    otherwise (CPU, or a float32/float64 model on CUDA); asking for a fused kernel it cannot run is an error."""
    if requested == "auto":
        return "cudnn" if fused_kernels_run(device, dtype) else "torch"
    if requested not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend must be auto or one of {', '.join(ATTENTION_BACKENDS)}")
    if requested != "torch" and not fused_kernels_run(device, dtype):
        raise ValueError(f"attention_backend {requested!r} needs a CUDA model in float16 or bfloat16, not "
                         f"{dtype} on {device.type}; use auto or torch")
    return requested


def bucket_length(length: int) -> int:
    """`length` rounded up to a multiple of 1/16 of the power of two above it, or of 128 where that is more: beyond
    1,024 tokens less than 1/8 more positions (at 64K under 1/16), and every length from 61,441 to 65,536 becomes
    65,536."""
    step = max(128, 2 ** max(0, math.ceil(math.log2(max(length, 1))) - 4))
    return -(-length // step) * step


def padded_to_bucket(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, run):
    """run(q, k, v) -> (output, lse) on q (and, causal, k and v) padded with zeros along the sequence to
    `bucket_length`, cut back to the real queries' rows. causal: a square (q and k of one length) whose padded keys
    every real query's mask hides; otherwise a rectangle of queries over earlier keys, where only the queries are
    padded. q, k, v: [B, H, T, D]."""
    length = q.shape[2]
    if causal and k.shape[2] != length:
        raise ValueError(f"causal attention pads a square: {length} queries over {k.shape[2]} keys")
    extra = bucket_length(length) - length
    if extra == 0:
        return run(q, k, v)
    q = F.pad(q, (0, 0, 0, extra))
    if causal:
        k, v = F.pad(k, (0, 0, 0, extra)), F.pad(v, (0, 0, 0, extra))
    output, lse = run(q, k, v)
    return output[:, :, :length], lse[:, :, :length]


def attention_with_lse(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, scale: float, backend: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """Like `attention_with_lse_reference`, but k/v may have fewer (GQA) heads, and `backend` picks the kernel.
    Large problems go through in groups of heads (see _MAX_ELEMENTS)."""
    if backend not in ATTENTION_BACKENDS:
        raise ValueError(f"attention backend {backend!r} is not one of {', '.join(ATTENTION_BACKENDS)}")
    num_heads, num_kv_heads = q.shape[1], k.shape[1]
    group = num_heads // num_kv_heads
    kv_per_call = num_kv_heads
    longest = max(q.shape[2], k.shape[2])
    while kv_per_call > 1 and q.shape[0] * kv_per_call * group * longest * q.shape[3] > _MAX_ELEMENTS:
        kv_per_call //= 2
    padded = backend == "cudnn-padded"
    if backend != "torch":
        from hyla.ops.chunk_attention.gpu import fused_attention_with_lse

        def fused(q_, k_, v_):
            return fused_attention_with_lse(q_.contiguous(), k_.contiguous(), v_.contiguous(), causal=causal,
                                            scale=scale, backend="cudnn" if padded else backend)

    outputs, lses = [], []
    for first in range(0, num_kv_heads, kv_per_call):
        kv = slice(first, first + kv_per_call)
        heads = slice(first * group, (first + kv_per_call) * group)
        k_part = k[:, kv].repeat_interleave(group, dim=1) if group > 1 else k[:, kv]
        v_part = v[:, kv].repeat_interleave(group, dim=1) if group > 1 else v[:, kv]
        q_part = q[:, heads]
        if backend == "torch":
            out, lse = attention_with_lse_reference(q_part, k_part, v_part, causal=causal, scale=scale)
        else:
            out, lse = (padded_to_bucket(q_part, k_part, v_part, causal=causal, run=fused) if padded
                        else fused(q_part, k_part, v_part))
        outputs.append(out)
        lses.append(lse)
    return torch.cat(outputs, dim=1), torch.cat(lses, dim=1)


def chunk_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, *, start: int, scale: float, backend: str
) -> torch.Tensor:
    """q: [B, C, H, D], the queries at positions start .. start + C - 1; keys, values: [B, Hkv, >= start + C, D]
    (the cache, already holding this chunk). Causal. Returns [B, C, H, D]."""
    queries = q.transpose(1, 2)
    end = start + q.shape[1]
    output, lse = attention_with_lse(
        queries, keys[:, :, start:end], values[:, :, start:end], causal=True, scale=scale, backend=backend
    )
    if start > 0:
        prefix, prefix_lse = attention_with_lse(
            queries, keys[:, :, :start], values[:, :, :start], causal=False, scale=scale, backend=backend
        )
        output = merge_attention(output, lse, prefix, prefix_lse)
    return output.transpose(1, 2)


__all__ = ["ATTENTION_BACKENDS", "attention_with_lse", "attention_with_lse_reference", "bucket_length",
           "chunk_attention", "fused_kernels_run", "merge_attention", "padded_to_bucket", "pick_attention_backend"]
