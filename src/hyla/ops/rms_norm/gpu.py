"""RMSNorm's fast forms for inference: torch's fused kernel (`torch.nn.functional.rms_norm`: on CUDA one kernel that
reads each row once and writes it once, in float32 inside, where the reference launches six over float32 copies of the
rows), and a Triton kernel that normalizes many rows a program (`rms_norm_rows`).

Torch's kernel gives each row a block of its own: at a width of 64 (a Lightning layer's q/k norm [1, T, 9, 64]) a block
moves 256 bytes, and on an H200 the 589,824 rows of a 64K prefill take 0.376 ms where one read and one write of them at
~3 TB/s would take ~0.05 ms (`python bench/rms_norm.py`). A program of the Triton kernel takes as many rows as fit
in 4096 elements (each row padded to a power of two), with fixed launch settings (no autotuning: a fresh process
compiles the kernel once per dtype, width and row layout). Which of the two runs for which width:
`hyla.ops.rms_norm.ROWS_KERNEL_MAX_D`.
Imported only on CUDA (or under Triton's interpreter): `import hyla` never imports triton.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

# Elements of x that a program normalizes: 32 a thread at NUM_WARPS = 4, so that each thread issues a few 16-byte
# loads and a 64K prefill's q/k norm still has thousands of programs (9216 of 64 rows).
ELEMENTS_PER_PROGRAM = 4096
NUM_WARPS = 4
# Widest row the kernel takes: one row a program, 32 float32 values a thread.
MAX_D = 4096
DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def rms_norm_fused(hidden_states: torch.Tensor, weight: torch.Tensor, *, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension; weight: [D] in the input's dtype. The weight multiplies the float32 normalized
    rows before the one rounding to the input's dtype (the reference rounds, then multiplies in that dtype)."""
    return F.rms_norm(hidden_states, (hidden_states.shape[-1],), weight, eps)


@triton.jit(do_not_specialize=["num_rows", "inner_rows"])
def _rms_norm_rows_kernel(
    x_ptr, weight_ptr, out_ptr, num_rows, inner_rows, stride_outer, stride_inner, eps,
    D: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, TWO_LEVELS: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    cols = tl.arange(0, BLOCK_D)
    # Where D is a power of two the mask is constant along the row, which keeps the loads and stores vectorized.
    if BLOCK_D == D:
        mask = (rows < num_rows)[:, None]
    else:
        mask = (rows < num_rows)[:, None] & (cols < D)[None, :]
    # Row r of x sits at (r // inner_rows) * stride_outer + (r % inner_rows) * stride_inner: the leading dimensions
    # of a view such as a head split [B, T, H, D] of one slice of a fused projection's output.
    if TWO_LEVELS:
        starts = (rows // inner_rows).to(tl.int64) * stride_outer + (rows % inner_rows).to(tl.int64) * stride_inner
    else:
        starts = rows.to(tl.int64) * stride_inner
    x = tl.load(x_ptr + starts[:, None] + cols[None, :], mask=mask, other=0.0).to(tl.float32)  # [BLOCK_ROWS, BLOCK_D]
    weight = tl.load(weight_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
    inverse_rms = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)
    out = x * inverse_rms[:, None] * weight[None, :]
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * D + cols[None, :], out.to(out_ptr.dtype.element_ty), mask=mask)


def _row_layout(hidden_states: torch.Tensor) -> list[tuple[int, int]] | None:
    """The leading dimensions of hidden_states merged where they are contiguous with each other: [(size, stride)],
    outermost first, at most two (None: more, which the kernel does not index)."""
    merged: list[tuple[int, int]] = []
    for size, stride in zip(hidden_states.shape[:-1], hidden_states.stride()[:-1]):
        if size == 1:
            continue
        if merged and merged[-1][1] == size * stride:
            merged[-1] = (merged[-1][0] * size, stride)
        else:
            merged.append((size, stride))
    return merged if len(merged) <= 2 else None


def rms_norm_rows(hidden_states: torch.Tensor, weight: torch.Tensor, *, eps: float) -> torch.Tensor:
    """RMSNorm over the last dimension in one Triton kernel, into a new contiguous tensor of hidden_states' shape and
    dtype; the same numbers as `rms_norm_fused`: normalized in float32, the weight multiplying the float32 rows before
    the one rounding to the input's dtype.

    hidden_states: [..., D], D <= MAX_D, with a contiguous last dimension; its leading dimensions are read in place
    where they merge into at most two strided ones (a head split [B, T, H, D] of a slice of a wider projection
    output), else copied first. weight: [D] in hidden_states' dtype, on its device."""
    if hidden_states.dim() == 0 or hidden_states.dtype not in DTYPES:
        raise ValueError(f"the rows kernel takes hidden_states [..., D] in {DTYPES}, got {tuple(hidden_states.shape)} "
                         f"{hidden_states.dtype}")
    width = hidden_states.shape[-1]
    if width > MAX_D:
        raise ValueError(f"the rows kernel takes rows of at most {MAX_D} elements, got {width}")
    if weight.shape != (width,) or weight.dtype != hidden_states.dtype or weight.device != hidden_states.device:
        raise ValueError(f"the rows kernel takes a weight [{width}] in hidden_states' dtype and device "
                         f"({hidden_states.dtype}, {hidden_states.device}), got {tuple(weight.shape)} {weight.dtype}, "
                         f"{weight.device}")
    out = torch.empty(hidden_states.shape, dtype=hidden_states.dtype, device=hidden_states.device)
    if out.numel() == 0:
        return out
    layout = _row_layout(hidden_states) if hidden_states.stride(-1) == 1 else None
    if layout is None:
        hidden_states = hidden_states.contiguous()
        layout = _row_layout(hidden_states)
    # No leading dimension longer than one: a single row.
    *outer, (inner_rows, stride_inner) = layout or [(1, width)]
    stride_outer = outer[0][1] if outer else 0
    num_rows = out.numel() // width
    block_d = triton.next_power_of_2(width)
    block_rows = max(1, ELEMENTS_PER_PROGRAM // block_d)
    # Triton launches on the current CUDA device: the input's, where it is another one (CPU tensors: the interpreter).
    with torch.cuda.device(hidden_states.device) if hidden_states.is_cuda else contextlib.nullcontext():
        _rms_norm_rows_kernel[(triton.cdiv(num_rows, block_rows),)](
            hidden_states, weight.contiguous(), out, num_rows, inner_rows, stride_outer, stride_inner, eps,
            D=width, BLOCK_ROWS=block_rows, BLOCK_D=block_d, TWO_LEVELS=bool(outer), num_warps=NUM_WARPS,
        )
    return out
