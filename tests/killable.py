"""Run `hyla ...` in a child process that blocks after saving a given training checkpoint, for SIGKILL tests.

The child blocks (sleeps) right after `save_checkpoint` has written `step-N` into a folder under `stage`, so a kill
lands while that run is unfinished however fast the machine is: tiny runs finish in a fraction of a second, and
polling for a checkpoint and killing afterwards races them. `kill_when` waits for the checkpoint, then kills.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

_CHILD = """
import sys, time
import hyla.train.loop as loop
from hyla.cli import main
save, stage, block_at = loop.save_checkpoint, sys.argv[1], int(sys.argv[2])
def save_then_block(folder, step, **kwargs):
    target = save(folder, step, **kwargs)
    if (not stage or stage in folder.parts) and step >= block_at:
        time.sleep(3600)
    return target
loop.save_checkpoint = save_then_block
sys.exit(main(sys.argv[3:]))
"""


def start_blocking(args: list[str], *, block_after_step: int, stage: str = "") -> subprocess.Popen:
    """Start `hyla <args>` in the background; it blocks after checkpoint `step-<block_after_step>` (in `stage`)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    return subprocess.Popen([sys.executable, "-c", _CHILD, stage, str(block_after_step), *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def kill_when(process: subprocess.Popen, checkpoint: Path, *, timeout: float = 300.0) -> None:
    """SIGKILL `process` once `checkpoint` exists; fail if it exits first or the checkpoint never appears."""
    deadline = time.time() + timeout
    try:
        while not checkpoint.exists():
            assert process.poll() is None, "the run ended before it could be killed"
            assert time.time() < deadline, f"no {checkpoint.name} checkpoint after {timeout:.0f} s"
            time.sleep(0.05)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait()
