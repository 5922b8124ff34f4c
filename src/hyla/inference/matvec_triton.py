"""Matrix-vector products for single-token decode: y = x W^T (+ b) with one row in x, as `F.linear` computes it, and
the same product with the work that precedes it in a decode step folded into its prologue.

At batch 1 a decode step's linear maps are matrix-vector products bound by reading the weights once; cuBLAS's
kernels for these shapes read them well under the GPU's bandwidth (docs/results/speed.md). One program per
`block_n` output rows walks the whole input dimension in `block_k` steps, accumulating in float32; there is no
split over the input dimension, so one kernel and no reduction pass. Since every program reads the whole input
vector, it can compute that vector on the way (`PROLOGUE`), saving a kernel launch and a round trip through memory:

- RESIDUAL_NORM: x = s = h + d (the residual stream, written out by program 0), y = rsqrt(mean(s^2) + eps) (W s):
  an RMSNorm's scalar factors out of the product, and its weight is folded into W (`fold_norm_weight`) or read
  beside s (`norm_weight`);
- SCALED: y = rsqrt(sum(partials) / K + eps) (W x), the RMSNorm whose sum of squares the previous kernel left in
  `partials` (hyla.inference.lightning_step_triton);
- SILU_MUL: x = silu(a) * b (the MLP's gate and up halves); SIGMOID_GATE: x = a * sigmoid(b) (an output gate).

Each has a float64 reference in `hyla.inference.matvec` (`fused_matvec_reference`). `python bench/matvec_sweep.py`
measures the plain product against `F.linear` on a decode step's shapes; `InferenceEngine(..., matvec="triton")`
decodes through the custom ops here, which torch.compile keeps as Triton kernels in its graph.
Imported only on CUDA (or under Triton's interpreter): `import hyla` never imports triton.
"""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from hyla.inference.matvec import (
    DEFAULT_CONFIG,
    PLAIN,
    PROLOGUES,
    RESIDUAL_NORM,
    SCALED,
    SIGMOID_GATE,
    SILU_MUL,
    MatvecConfig,
    MatvecTable,
)


