"""Run `hyla ...` in a child process that blocks after saving a given training checkpoint, for SIGKILL tests.

The child blocks (sleeps) right after `save_checkpoint` has written `step-N` into a folder under `stage`, so a kill
lands while that run is unfinished however fast the machine is: tiny runs finish in a fraction of a second, and
polling for a checkpoint and killing afterwards races them. `kill_when` waits for the checkpoint, then kills.
With `processes` > 1 the child runs under torchrun (gloo), every process blocks, and `kill_when` kills torchrun and
each of its processes (they run in sessions of their own).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

_CHILD = """
import os, sys, time
if os.environ.get("KILLABLE_PIDS"):
    open(os.path.join(os.environ["KILLABLE_PIDS"], str(os.getpid())), "w").close()
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


def start_blocking(args: list[str], *, block_after_step: int, stage: str = "", processes: int = 1) -> subprocess.Popen:
    """Start `hyla <args>` in the background; it blocks after checkpoint `step-<block_after_step>` (in `stage`)."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    child = [stage, str(block_after_step), *args]
    if processes == 1:
        return subprocess.Popen([sys.executable, "-c", _CHILD, *child], env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)
    folder = Path(tempfile.mkdtemp(prefix="killable-"))
    (folder / "child.py").write_text(_CHILD)
    (folder / "pids").mkdir()
    env.update(KILLABLE_PIDS=str(folder / "pids"), OMP_NUM_THREADS="1")
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes),
               str(folder / "child.py"), *child]
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    process.worker_pids = folder / "pids"
    return process


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
        for pid_file in getattr(process, "worker_pids", Path("/nonexistent")).glob("*"):
            try:
                os.kill(int(pid_file.name), signal.SIGKILL)
            except ProcessLookupError:
                pass
            _wait_gone(int(pid_file.name))


def _wait_gone(pid: int, timeout: float = 30.0) -> None:
    """Wait until `pid` (not our child: a torchrun worker) has exited, so that its run-folder lock is released (a
    zombie has released it: its reaping is up to the process that adopted it)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            return
        if state in ("Z", "X"):
            return
        time.sleep(0.05)
