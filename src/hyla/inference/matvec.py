"""Settings of hyla's batch-1 matrix-vector kernel (`hyla.inference.matvec_triton`), and the per-shape choice read
from bench/matvec_sweep.py's result. Importing this module does not import triton."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Optional


@dataclass(frozen=True)
class MatvecConfig:
    """Launch settings: output rows per program, input columns per loop step, warps, pipeline stages."""

    block_n: int = 8
    block_k: int = 512
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


