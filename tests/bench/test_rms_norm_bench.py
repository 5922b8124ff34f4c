"""bench/rms_norm.py (the GPU call's RMSNorm timing) runs its two shapes end to end, here on the CPU at toy size:
the reference and torch's fused kernel, and the Triton rows kernel through Triton's interpreter."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from interpreted import NEEDS_TRITON

REPO = Path(__file__).resolve().parents[2]
SHAPES = ("block norm [1, T, 576]", "q/k norm [1, T, 9, 64]")


def run_bench(**env: str) -> list[str]:
    finished = subprocess.run([sys.executable, str(REPO / "bench" / "rms_norm.py"), "--tokens", "64", "--repeats", "1",
                               "--device", "cpu"], capture_output=True, text=True, timeout=300,
                              env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin", **env})
    assert finished.returncode == 0, finished.stderr
    lines = finished.stdout.splitlines()
    assert lines[0].startswith("torch ") and "64 tokens" in lines[0] and "ROWS_KERNEL_MAX_D" in lines[0]
    assert lines[-1].startswith("a prefill's 130 norms: reference ")
    return lines[1:-1]


@NEEDS_TRITON
def test_the_bench_times_the_reference_and_torchs_kernel_and_skips_the_rows_kernel_off_cuda():
    for line, shape in zip(run_bench(), SHAPES, strict=True):
        assert line.startswith(f"{shape}: reference ") and "fused" in line and "x, rows skipped" in line
        assert "largest difference from the reference: fused " in line and "by fused at" in line


@NEEDS_TRITON
def test_the_bench_times_all_three_forms_under_tritons_interpreter():
    lines = run_bench(TRITON_INTERPRET="1")
    for line, shape in zip(lines, SHAPES, strict=True):
        assert line.startswith(f"{shape}: reference ") and "x, rows " in line and "skipped" not in line
        assert "largest difference from the reference: fused " in line and ", rows " in line and "by rows at" in line
