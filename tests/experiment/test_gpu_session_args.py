"""scripts/gpu-session/experiment.sh's `args` mode: the arguments `start` passes to `hyla experiment run` on the GPU
machine, with a stand-in `nvidia-smi` that reports the GPU's memory. On a GPU under 100 GiB (an H100) a plan's
`warm_engine` is switched off: sitting P's warm-up evaluation ran out of an H100's memory beside the distillation."""

from __future__ import annotations

import os
import shlex
import stat
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
RECIPE = "configs/experiments/halo-smollm2.json"  # declares warm_engine
PLAIN = "configs/experiments/smollm2.json"  # does not


def session_args(tmp_path: Path, plan: str, gpu_mib: int | None, plan_args: str = "") -> tuple[list[str], str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    if gpu_mib is None:  # no GPU: nvidia-smi fails
        smi.write_text("#!/bin/sh\nexit 9\n")
    else:
        smi.write_text(f"#!/bin/sh\necho {gpu_mib}\n")
    smi.chmod(smi.stat().st_mode | stat.S_IEXEC)
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "PLAN": plan, "PLAN_ARGS": plan_args}
    done = subprocess.run(["bash", "scripts/gpu-session/experiment.sh", "args"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return shlex.split(done.stdout), done.stderr


@pytest.mark.parametrize("gpu_mib, switched_off", [(81559, True), (143771, False), (None, False)])
def test_warm_engine_is_off_on_a_gpu_under_100_gib(tmp_path, gpu_mib, switched_off):
    args, stderr = session_args(tmp_path, RECIPE, gpu_mib, "--profile h200")
    assert ("warm_engine=false" in args) is switched_off
    assert ("warm_engine=false" in stderr) is switched_off  # said where the call's output shows it
    assert "teacher=/root/keep/smol.gguf" in args and "text_cache=/root/keep/textcache" in args
    assert args[-2:] == ["--profile", "h200"]


def test_a_plan_without_warm_engine_gets_no_such_setting(tmp_path):
    args, _ = session_args(tmp_path, PLAIN, 81559)
    assert not any(arg.startswith("warm_engine") for arg in args)
    assert "text=/root/keep/text" in args and "text_cache=/root/keep/textcache" not in args


def test_plan_args_come_last_so_they_can_switch_it_on_again(tmp_path):
    args, _ = session_args(tmp_path, RECIPE, 81559, "--set warm_engine=true")
    assert args.index("warm_engine=false") < args.index("warm_engine=true")


def test_a_missing_plan_file_is_one_error_line(tmp_path):
    env = {**os.environ, "PLAN": "configs/experiments/nope.json"}
    done = subprocess.run(["bash", "scripts/gpu-session/experiment.sh", "args"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.strip() == "error: no plan file configs/experiments/nope.json (PLAN)"
