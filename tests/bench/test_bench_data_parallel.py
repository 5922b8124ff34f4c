"""`hyla bench data-parallel` on toy shapes on CPU: under torchrun with 2 gloo processes every GPU count and mode of
each case is measured, with its speed-up over one process and its loss curve; in one process the larger counts are
listed as not measured; bad settings stop with one line."""

import json
import os
import subprocess
import sys

import pytest

from hyla.cli import main

TOY = ["bench", "data-parallel", "--toy", "--device", "cpu", "--steps", "1", "--warmup", "1"]


@pytest.mark.slow
def test_two_processes_measure_one_and_two_in_each_mode(tmp_path):
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
               "hyla.cli", *TOY, "--worlds", "1,2", "--modes", "ddp,fsdp", "--out", str(tmp_path)]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert completed.returncode == 0, completed.stderr[-3000:]
    results = json.loads((tmp_path / "data-parallel.json").read_text())
    measured = {(row["stage"], row["world_size"], row["mode"]) for row in results["measurements"]}
    assert measured == {(stage, n, mode) for stage in ("align", "distill")
                        for n, mode in ((1, "none"), (2, "ddp"), (2, "fsdp"))}
    for row in results["measurements"]:
        assert row["tok_per_s"] > 0 and len(row["losses"]) == 2
        assert row["tokens_per_step"] == row["world_size"] * row["batch_per_gpu"] * row["seq_len"]
        assert row["speedup"] == pytest.approx(row["tok_per_s"] / next(
            base["tok_per_s"] for base in results["measurements"]
            if base["world_size"] == 1 and base["stage"] == row["stage"]))
    assert results["auto"]["distill 2x128"]["mode"] == "ddp"
    markdown = (tmp_path / "data-parallel.md").read_text()
    assert markdown.startswith("# hyla bench data-parallel: toy on 2 x cpu")
    assert "`torchrun --nproc-per-node 2 -m hyla.cli bench data-parallel --toy" in markdown
    assert "| 2 | ddp |" in markdown and "| distill 2x128 | 2 | fsdp |" in markdown
    assert (tmp_path / "data-parallel.png").stat().st_size > 0


def test_one_process_measures_one_gpu_and_lists_the_rest(tmp_path):
    assert main([*TOY, "--cases", "distill:2x64", "--worlds", "1,2,8", "--out", str(tmp_path)]) == 0
    results = json.loads((tmp_path / "data-parallel.json").read_text())
    assert [(row["world_size"], row["mode"]) for row in results["measurements"]] == [(1, "none")]
    assert results["worlds_skipped"] == [2, 8]
    assert "Not measured (more GPUs than the run's 1 process): 2, 8." in (tmp_path / "data-parallel.md").read_text()


@pytest.mark.parametrize("args,message", [
    (["--worlds", "2,4"], "including 1"),
    (["--modes", "ddp,zero"], "modes must be some of ddp, fsdp, fsdp-no-reshard"),
    (["--cases", "finetune:1x64"], "cases must be of the stages align, distill"),
])
def test_bad_settings_stop_with_one_line(tmp_path, capsys, args, message):
    assert main([*TOY, *args, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (tmp_path / "data-parallel.json").exists()
