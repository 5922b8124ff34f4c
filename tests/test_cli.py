"""The `hyla` entry point itself."""

from __future__ import annotations

import signal
import subprocess
import sys

import pytest


@pytest.mark.skipif(not hasattr(signal, "SIGUSR1"), reason="needs SIGUSR1")
def test_sigusr1_prints_stacks_and_the_command_goes_on():
    # Without the handler SIGUSR1 terminates the process, so "still running" would never be printed.
    child = (
        "import os, signal, time\n"
        "from hyla.cli import main\n"
        "main([])\n"
        "os.kill(os.getpid(), signal.SIGUSR1)\n"
        "time.sleep(0.2)\n"
        "print('still running')\n"
    )
    done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "still running" in done.stdout
    assert "most recent call first" in done.stderr
