"""Runs a test file's own `__main__` check in a process under Triton's interpreter (TRITON_INTERPRET=1 must be set
before triton is imported, and it runs hyla's Triton kernels on CPU tensors; the rest of the suite runs without it),
with hyla's sources and the tests' shared helpers (tests/) on the path. The whole kernel suite's runner:
tests/ops/test_kernels_on_cpu.py."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SRC = TESTS.parent / "src"
# Tests of hyla's Triton kernels on CPU (under the interpreter, or benches that run them) skip without triton.
NEEDS_TRITON = pytest.mark.skipif(importlib.util.find_spec("triton") is None,
                                  reason="needs triton (the dev extra installs it)")


def run_under_interpreter(test_file: str, timeout: float = 600) -> str:
    """`python test_file` under the interpreter; its stdout, after asserting that it exited 0."""
    env = dict(os.environ, TRITON_INTERPRET="1",
               PYTHONPATH=os.pathsep.join([str(SRC), str(TESTS), *filter(None, [os.environ.get("PYTHONPATH")])]))
    result = subprocess.run([sys.executable, test_file], env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return result.stdout
