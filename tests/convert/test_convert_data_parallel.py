"""`hyla convert` under torchrun with 2 gloo processes in each data-parallel mode: the align and distill loss curves
of one process at the same global batch, the mode printed at each stage's start and kept in its manifest, and a DDP
run killed during distillation resumes to the weights of an uninterrupted one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hyla.cli import main
from killable import kill_when, start_blocking
from test_convert_pipeline import convert_args, manifest

STOP = ["--until-stage", "distill"]
# Global batch 4: two rows a process, one a micro-batch, so the first backward of every step runs without gradient
# synchronisation (DDP's no_sync, FSDP2's set_requires_gradient_sync).
MICRO_BATCHES = ["--set", "align.micro_batch_size=1", "--set", "distill.micro_batch_size=1"]
# The runs differ from one process only in how gradients are summed (an all-reduce of two halves, micro-batches
# accumulated): ~1e-7 relative per step in float32, compounded over 8 steps of AdamW; 1e-4 leaves room for that and
# catches a lost or doubled reduction (the loss moves by ~1e-2 a step).
TOLERANCE = 1e-4


def torchrun(args: list[str]) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
               "-m", "hyla.cli", *args]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=600,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert completed.returncode == 0, completed.stderr[-3000:]
    return completed


def losses(out: Path, stage: str) -> list[float]:
    folder = next(out.glob(f"*-{stage}"))
    return [json.loads(line)["loss"] for line in (folder / "metrics.jsonl").read_text().splitlines()]


def assert_same_curves(one: Path, two: Path) -> None:
    for stage in ("align", "distill"):
        expected, got = losses(one, stage), losses(two, stage)
        assert len(expected) == len(got) == 8, stage
        for a, b in zip(expected, got):
            assert abs(a - b) <= TOLERANCE * abs(a), (stage, expected, got)


@pytest.fixture(scope="module")
def ddp_run(tiny_teacher, tmp_path_factory) -> tuple[Path, str]:
    """Two processes, the mode left to the rule (auto), micro-batches of one row."""
    out = tmp_path_factory.mktemp("ddp") / "run"
    return out, torchrun(convert_args(tiny_teacher, out, *STOP, *MICRO_BATCHES)).stdout


@pytest.mark.slow
def test_a_small_model_gets_ddp_and_the_loss_curves_of_one_process(ddp_run, distilled_run):
    (out, printed), (one, _) = ddp_run, distilled_run
    for stage in ("align", "distill"):
        assert f"[{stage}] data parallel: ddp (auto: " in printed
        recorded = manifest(out, stage)["results"]["data_parallel"]
        assert recorded["mode"] == "ddp" and recorded["world_size"] == 2 and recorded["replica_bytes"] > 0
        assert manifest(out, stage)["results"]["fast_path"]["micro_batch_rows_used"] == 1
    assert manifest(one, "distill")["results"]["data_parallel"]["mode"] == "none"
    assert_same_curves(one, out)


@pytest.mark.slow
@pytest.mark.parametrize("mode,extra", [
    ("fsdp", ["--set", "distill.checkpoint_activations=true"]),  # recomputation inside FSDP2's hooks
    ("fsdp-no-reshard", MICRO_BATCHES),
])
def test_fsdp_modes_give_the_loss_curves_of_one_process(tiny_teacher, distilled_run, tmp_path, mode, extra):
    out = tmp_path / "run"
    chosen = ["--set", f"align.data_parallel={mode}", "--set", f"distill.data_parallel={mode}"]
    printed = torchrun(convert_args(tiny_teacher, out, *STOP, *chosen, *extra)).stdout
    assert f"[distill] data parallel: {mode} (data_parallel={mode})" in printed
    assert manifest(out, "distill")["results"]["data_parallel"]["mode"] == mode
    assert_same_curves(distilled_run[0], out)


@pytest.mark.slow
def test_ddp_run_killed_during_distillation_resumes_to_the_same_weights(ddp_run, tiny_teacher, tmp_path):
    reference, _ = ddp_run
    killed = tmp_path / "killed"
    args = convert_args(tiny_teacher, killed, *STOP, *MICRO_BATCHES)
    process = start_blocking(args, stage="03-distill", block_after_step=4, processes=2)
    kill_when(process, killed / "03-distill" / "checkpoints" / "step-4")
    assert not (killed / "03-distill" / "manifest.json").exists()
    torchrun(args)
    assert manifest(killed, "distill")["results"]["resumed_from_step"] == 4
    expected = load_file(reference / "03-distill" / "student.safetensors")
    actual = load_file(killed / "03-distill" / "student.safetensors")
    assert expected.keys() == actual.keys()
    for name in expected:  # the same processes doing the same arithmetic: bitwise equal
        assert torch.equal(expected[name], actual[name]), name


@pytest.mark.slow
def test_kl_ls_selection_under_fsdp_scores_the_layers_as_one_process(tiny_teacher, tmp_path):
    """Each layer's short distillation is sharded; its held-out KL is taken on the gathered student."""
    select = ["--until-stage", "select", "--set", "selection.kl_ls_steps=2", "--set", "distill.data_parallel=fsdp",
              "--set", "align.tokens=512"]
    one, two = tmp_path / "one", tmp_path / "two"
    assert main(convert_args(tiny_teacher, one, *select, select="kl-ls")) == 0
    torchrun(convert_args(tiny_teacher, two, *select, select="kl-ls"))
    read = lambda out: json.loads((out / "02-select" / "kl_by_layer.json").read_text())
    expected, got = read(one), read(two)
    assert expected.keys() == got.keys() == {"0", "1", "2", "3"}
    for layer in expected:
        assert got[layer] == pytest.approx(expected[layer], rel=TOLERANCE), (expected, got)
    assert manifest(two, "select")["results"]["chosen"] == manifest(one, "select")["results"]["chosen"]
