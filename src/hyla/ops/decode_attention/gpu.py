"""Split-K flash decoding for GQA over a static cache, each row's valid length read from device memory.

Stage 1: one program per (row, KV head, split of the positions); it serves all query heads of its KV head group, so
each key/value byte is read once. The programs of a row divide its valid length (read from device memory) evenly
among themselves, so the work follows the length while the launch shape (and a captured CUDA graph) stays fixed.
Stage 2 merges the splits by log-sum-exp. The reference is `hyla.ops.decode_attention.reference`.
Imported only on CUDA (or under Triton's interpreter): `import hyla` never imports triton.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from hyla.ops.decode_attention import DecodeKernelConfig

MAX_SPLITS = 128


DEFAULT_CONFIG = DecodeKernelConfig()


def dot_precision(dtype: torch.dtype) -> str:
    """The kernel's `tl.dot` input precision for q/k/v of `dtype`: Triton computes float32 products in TF32 by default
    (~1e-3 relative on Hopper's tensor cores), which would leave an fp32 model's decode off its own forward by far
    more than fp32 rounding; "ieee" keeps them fp32. Other dtypes ignore the setting (their default, "tf32")."""
    return "ieee" if dtype == torch.float32 else "tf32"


@triton.jit
def _split_kernel(
    q_ptr, k_ptr, v_ptr, length_ptr, part_out_ptr, part_lse_ptr, scale,
    stride_qb, stride_qh, stride_kb, stride_kh, stride_kt, stride_vb, stride_vh, stride_vt, stride_length,
    num_kv_heads, num_splits,
    GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_N: tl.constexpr, HEAD_DIM: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
):
    row_head = tl.program_id(0)
    split = tl.program_id(1)
    row = row_head // num_kv_heads
    kv_head = row_head % num_kv_heads
    length = tl.load(length_ptr + row * stride_length).to(tl.int32)
    tokens_per_split = tl.cdiv(tl.cdiv(length, num_splits), BLOCK_N) * BLOCK_N
    start = split * tokens_per_split
    end = tl.minimum(start + tokens_per_split, length)
    group = tl.arange(0, BLOCK_G)
    dims = tl.arange(0, HEAD_DIM)
    heads = kv_head * GROUP + group
    q = tl.load(q_ptr + row * stride_qb + heads[:, None] * stride_qh + dims[None, :],
                mask=group[:, None] < GROUP, other=0.0)
    # exp2 instead of exp: fold log2(e) into the query scale once.
    q = (q.to(tl.float32) * (scale * 1.4426950408889634)).to(k_ptr.dtype.element_ty)
    k_base = k_ptr + row.to(tl.int64) * stride_kb + kv_head.to(tl.int64) * stride_kh
    v_base = v_ptr + row.to(tl.int64) * stride_vb + kv_head.to(tl.int64) * stride_vh
    running_max = tl.full([BLOCK_G], float("-inf"), tl.float32)
    running_sum = tl.zeros([BLOCK_G], tl.float32)
    acc = tl.zeros([BLOCK_G, HEAD_DIM], tl.float32)
    for block_start in range(start, end, BLOCK_N):
        positions = block_start + tl.arange(0, BLOCK_N)
        valid = positions < end
        offsets = positions.to(tl.int64)[:, None]
        k = tl.load(k_base + offsets * stride_kt + dims[None, :], mask=valid[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
        scores = tl.where(valid[None, :], scores, float("-inf"))
        new_max = tl.maximum(running_max, tl.max(scores, 1))
        correction = tl.exp2(running_max - new_max)
        probs = tl.exp2(scores - new_max[:, None])
        running_sum = running_sum * correction + tl.sum(probs, 1)
        v = tl.load(v_base + offsets * stride_vt + dims[None, :], mask=valid[:, None], other=0.0)
        acc = acc * correction[:, None] + tl.dot(probs.to(v.dtype), v, input_precision=DOT_PRECISION)
        running_max = new_max
    # An empty split leaves sum 0 and max -inf: it writes output 0 and log-sum-exp -inf, weight 0 in stage 2.
    out = acc / tl.maximum(running_sum, 1e-30)[:, None]
    lse = running_max + tl.log2(running_sum)
    slot = (row * num_kv_heads * GROUP + heads) * num_splits + split
    tl.store(part_out_ptr + slot[:, None] * HEAD_DIM + dims[None, :], out, mask=group[:, None] < GROUP)
    tl.store(part_lse_ptr + slot, lse, mask=group < GROUP)


@triton.jit
def _merge_kernel(part_out_ptr, part_lse_ptr, out_ptr, num_splits, BLOCK_S: tl.constexpr, HEAD_DIM: tl.constexpr):
    row_head = tl.program_id(0)
    splits = tl.arange(0, BLOCK_S)
    dims = tl.arange(0, HEAD_DIM)
    in_range = splits < num_splits
    lse = tl.load(part_lse_ptr + row_head * num_splits + splits, mask=in_range, other=float("-inf"))
    weights = tl.exp2(lse - tl.max(lse, 0))
    weights = tl.where(in_range, weights, 0.0)
    parts = tl.load(part_out_ptr + (row_head * num_splits + splits)[:, None] * HEAD_DIM + dims[None, :],
                    mask=in_range[:, None], other=0.0)
    out = tl.sum(parts * weights[:, None], 0) / tl.sum(weights, 0)
    tl.store(out_ptr + row_head * HEAD_DIM + dims, out.to(out_ptr.dtype.element_ty))


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def num_splits_for(batch: int, num_kv_heads: int, max_length: int, num_sms: int, *, programs_per_sm: int,
                   block_n: int) -> int:
    """About `programs_per_sm` programs per multiprocessor, at most MAX_SPLITS (the merge holds all splits of a head
    in registers), and no more splits than block_n-position blocks in the buffer."""
    wanted = max(1, -(-programs_per_sm * num_sms // (batch * num_kv_heads)))
    return min(wanted, MAX_SPLITS, -(-max_length // block_n))


def decode_attention_triton(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, length: torch.Tensor, *, scale: float,
    config: DecodeKernelConfig = DEFAULT_CONFIG,
) -> torch.Tensor:
    """Same contract as `hyla.ops.decode_attention.reference.decode_attention_reference`; length: int tensor on q's
    device, one element (every row) or one per row; `config`: the split kernel's launch settings."""
    batch, num_heads, head_dim = q.shape
    num_kv_heads, max_length = keys.shape[1], keys.shape[2]
    group = num_heads // num_kv_heads
    if keys.stride(-1) != 1 or values.stride(-1) != 1 or q.stride(-1) != 1:
        raise ValueError("decode attention needs the head dimension contiguous in q, keys and values")
    num_sms = _num_sms(q.device.index or 0)
    num_splits = num_splits_for(batch, num_kv_heads, max_length, num_sms,
                                programs_per_sm=config.programs_for(batch * num_kv_heads, num_sms),
                                block_n=config.block_n)
    part_out = torch.empty(batch, num_heads, num_splits, head_dim, device=q.device, dtype=torch.float32)
    part_lse = torch.empty(batch, num_heads, num_splits, device=q.device, dtype=torch.float32)
    if length.numel() not in (1, batch):
        raise ValueError(f"decode attention takes one length or one per row ({batch}), got {length.numel()}")
    _split_kernel[(batch * num_kv_heads, num_splits)](
        q, keys, values, length, part_out, part_lse, scale,
        q.stride(0), q.stride(1), keys.stride(0), keys.stride(1), keys.stride(2),
        values.stride(0), values.stride(1), values.stride(2), 0 if length.numel() == 1 else length.stride(-1),
        num_kv_heads, num_splits,
        GROUP=group, BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_N=config.block_n, HEAD_DIM=head_dim,
        DOT_PRECISION=dot_precision(keys.dtype), num_warps=config.num_warps, num_stages=config.num_stages,
    )
    out = torch.empty(batch, num_heads, head_dim, device=q.device, dtype=q.dtype)
    _merge_kernel[(batch * num_heads,)](
        part_out, part_lse, out, num_splits, BLOCK_S=triton.next_power_of_2(num_splits), HEAD_DIM=head_dim,
        num_warps=4,
    )
    return out
