"""Matrix-vector product for single-token decode: y = x W^T (+ b) with one row in x, as `F.linear` computes it.

At batch 1 a decode step's linear maps are matrix-vector products bound by reading the weights once; cuBLAS's
kernels for these shapes read them well under the GPU's bandwidth (docs/results/speed.md). One program per
`block_n` output rows walks the whole input dimension in `block_k` steps, accumulating in float32; there is no
split over the input dimension, so one kernel and no reduction pass. `python bench/matvec_sweep.py` measures it
against `F.linear` on a decode step's shapes; `InferenceEngine(..., matvec="triton")` decodes through it
(`matvec_function`, the custom op `hyla::matvec`, which torch.compile keeps as a Triton kernel in its graph),
with per-shape settings from the sweep's result where given (`load_table`).
Imported only on CUDA (or under Triton's interpreter): `import hyla` never imports triton.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from hyla.inference.matvec import DEFAULT_CONFIG, MatvecConfig, MatvecTable


@triton.jit
def _matvec_kernel(
    x_ptr, w_ptr, b_ptr, y_ptr, N, stride_wn,
    K: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    cols = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):  # K is a multiple of BLOCK_K (checked by the caller)
        x = tl.load(x_ptr + start + cols).to(tl.float32)
        w = tl.load(w_ptr + rows[:, None] * stride_wn + (start + cols)[None, :], mask=row_mask[:, None], other=0.0)
        acc += w.to(tl.float32) * x[None, :]
    out = tl.sum(acc, axis=1)
    if HAS_BIAS:
        out += tl.load(b_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows, out.to(y_ptr.dtype.element_ty), mask=row_mask)


def supports(x: torch.Tensor, weight: torch.Tensor, config: MatvecConfig = DEFAULT_CONFIG) -> bool:
    """Whether `matvec_triton(x, weight)` applies: one row in x, contiguous last dimensions, the input dimension a
    multiple of block_k."""
    return (x.numel() == x.shape[-1] and x.stride(-1) == 1 and weight.dim() == 2 and weight.stride(-1) == 1
            and weight.shape[1] == x.shape[-1] and x.shape[-1] % config.block_k == 0)


def matvec_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                  config: MatvecConfig = DEFAULT_CONFIG) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for x holding one row ([..., K] with every leading size 1); weight [N, K]."""
    if not supports(x, weight, config):
        raise ValueError(f"matvec_triton needs one contiguous row of x and K a multiple of {config.block_k}; got x "
                         f"{tuple(x.shape)}, weight {tuple(weight.shape)}")
    n, k = weight.shape
    y = torch.empty(*x.shape[:-1], n, device=x.device, dtype=x.dtype)
    _matvec_kernel[(triton.cdiv(n, config.block_n),)](
        x, weight, bias if bias is not None else weight, y, n, weight.stride(0),
        K=k, HAS_BIAS=bias is not None, BLOCK_N=config.block_n, BLOCK_K=config.block_k,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return y


@torch.library.triton_op("hyla::matvec", mutates_args=())
def matvec(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], block_n: int, block_k: int,  # noqa: UP045
           num_warps: int, num_stages: int) -> torch.Tensor:
    """`matvec_triton` as a custom op, its launch settings as plain integers (torch.compile traces into the Triton
    kernel and keeps it in its graph)."""
    n, k = weight.shape
    y = torch.empty(*x.shape[:-1], n, device=x.device, dtype=x.dtype)
    torch.library.wrap_triton(_matvec_kernel)[(triton.cdiv(n, block_n),)](
        x, weight, bias if bias is not None else weight, y, n, weight.stride(0),
        K=k, HAS_BIAS=bias is not None, BLOCK_N=block_n, BLOCK_K=block_k,
        num_warps=num_warps, num_stages=num_stages,
    )
    return y


def matvec_function(table: MatvecTable | None = None):
    """`F.linear`'s signature, through the Triton kernel where it applies (one row on CUDA, see `supports`): with
    `table`, in the settings it gives for the weight's shape (cuBLAS where it says None, DEFAULT_CONFIG for shapes
    it lacks); without, DEFAULT_CONFIG everywhere."""
    table = dict(table or {})

    def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        config = table.get(tuple(weight.shape), DEFAULT_CONFIG) if weight.dim() == 2 else None
        if config is not None and x.is_cuda and supports(x, weight, config):
            return torch.ops.hyla.matvec(x, weight, bias, config.block_n, config.block_k, config.num_warps,
                                         config.num_stages)
        return F.linear(x, weight, bias)

    return linear