@triton.jit
def _matvec_kernel(
    x_ptr, x2_ptr, w_ptr, b_ptr, y_ptr, s_ptr, nw_ptr, p_ptr, N, stride_wn, eps,
    K: tl.constexpr, HAS_BIAS: tl.constexpr, PROLOGUE: tl.constexpr, HAS_NORM_W: tl.constexpr,
    NUM_PARTIALS: tl.constexpr, PARTIALS_BLOCK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid = tl.program_id(0)
    rows = pid * BLOCK_N + tl.arange(0, BLOCK_N)
    row_mask = rows < N
    cols = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    squares = tl.zeros((BLOCK_K,), dtype=tl.float32)
    for start in range(0, K, BLOCK_K):
        offs = start + cols
        col_mask = offs < K
        if PROLOGUE == 1:  # RESIDUAL_NORM: s = h + d, rounded to the stream's dtype as the model's residual add
            s = (tl.load(x_ptr + offs, mask=col_mask, other=0.0).to(tl.float32)
                 + tl.load(x2_ptr + offs, mask=col_mask, other=0.0).to(tl.float32)).to(s_ptr.dtype.element_ty)
            tl.store(s_ptr + offs, s, mask=col_mask & (pid == 0))
            x = s.to(tl.float32)
            squares += x * x
            if HAS_NORM_W:
                x = x * tl.load(nw_ptr + offs, mask=col_mask, other=0.0).to(tl.float32)
        elif PROLOGUE == 3:  # SILU_MUL
            a = tl.load(x_ptr + offs, mask=col_mask, other=0.0).to(tl.float32)
            x = a * tl.sigmoid(a) * tl.load(x2_ptr + offs, mask=col_mask, other=0.0).to(tl.float32)
        elif PROLOGUE == 4:  # SIGMOID_GATE
            b = tl.load(x2_ptr + offs, mask=col_mask, other=0.0).to(tl.float32)
            x = tl.load(x_ptr + offs, mask=col_mask, other=0.0).to(tl.float32) * tl.sigmoid(b)
        else:  # PLAIN, SCALED
            x = tl.load(x_ptr + offs, mask=col_mask, other=0.0).to(tl.float32)
        w = tl.load(w_ptr + rows[:, None] * stride_wn + offs[None, :], mask=row_mask[:, None] & col_mask[None, :],
                    other=0.0)
        acc += w.to(tl.float32) * x[None, :]
    out = tl.sum(acc, axis=1)
    if PROLOGUE == 1:
        out = out * tl.rsqrt(tl.sum(squares, axis=0) / K + eps)
    if PROLOGUE == 2:
        index = tl.arange(0, PARTIALS_BLOCK)
        partials = tl.load(p_ptr + index, mask=index < NUM_PARTIALS, other=0.0).to(tl.float32)
        out = out * tl.rsqrt(tl.sum(partials, axis=0) / K + eps)
    if HAS_BIAS:
        out += tl.load(b_ptr + rows, mask=row_mask, other=0.0).to(tl.float32)
    tl.store(y_ptr + rows, out.to(y_ptr.dtype.element_ty), mask=row_mask)


def supports(x: torch.Tensor, weight: torch.Tensor, config: MatvecConfig = DEFAULT_CONFIG) -> bool:
    """Whether `matvec_triton(x, weight)` applies: one row in x, contiguous last dimensions. (`config` is kept for
    callers that pass it: any input width works, a multiple of block_k only saves the last step's masking.)"""
    return (x.numel() == x.shape[-1] and x.stride(-1) == 1 and weight.dim() == 2 and weight.stride(-1) == 1
            and weight.shape[1] == x.shape[-1])


def _launch(launcher, x, weight, bias, *, prologue: int, x2=None, norm_weight=None, partials=None, eps=0.0,
            block_n: int, block_k: int, num_warps: int, num_stages: int):
    """Runs the kernel (through `launcher`: the kernel itself, or torch.library.wrap_triton of it inside an op).
    Returns (y, s): y in the weight's dtype; s, the residual sum in x's dtype, for RESIDUAL_NORM only."""
    n, k = weight.shape
    y = torch.empty(*x.shape[:-1], n, device=x.device, dtype=weight.dtype)
    s = torch.empty_like(x) if prologue == RESIDUAL_NORM else None
    num_partials = partials.numel() if partials is not None else 1
    launcher[(triton.cdiv(n, block_n),)](
        x, x2 if x2 is not None else x, weight, bias if bias is not None else weight, y, s if s is not None else y,
        norm_weight if norm_weight is not None else weight, partials if partials is not None else weight,
        n, weight.stride(0), eps,
        K=k, HAS_BIAS=bias is not None, PROLOGUE=prologue, HAS_NORM_W=norm_weight is not None,
        NUM_PARTIALS=num_partials, PARTIALS_BLOCK=triton.next_power_of_2(num_partials), BLOCK_N=block_n, BLOCK_K=block_k, num_warps=num_warps, num_stages=num_stages,
    )
    return y, s


def _check(x, weight, *others):
    if not supports(x, weight):
        raise ValueError(f"the matrix-vector kernel needs one contiguous row of x and a weight [N, K] with K = x's "
                         f"width; got x {tuple(x.shape)}, weight {tuple(weight.shape)}")
    for other in others:
        if other is not None and (other.shape != x.shape or not other.is_contiguous()):
            raise ValueError(f"the prologue's second input must be contiguous with x's shape {tuple(x.shape)}, "
                             f"got {tuple(other.shape)}")


def matvec_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                  config: MatvecConfig = DEFAULT_CONFIG) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for x holding one row ([..., K] with every leading size 1); weight [N, K]."""
    return fused_matvec_triton(x, weight, bias, config=config)[0]


def fused_matvec_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                        prologue: int = PLAIN, x2: torch.Tensor | None = None,
                        norm_weight: torch.Tensor | None = None, partials: torch.Tensor | None = None,
                        eps: float = 0.0, config: MatvecConfig = DEFAULT_CONFIG):
    """The product with a prologue (module docstring); returns (y, s), s the residual sum for RESIDUAL_NORM (else
    None). Same contract as `hyla.inference.matvec.fused_matvec_reference`."""
    if prologue not in PROLOGUES:
        raise ValueError(f"prologue must be one of {PROLOGUES}, got {prologue}")
    _check(x, weight, x2)
    if prologue in (RESIDUAL_NORM, SILU_MUL, SIGMOID_GATE) and x2 is None:
        raise ValueError("this prologue takes a second input x2")
    if prologue == SCALED and partials is None:
        raise ValueError("the SCALED prologue takes the sums of squares in `partials`")
    return _launch(_matvec_kernel, x, weight, bias, prologue=prologue, x2=x2, norm_weight=norm_weight,
                   partials=partials, eps=eps, block_n=config.block_n, block_k=config.block_k,
                   num_warps=config.num_warps, num_stages=config.num_stages)


# Custom ops: torch.compile traces into the Triton kernel and keeps it in its graph. Launch settings travel as
# plain integers.

@torch.library.triton_op("hyla::matvec", mutates_args=())
def matvec(x: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor], block_n: int, block_k: int,  # noqa: UP045
           num_warps: int, num_stages: int) -> torch.Tensor:
    """`matvec_triton`."""
    return _launch(torch.library.wrap_triton(_matvec_kernel), x, weight, bias, prologue=PLAIN, block_n=block_n,
                   block_k=block_k, num_warps=num_warps, num_stages=num_stages)[0]


@torch.library.triton_op("hyla::residual_norm_matvec", mutates_args=())
def residual_norm_matvec(h: torch.Tensor, d: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],  # noqa: UP045
                         norm_weight: Optional[torch.Tensor], eps: float, block_n: int, block_k: int,  # noqa: UP045
                         num_warps: int, num_stages: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(W RMSNorm(h + d) + b, h + d): RESIDUAL_NORM."""
    y, s = _launch(torch.library.wrap_triton(_matvec_kernel), h, weight, bias, prologue=RESIDUAL_NORM, x2=d,
                   norm_weight=norm_weight, eps=eps, block_n=block_n, block_k=block_k, num_warps=num_warps,
                   num_stages=num_stages)
    return y, s


