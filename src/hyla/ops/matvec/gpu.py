"""Matrix-vector products for single-token decode: y = x W^T (+ b) with one row in x, as `F.linear` computes it, and
the same product with the work around it in a decode step folded in.

At batch 1 a decode step's linear maps are matrix-vector products bound by reading the weights once; cuBLAS's
kernels for these shapes read them well under the GPU's bandwidth (docs/results/speed.md). One program per
`block_n` output rows walks the whole input dimension in `block_k` steps, accumulating in float32; there is no
split over the input dimension, so one kernel and no reduction pass. Every program reads the whole input vector, so
it can transform it on the way (prologue); every program owns whole output rows, so it can finish them (epilogue).
Each saves a kernel launch and a round trip through memory without reading a second vector:

- prologue NORM: y = rsqrt(mean(x^2) + eps) W (x [* norm_weight]): an RMSNorm's scalar factors out of the product;
  its weight is folded into W (the engine's `FoldedWeights`) or read beside x (`norm_weight`, the LM head);
- prologue SCALED: y = rsqrt(sum(partials) / K + eps) W x, the RMSNorm whose sum of squares the previous kernel
  left in `partials` (hyla.ops.lightning_step.gpu);
- prologue SIGMOID_GATE: x = a * sigmoid(b) (an attention output gate, `x2` = b);
- epilogue GLU: W's rows interleaved as (gate_0, up_0, gate_1, up_1, ...) and y = silu(gate) * up, N / 2 wide;
- epilogue residual: y = residual + (product), the residual stream's add.

With programmatic dependent launch (`pdl`, Hopper and later) the kernel lets the next kernel launch as soon as all
its programs have started, reads its first step of weights, and only then waits for the previous kernel
(`gdc_wait`) before reading anything that kernel may have written: the weights stream while that kernel finishes.

Outputs are rounded to the weight's dtype where the model rounds (each product, then the add or the gating). The
float64 reference is `hyla.ops.matvec.reference.fused_matvec_reference`. `hyla bench sweep matvec` measures the
plain product against `F.linear` on a decode step's shapes; the engine's "fused-projections" decode step (with
matvec "triton") and its "triton-fused" step decode through the custom ops here, which torch.compile keeps as
Triton kernels in its graph.
Imported only on CUDA (or under Triton's interpreter): `import hyla` never imports triton.
"""

from __future__ import annotations

import os
from typing import Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from hyla.ops.matvec import (
    DEFAULT_CONFIG,
    PLAIN,
    PROLOGUES,
    SCALED,
    SIGMOID_GATE,
    MatvecConfig,
    MatvecTable,
    supports,
)


@triton.jit
def _input(x_ptr, x2_ptr, nw_ptr, offs, col_mask, out_ty: tl.constexpr, PROLOGUE: tl.constexpr,
           HAS_NORM_W: tl.constexpr):
    """One step's slice of the input vector after the prologue, and its squares (for NORM)."""
    x = tl.load(x_ptr + offs, mask=col_mask, other=0.0).to(tl.float32)
    squares = x * x
    if PROLOGUE == 1:  # NORM
        if HAS_NORM_W:
            x = x * tl.load(nw_ptr + offs, mask=col_mask, other=0.0).to(tl.float32)
    if PROLOGUE == 4:  # SIGMOID_GATE; the model rounds the gate before the product
        gate = tl.sigmoid(tl.load(x2_ptr + offs, mask=col_mask, other=0.0).to(tl.float32))
        x = (x * gate.to(out_ty).to(tl.float32)).to(out_ty).to(tl.float32)
    return x, squares


