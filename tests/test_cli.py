"""The `hyla` entry point itself."""

from __future__ import annotations

import os
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


def test_every_command_reads_one_triton_cache_whatever_it_compiles_first(tmp_path):
    # Inductor points TRITON_CACHE_DIR at its own folder when a process loads its first compiled kernel, unless the
    # variable is set: hyla sets it first, to Triton's default, so a job that never compiles with torch.compile finds
    # the kernels a conversion compiled.
    child = ("import os\n"
             "from hyla.cli import main\n"
             "main([])\n"
             "print(os.environ['TRITON_CACHE_DIR'])\n")
    env = {key: value for key, value in os.environ.items() if key != "TRITON_CACHE_DIR"}
    env.update(HOME=str(tmp_path), TRITON_HOME=str(tmp_path / "triton-home"))
    # A folder the caller chose stays. The two children run at once: each spends its seconds importing on one core.
    own = dict(env, TRITON_CACHE_DIR=str(tmp_path / "own"))
    children = [subprocess.Popen([sys.executable, "-c", child], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True, env=child_env) for child_env in (env, own)]
    try:
        outputs = [process.communicate(timeout=120) for process in children]
    finally:
        for process in children:
            if process.poll() is None:
                process.kill()
                process.wait()
    (default_out, default_err), (own_out, own_err) = outputs
    assert children[0].returncode == 0, default_err
    assert default_out.splitlines()[-1] == str(tmp_path / "triton-home" / ".triton" / "cache")
    assert children[1].returncode == 0, own_err
    assert own_out.splitlines()[-1] == str(tmp_path / "own")


def test_the_default_triton_cache_is_tritons_own(monkeypatch, tmp_path):
    knobs = pytest.importorskip("triton.knobs")
    from hyla.compile import triton_default_cache_dir

    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.setenv("TRITON_HOME", str(tmp_path))
    assert triton_default_cache_dir() == knobs.cache.dir == str(tmp_path / ".triton" / "cache")
