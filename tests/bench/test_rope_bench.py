"""bench/rope.py (the GPU call's RoPE timing) runs end to end, here on the CPU at toy size: the reference alone, and
with the Triton kernel through Triton's interpreter where triton is importable."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from interpreted import NEEDS_TRITON

REPO = Path(__file__).resolve().parents[2]


def run_bench(**env: str) -> list[str]:
    finished = subprocess.run([sys.executable, str(REPO / "bench" / "rope.py"), "--tokens", "64", "--repeats", "1",
                               "--device", "cpu"], capture_output=True, text=True, timeout=120,
                              env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin", **env})
    assert finished.returncode == 0, finished.stderr
    lines = finished.stdout.splitlines()
    assert lines[0].startswith("torch ") and "64 tokens" in lines[0]
    return lines[1:]


def test_the_bench_times_the_reference_and_skips_the_kernel_off_cuda():
    (line,) = run_bench()
    assert line.startswith("q/k rotation [1, T, 9, 64]: reference ") and "fused skipped" in line


@NEEDS_TRITON
def test_the_bench_times_both_forms_under_tritons_interpreter():
    rotation, prefill = run_bench(TRITON_INTERPRET="1")
    assert rotation.startswith("q/k rotation [1, T, 9, 64]: reference ") and "fused" in rotation
    assert "x (largest difference" in rotation and "GB/s" in rotation
    assert prefill.startswith("46 rotations (a prefill): reference ")
