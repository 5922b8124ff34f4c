"""Starts tests/ops/test_kernels_interpreted.py in processes of its own under Triton's interpreter (TRITON_INTERPRET=1
must be set before triton is imported, and turns hyla's kernels on for CPU tensors: the rest of the suite runs
without it). Skipped where triton is not importable; `pip install -e ".[dev]"` installs it on Linux x86-64."""

import os
import subprocess
import sys
from pathlib import Path

from interpreted import NEEDS_TRITON

# The interpreter runs each kernel program in Python, on one core: two processes at once, the engine's decode steps
# (about two thirds of the time) in one and the kernels and sweeps in the other, keep both cores of a CI machine busy.
GROUPS = ("test_engine_decode", "not test_engine_decode")


@NEEDS_TRITON
def test_triton_kernels_match_their_references_under_the_interpreter():
    tests = Path(__file__).with_name("test_kernels_interpreted.py")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    processes = [subprocess.Popen([sys.executable, "-m", "pytest", str(tests), "-q", "-p", "no:cacheprovider",
                                   "-k", group], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                  cwd=Path(__file__).parents[2]) for group in GROUPS]
    try:
        for group, process in zip(GROUPS, processes):
            stdout, stderr = process.communicate(timeout=900)
            assert process.returncode == 0, f"-k {group!r}:\n" + stdout[-6000:] + stderr[-3000:]
            assert " passed" in stdout and " skipped" not in stdout.splitlines()[-1], stdout[-2000:]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.wait()
