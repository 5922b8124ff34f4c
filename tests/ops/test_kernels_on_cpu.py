"""Starts tests/ops/test_kernels_interpreted.py in its own process under Triton's interpreter (TRITON_INTERPRET=1
must be set before triton is imported, and turns hyla's kernels on for CPU tensors: the rest of the suite runs
without it). Skipped where triton is not importable; `pip install -e ".[dev]"` installs it on Linux x86-64."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton (the dev extra installs it)")
def test_triton_kernels_match_their_references_under_the_interpreter():
    tests = Path(__file__).with_name("test_kernels_interpreted.py")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    result = subprocess.run([sys.executable, "-m", "pytest", str(tests), "-q", "-p", "no:cacheprovider"], env=env,
                            capture_output=True, text=True, timeout=900, cwd=Path(__file__).parents[2])
    assert result.returncode == 0, result.stdout[-6000:] + result.stderr[-3000:]
    assert " passed" in result.stdout and " skipped" not in result.stdout.splitlines()[-1], result.stdout[-2000:]