@triton.jit
def _matvec_kernel(
    x_ptr, x2_ptr, w_ptr, b_ptr, r_ptr, y_ptr, nw_ptr, p_ptr, N, stride_wn, eps,
    K: tl.constexpr, HAS_BIAS: tl.constexpr, PROLOGUE: tl.constexpr, HAS_NORM_W: tl.constexpr,
    NUM_PARTIALS: tl.constexpr, PARTIALS_BLOCK: tl.constexpr, GLU: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PDL: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    cols = tl.arange(0, BLOCK_K)
    if PDL:  # the next kernel may start once every program has: its programs first read their weights
        tl.extra.cuda.gdc_launch_dependents()
    # The first step's weights do not depend on any earlier kernel: under programmatic dependent launch they are
    # read while the previous kernel finishes; everything else is read after waiting for it.
    w = tl.load(w_ptr + rows[:, None] * stride_wn + cols[None, :], mask=row_mask[:, None] & (cols < K)[None, :],
                other=0.0)
    if PDL:
        tl.extra.cuda.gdc_wait()
    x, squares = _input(x_ptr, x2_ptr, nw_ptr, cols, cols < K, y_ptr.dtype.element_ty, PROLOGUE, HAS_NORM_W)
    acc = w.to(tl.float32) * x[None, :]
    for start in range(BLOCK_K, K, BLOCK_K):
        offs = start + cols
        col_mask = offs < K
        x, step_squares = _input(x_ptr, x2_ptr, nw_ptr, offs, col_mask, y_ptr.dtype.element_ty, PROLOGUE,
                                 HAS_NORM_W)
        squares += step_squares
        w = tl.load(w_ptr + rows[:, None] * stride_wn + offs[None, :], mask=row_mask[:, None] & col_mask[None, :],
                    other=0.0)
        acc += w.to(tl.float32) * x[None, :]
    out = tl.sum(acc, axis=1)
    if PROLOGUE == 1:
        out = out * tl.rsqrt(tl.sum(squares, axis=0) / K + eps)
    if PROLOGUE == 2:  # SCALED
        index = tl.arange(0, PARTIALS_BLOCK)
        partials = tl.load(p_ptr + index, mask=index < NUM_PARTIALS, other=0.0).to(tl.float32)
        out = out * tl.rsqrt(tl.sum(partials, axis=0) / K + eps)
    if HAS_BIAS:
        out += tl.load(b_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
    out = out.to(y_ptr.dtype.element_ty).to(tl.float32)
    if GLU:  # rows in (gate, up) pairs: one output per pair
        gate, up = tl.split(tl.reshape(out, (BLOCK_N // 2, 2)))
        act = (gate * tl.sigmoid(gate)).to(y_ptr.dtype.element_ty).to(tl.float32) * up
        half = pid * (BLOCK_N // 2) + tl.arange(0, BLOCK_N // 2)
        tl.store(y_ptr + half, act.to(y_ptr.dtype.element_ty), mask=half < N // 2)
    else:
        if HAS_RESIDUAL:
            out += tl.load(r_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
        tl.store(y_ptr + rows, out.to(y_ptr.dtype.element_ty), mask=row_mask)


def _launch(launcher, x, weight, bias, *, prologue: int = PLAIN, x2=None, norm_weight=None, partials=None,
            eps: float = 0.0, residual=None, glu: bool = False, block_n: int, block_k: int, num_warps: int,
            num_stages: int, pdl: bool = False) -> torch.Tensor:
    """Runs the kernel (through `launcher`: the kernel itself, or torch.library.wrap_triton of it inside an op);
    y in the weight's dtype, [..., N] (N / 2 with glu). pdl: launch it with programmatic dependent launch (Hopper
    and later; the kernel itself, not through wrap_triton: torch.compile does not pass launch attributes)."""
    n, k = weight.shape
    if glu:
        block_n = max(2, block_n + block_n % 2)  # whole (gate, up) pairs per program
    y = torch.empty(*x.shape[:-1], n // 2 if glu else n, device=x.device, dtype=weight.dtype)
    num_partials = partials.numel() if partials is not None else 1
    launcher[(triton.cdiv(n, block_n),)](
        x, x2 if x2 is not None else x, weight, bias if bias is not None else weight,
        residual if residual is not None else y, y, norm_weight if norm_weight is not None else weight,
        partials if partials is not None else weight, n, weight.stride(0), eps,
        K=k, HAS_BIAS=bias is not None, PROLOGUE=prologue, HAS_NORM_W=norm_weight is not None,
        NUM_PARTIALS=num_partials, PARTIALS_BLOCK=triton.next_power_of_2(num_partials), GLU=glu,
        HAS_RESIDUAL=residual is not None, BLOCK_N=block_n, BLOCK_K=block_k, PDL=pdl, num_warps=num_warps,
        num_stages=num_stages, **({"launch_pdl": True} if pdl else {}),
    )
    return y


def matvec_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                  config: MatvecConfig = DEFAULT_CONFIG) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for x holding one row ([..., K] with every leading size 1); weight [N, K]."""
    return fused_matvec_triton(x, weight, bias, config=config)


def fused_matvec_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                        prologue: int = PLAIN, x2: torch.Tensor | None = None,
                        norm_weight: torch.Tensor | None = None, partials: torch.Tensor | None = None,
                        eps: float = 0.0, residual: torch.Tensor | None = None, glu: bool = False,
                        config: MatvecConfig = DEFAULT_CONFIG, pdl: bool = False) -> torch.Tensor:
    """The product with its prologue and epilogue (module docstring). Same contract as
    `hyla.ops.matvec.reference.fused_matvec_reference`. pdl: programmatic dependent launch (`pdl_supported`)."""
    if prologue not in PROLOGUES:
        raise ValueError(f"prologue must be one of {PROLOGUES}, got {prologue}")
    if not supports(x, weight):
        raise ValueError(f"the matrix-vector kernel needs one contiguous row of x and a weight [N, K] with K = x's "
                         f"width; got x {tuple(x.shape)}, weight {tuple(weight.shape)}")
    if prologue == SIGMOID_GATE and (x2 is None or x2.shape != x.shape or x2.stride(-1) != 1):
        raise ValueError("the SIGMOID_GATE prologue takes the gate x2, shaped as x")
    if prologue == SCALED and partials is None:
        raise ValueError("the SCALED prologue takes the sums of squares in `partials`")
    if glu and (residual is not None or weight.shape[0] % 2):
        raise ValueError("the GLU epilogue takes an even number of rows (gate, up pairs) and no residual")
    if residual is not None and (residual.numel() != weight.shape[0] or not residual.is_contiguous()):
        raise ValueError(f"the residual must be contiguous with N = {weight.shape[0]} elements")
    return _launch(_matvec_kernel, x, weight, bias, prologue=prologue, x2=x2, norm_weight=norm_weight,
                   partials=partials, eps=eps, residual=residual, glu=glu, block_n=config.block_n,
                   block_k=config.block_k, num_warps=config.num_warps, num_stages=config.num_stages, pdl=pdl)


def pdl_supported(device: torch.device) -> bool:
    """Whether kernels on `device` can be launched with programmatic dependent launch: a CUDA GPU of compute
    capability 9.0 or later (not under Triton's interpreter). There, a kernel may start while the one before it
    finishes: hyla's decode kernels read their weights, then wait for the previous kernel's results."""
    return (device.type == "cuda" and not _interpreted() and torch.cuda.is_available()
            and torch.cuda.get_device_capability(device)[0] >= 9)


# Custom ops: torch.compile traces into the Triton kernel and keeps it in its graph. Launch settings travel as
# plain integers.

@torch.library.triton_op("hyla::matvec", mutates_args=())
def matvec(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], block_n: int, block_k: int,  # noqa: UP045
           num_warps: int, num_stages: int) -> torch.Tensor:
    """`matvec_triton`."""
    return _launch(torch.library.wrap_triton(_matvec_kernel), x, weight, bias, block_n=block_n, block_k=block_k,
                   num_warps=num_warps, num_stages=num_stages)


@torch.library.triton_op("hyla::fused_matvec", mutates_args=())
def fused_matvec(x: torch.Tensor, x2: Optional[torch.Tensor], weight: torch.Tensor,  # noqa: UP045
                 bias: Optional[torch.Tensor], norm_weight: Optional[torch.Tensor],  # noqa: UP045
                 partials: Optional[torch.Tensor], residual: Optional[torch.Tensor], prologue: int,  # noqa: UP045
                 glu: bool, eps: float, block_n: int, block_k: int, num_warps: int, num_stages: int,
                 pdl: bool) -> torch.Tensor:
    """`fused_matvec_triton`, unchecked. With pdl the op runs the kernel itself: call it outside torch.compile."""
    launcher = _matvec_kernel if pdl else torch.library.wrap_triton(_matvec_kernel)
    return _launch(launcher, x, weight, bias, prologue=prologue, x2=x2, norm_weight=norm_weight, partials=partials,
                   eps=eps, residual=residual, glu=glu, block_n=block_n, block_k=block_k, num_warps=num_warps,
                   num_stages=num_stages, pdl=pdl)


class MatvecKernels:
    """The decode step's products through the ops above, each in the settings `table` gives for its weight's shape
    (cuBLAS where it says None, for the plain product; `default` for shapes it lacks). pdl: the fused products
    launched with programmatic dependent launch unless a call says otherwise (`pdl_supported`)."""

    def __init__(self, table: MatvecTable | None = None, *, default: MatvecConfig = DEFAULT_CONFIG,
                 pdl: bool = False):
        self.table = dict(table or {})
        self.default = default
        self.pdl = pdl

    def config(self, weight: torch.Tensor) -> MatvecConfig | None:
        return self.table.get(tuple(weight.shape), self.default)

    def _settings(self, weight: torch.Tensor) -> tuple[int, int, int, int]:
        config = self.config(weight) or self.default  # the fused products have no cuBLAS counterpart
        return config.block_n, config.block_k, config.num_warps, config.num_stages

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """`F.linear`, through the kernel where the table chooses it and it applies (one row, see `supports`)."""
        config = self.config(weight) if weight.dim() == 2 else None
        if config is not None and (x.is_cuda or x.device.type == "cpu" and _interpreted()) and supports(x, weight):
            return torch.ops.hyla.matvec(x, weight, bias, *self._settings(weight))
        return F.linear(x, weight, bias)

    def fused(self, x, weight, bias=None, *, prologue: int = PLAIN, x2=None, norm_weight=None, partials=None,
              eps: float = 0.0, residual=None, glu: bool = False, pdl: bool | None = None):
        """`fused_matvec_triton` through its op, in the table's settings for the weight's shape. pdl: None for
        `self.pdl`; False inside a function torch.compile traces."""
        return torch.ops.hyla.fused_matvec(x, x2, weight, bias, norm_weight, partials, residual, prologue, glu, eps,
                                           *self._settings(weight), self.pdl if pdl is None else pdl)


def _interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"
