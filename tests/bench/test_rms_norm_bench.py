"""bench/rms_norm.py (the GPU call's RMSNorm timing) runs its two shapes end to end, here on the CPU at toy size."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_bench_times_both_forms_at_both_shapes():
    finished = subprocess.run([sys.executable, str(REPO / "bench" / "rms_norm.py"), "--tokens", "64", "--repeats", "1",
                               "--device", "cpu"], capture_output=True, text=True, timeout=120,
                              env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"})
    assert finished.returncode == 0, finished.stderr
    lines = finished.stdout.splitlines()
    assert lines[0].startswith("torch ") and "64 tokens" in lines[0]
    for line, shape in zip(lines[1:], ("block norm [1, T, 576]", "q/k norm [1, T, 9, 64]"), strict=True):
        assert line.startswith(shape) and "reference" in line and "fused" in line and "x (largest difference" in line
