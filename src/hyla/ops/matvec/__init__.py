"""Matrix-vector products for single-token decode: y = x W^T (+ b) with one row in x, optionally with the work
around it in a decode step folded in (prologues: an RMSNorm, a precomputed RMS scale, a sigmoid gate; epilogues: a
SiLU gating, a residual add). `gpu.py`: hyla's Triton kernel and its custom ops; `reference.py`: the float64 form.
This package holds the launch settings and constants; importing it does not import triton."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Optional

import torch

from hyla.ops.matvec.reference import NORM, PLAIN, PROLOGUES, SCALED, SIGMOID_GATE, fused_matvec_reference


@dataclass(frozen=True)
class MatvecConfig:
    """Launch settings: output rows per program, input columns per loop step, warps, pipeline stages. The defaults:
    the one setting with the least summed time over a HypeNet-2B decode step's products on an H200 (1,126 us against
    1,083 us for each shape's best and 1,324 us for cuBLAS;
    docs/results/speed/2026-11-30-matvec-and-fused-kernels/matvec-sweep/matvec)."""

    block_n: int = 2
    block_k: int = 1024
    num_warps: int = 4
    num_stages: int = 3


DEFAULT_CONFIG = MatvecConfig()

# Per weight shape (N, K): the kernel's settings, or None where cuBLAS is faster and F.linear runs.
MatvecTable = Mapping[tuple[int, int], Optional[MatvecConfig]]  # noqa: UP045


def interleave_glu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Rows (or a bias's entries) of the gate and up maps interleaved as (gate_0, up_0, gate_1, up_1, ...), the
    order the kernel's GLU epilogue reads."""
    return torch.stack([gate, up], dim=1).reshape(2 * gate.shape[0], *gate.shape[1:]).contiguous()


def supports(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether the kernel applies to `F.linear(x, weight)`: one row in x, contiguous last dimensions (any input
    width: the last step is masked)."""
    return (x.numel() == x.shape[-1] and x.stride(-1) == 1 and weight.dim() == 2 and weight.stride(-1) == 1
            and weight.shape[1] == x.shape[-1])


__all__ = ["DEFAULT_CONFIG", "NORM", "PLAIN", "PROLOGUES", "SCALED", "SIGMOID_GATE", "MatvecConfig", "MatvecTable",
           "fused_matvec_reference", "interleave_glu", "supports"]
