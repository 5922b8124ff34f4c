"""Settings of hyla's batch-1 matrix-vector kernel (`hyla.inference.matvec_triton`), the per-shape choice read
from bench/matvec_sweep.py's result, and the kernel's float64 reference. Importing this module does not import
triton."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Optional

import torch
import torch.nn.functional as F


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


def load_table(path: str | Path) -> dict[tuple[int, int], MatvecConfig | None]:
    """The per-shape choice from bench/matvec_sweep.py's matvec-sweep.json: the fastest checked setting of each
    shape where it beat cuBLAS in that sweep, else None (cuBLAS). One clear error for a file that is not one."""
    try:
        results = json.loads(Path(path).read_text())["results"]
        table: dict[tuple[int, int], MatvecConfig | None] = {}
        for r in results:
            best = r.get("fastest")
            faster = best is not None and best["us"] < r["cublas_us"]
            config = MatvecConfig(**{f.name: int(best[f.name]) for f in fields(MatvecConfig)}) if faster else None
            key = (int(r["n"]), int(r["k"]))
            if key in table and table[key] != config:  # the same shape with and without a bias: keep cuBLAS
                config = None
            table[key] = config
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: not a matvec sweep result (bench/matvec_sweep.py's matvec-sweep.json): "
                         f"{type(err).__name__}: {err}") from None
    return table




# The matrix-vector kernel's prologues (hyla.inference.matvec_triton's module docstring).
PLAIN, NORM, SCALED, SIGMOID_GATE = 0, 1, 2, 4
PROLOGUES = (PLAIN, NORM, SCALED, SIGMOID_GATE)


def interleave_glu(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """Rows (or a bias's entries) of the gate and up maps interleaved as (gate_0, up_0, gate_1, up_1, ...), the
    order the kernel's GLU epilogue reads."""
    return torch.stack([gate, up], dim=1).reshape(2 * gate.shape[0], *gate.shape[1:]).contiguous()


def fused_matvec_reference(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, *,
                           prologue: int = PLAIN, x2: torch.Tensor | None = None,
                           norm_weight: torch.Tensor | None = None, partials: torch.Tensor | None = None,
                           eps: float = 0.0, residual: torch.Tensor | None = None, glu: bool = False) -> torch.Tensor:
    """What the Triton kernel computes, written out in float64 without its roundings to the weight's dtype."""
    v = x.double()
    if prologue == NORM:
        v = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)
        if norm_weight is not None:
            v = v * norm_weight.double()
    elif prologue == SCALED:
        v = v * torch.rsqrt(partials.double().sum() / x.shape[-1] + eps)
    elif prologue == SIGMOID_GATE:
        v = v * torch.sigmoid(x2.double())
    y = F.linear(v, weight.double(), bias.double() if bias is not None else None)
    if glu:
        gate, up = y[..., 0::2], y[..., 1::2]
        return F.silu(gate) * up
    return y + residual.double().reshape(y.shape) if residual is not None else y