@torch.library.triton_op("hyla::scaled_matvec", mutates_args=())
def scaled_matvec(x: torch.Tensor, partials: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],  # noqa: UP045
                  eps: float, block_n: int, block_k: int, num_warps: int, num_stages: int) -> torch.Tensor:
    """rsqrt(sum(partials) / K + eps) (W x) + b: SCALED."""
    return _launch(torch.library.wrap_triton(_matvec_kernel), x, weight, bias, prologue=SCALED, partials=partials,
                   eps=eps, block_n=block_n, block_k=block_k, num_warps=num_warps, num_stages=num_stages)[0]


@torch.library.triton_op("hyla::glu_matvec", mutates_args=())
def glu_matvec(a: torch.Tensor, b: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor],  # noqa: UP045
               prologue: int, block_n: int, block_k: int, num_warps: int, num_stages: int) -> torch.Tensor:
    """W (silu(a) * b) + bias (SILU_MUL) or W (a * sigmoid(b)) + bias (SIGMOID_GATE)."""
    return _launch(torch.library.wrap_triton(_matvec_kernel), a, weight, bias, prologue=prologue, x2=b,
                   block_n=block_n, block_k=block_k, num_warps=num_warps, num_stages=num_stages)[0]


class MatvecKernels:
    """The decode step's products through the ops above, each in the settings `table` gives for its weight's shape
    (cuBLAS where it says None, for the plain product; DEFAULT_CONFIG for shapes it lacks)."""

    def __init__(self, table: MatvecTable | None = None):
        self.table = dict(table or {})

    def config(self, weight: torch.Tensor) -> MatvecConfig | None:
        return self.table.get(tuple(weight.shape), DEFAULT_CONFIG)

    def _settings(self, weight: torch.Tensor) -> tuple[int, int, int, int]:
        config = self.config(weight) or DEFAULT_CONFIG  # the fused products have no cuBLAS counterpart
        return config.block_n, config.block_k, config.num_warps, config.num_stages

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """`F.linear`, through the kernel where the table chooses it and it applies (one row, see `supports`)."""
        config = self.config(weight) if weight.dim() == 2 else None
        if config is not None and (x.is_cuda or x.device.type == "cpu" and _interpreted()) and supports(x, weight):
            return torch.ops.hyla.matvec(x, weight, bias, *self._settings(weight))
        return F.linear(x, weight, bias)

    def residual_norm(self, h, d, weight, bias, norm_weight, eps):
        return torch.ops.hyla.residual_norm_matvec(h, d, weight, bias, norm_weight, eps, *self._settings(weight))

    def scaled(self, x, partials, weight, bias, eps):
        return torch.ops.hyla.scaled_matvec(x, partials, weight, bias, eps, *self._settings(weight))

    def glu(self, a, b, weight, bias, prologue):
        return torch.ops.hyla.glu_matvec(a, b, weight, bias, prologue, *self._settings(weight))


def _interpreted() -> bool:
    import os

    return os.environ.get("TRITON_INTERPRET") == "1"


def matvec_function(table: MatvecTable | None = None):
    """`F.linear`'s signature, through the Triton kernel where it applies: `MatvecKernels(table).linear`."""
    return MatvecKernels(table).linear
