"""`hyla convert` under faults and bad input: settings refused before the teacher loads, one writer per run folder,
damaged or missing stage files named, run folders that resume after a move, a collapsed student never exported."""

from __future__ import annotations

import json
import math
import shutil
import time
from pathlib import Path

import pytest

from hyla.cli import main
from killable import kill_when, start_blocking
from test_convert_pipeline import convert_args, manifest


@pytest.fixture
def no_teacher_load(monkeypatch):
    """Fail the test if the teacher's weights are loaded."""
    import hyla.models.loading as loading

    def refuse(*args, **kwargs):
        raise AssertionError("the teacher was loaded before the settings were checked")

    monkeypatch.setattr(loading, "load_teacher", refuse)


@pytest.mark.parametrize("setting,message", [
    ("distill.lr=abc", "distill.lr: expected a number, got 'abc'"),
    ("distill.batch_size=0", "distill.batch_size must be >= 1, got 0"),
    ("align.seq_len=-5", "align.seq_len must be >= 1, got -5"),
    ("finetune.schedule=nosuch", "finetune.schedule must be one of cosine, constant, got 'nosuch'"),
    ("selection.k=2.5", "selection.k: expected an integer or none, got '2.5'"),
    ("distil.lr=1e-4", "unknown setting 'distil.lr' (did you mean 'distill.lr'?)"),
    ("selection.method=3,9", "the teacher's layers are 0-3"),
    ("selection.k=5", "selection.k 5 is more than the teacher's 4 layers"),
    ("distill.kl_kernel=triton", "distill.kl_kernel=triton runs on CUDA, and this device is cpu"),
    ("finetune.kl_kernel=triton", "finetune.kl_kernel: the KL is stage 2's loss; set it for distill"),
    ("distill.kl_kernel=trit", "distill.kl_kernel must be one of torch, triton"),
    ("align.cuda_graphs=true", "align.cuda_graphs=true runs on CUDA, and this device is cpu"),
    ("distill.cuda_graphs=true", "distill.cuda_graphs: CUDA graphs replay stage 1's twins; set it for align"),
], ids=["lr-text", "batch-0", "seq-negative", "schedule", "k-float", "typo", "layers", "k-too-large", "kl-kernel-cpu",
        "kl-kernel-stage", "kl-kernel-name", "cuda-graphs-cpu", "cuda-graphs-stage"])
def test_bad_settings_are_refused_before_the_teacher_loads_and_leave_nothing(tiny_teacher, tmp_path, capsys,
                                                                             no_teacher_load, setting, message):
    out = tmp_path / "run"
    assert main(convert_args(tiny_teacher, out, "--set", setting)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hyla convert: error: ") and "\n" not in err
    assert message in err
    assert not out.exists()


def test_an_unknown_teacher_fails_at_once_with_what_is_accepted(tmp_path, capsys):
    started = time.perf_counter()
    assert main(["convert", "--teacher", "smollm2-135", "--out", str(tmp_path / "run"), "--device", "cpu"]) == 2
    assert time.perf_counter() - started < 10
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "did you mean 'smollm2-135m'?" in err and "a .gguf file" in err
    assert not (tmp_path / "run").exists()


def test_a_second_conversion_on_the_same_folder_is_refused_at_once(tiny_teacher, tmp_path, capsys):
    out = tmp_path / "run"
    args = convert_args(tiny_teacher, out, "--until-stage", "distill")
    process = start_blocking(args, stage="03-distill", block_after_step=2)
    try:
        deadline = time.time() + 300
        while not (out / "03-distill" / "checkpoints" / "step-2").exists():
            assert process.poll() is None and time.time() < deadline
            time.sleep(0.05)
        started = time.perf_counter()
        assert main(args) == 2
        assert time.perf_counter() - started < 10  # before the teacher loads
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"hyla convert: error: {out} is in use by another hyla run (pid {process.pid}")
    finally:
        kill_when(process, out / "03-distill" / "checkpoints" / "step-2")
    lines = (out / "03-distill" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]  # one writer: each step once


def test_a_run_folder_moved_mid_conversion_resumes_from_another_directory(tiny_teacher, tmp_path, monkeypatch,
                                                                          capsys):
    (tmp_path / "first").mkdir()
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "first")
    stop = ["--until-stage", "distill", "--set", "distill.checkpoint_every=1"]
    process = start_blocking(convert_args(tiny_teacher, "run", *stop), stage="03-distill", block_after_step=3)
    kill_when(process, tmp_path / "first" / "run" / "03-distill" / "checkpoints" / "step-3")
    shutil.move(tmp_path / "first" / "run", tmp_path / "moved")
    shutil.rmtree(tmp_path / "first")  # nothing of the old place is left to read by mistake
    monkeypatch.chdir(tmp_path / "elsewhere")
    assert main(convert_args(tiny_teacher, "../moved", *stop)) == 0
    printed = capsys.readouterr().out
    assert "[data] complete" in printed and "[align] complete" in printed and "[distill] start" in printed
    assert manifest(tmp_path / "moved", "data")["results"]["corpus"] == "corpus"
    assert manifest(tmp_path / "moved", "distill")["results"]["resumed_from_step"] >= 3
    assert not any((tmp_path / "elsewhere").iterdir())


def test_manifests_written_with_working_directory_paths_still_resolve(tmp_path):
    from hyla.convert.stages import Stage

    stage = Stage(tmp_path / "moved", "data", {}, {})
    (stage.path / "corpus").mkdir(parents=True)
    assert stage.resolve("runs/smoke/00-data/corpus") == stage.path / "corpus"  # before paths were relative
    assert stage.resolve("corpus") == stage.path / "corpus"
    assert stage.resolve("/data/corpus") == Path("/data/corpus")


def test_a_damaged_stage_manifest_is_named_with_how_to_redo_it(tiny_teacher, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(convert_args(tiny_teacher, out, "--until-stage", "align")) == 0
    (out / "01-align" / "manifest.json").write_text("{'status': 'complete'")
    capsys.readouterr()
    assert main(convert_args(tiny_teacher, out, "--until-stage", "align")) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]  # after the plan table
    assert err.startswith("hyla convert: error: ")
    assert f"damaged stage file {out / '01-align' / 'manifest.json'} (" in err
    assert "--from-stage align" in err


def test_a_missing_stage_output_is_named_before_the_next_stage_starts(tiny_teacher, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(convert_args(tiny_teacher, out, "--until-stage", "data")) == 0
    shutil.rmtree(out / "00-data" / "corpus")
    capsys.readouterr()
    assert main(convert_args(tiny_teacher, out, "--until-stage", "align")) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"the conversion corpus {out / '00-data' / 'corpus'}" in err and "--from-stage data" in err
    assert not (out / "01-align").exists()  # no stray identity.json


def test_a_truncated_stage_output_is_named(tiny_teacher, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(convert_args(tiny_teacher, out, "--until-stage", "align")) == 0
    twins = out / "01-align" / "twins.safetensors"
    twins.write_bytes(twins.read_bytes()[:100])
    capsys.readouterr()
    assert main(convert_args(tiny_teacher, out, "--until-stage", "select")) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{twins} (the align stage's output) is damaged or truncated" in err and "--from-stage align" in err
    assert not (out / "02-select").exists()


def test_a_damaged_stage_checkpoint_falls_back_to_the_one_before(tiny_teacher, tmp_path, capsys):
    out = tmp_path / "run"
    stop = ["--until-stage", "distill", "--set", "distill.checkpoint_every=1"]
    process = start_blocking(convert_args(tiny_teacher, out, *stop), stage="03-distill", block_after_step=3)
    kill_when(process, out / "03-distill" / "checkpoints" / "step-3")
    newest = out / "03-distill" / "checkpoints" / "step-3" / "model.safetensors"
    newest.write_bytes(newest.read_bytes()[:1000])
    assert main(convert_args(tiny_teacher, out, *stop)) == 0
    printed = capsys.readouterr().out
    assert f"note: checkpoint {newest.parent} is damaged (model.safetensors is 1000 bytes" in printed
    assert manifest(out, "distill")["results"]["resumed_from_step"] == 2


def test_a_student_whose_every_scaling_loss_is_uniform_is_not_exported():
    from hyla.convert.scaling import best_scaling
    from hyla.train import TrainingDiverged

    uniform = math.log(49152)
    losses = {"None": 4.1, "20.0": 3.9, "500.0": math.nan}
    assert best_scaling([None, 20.0, 500.0], losses, 49152) == 20.0  # a non-finite candidate is passed over
    collapsed = {"None": uniform, "20.0": uniform + 1e-5, "500.0": uniform}
    with pytest.raises(TrainingDiverged, match=r"a uniform prediction scores ln\(49152\) = 10.8027"):
        best_scaling([None, 20.0, 500.0], collapsed, 49152)
    with pytest.raises(TrainingDiverged, match="--from-stage distill"):
        best_scaling([None], {"None": math.nan}, 49152)


def test_a_stage_made_with_other_settings_says_what_differs(tiny_teacher, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(convert_args(tiny_teacher, out, "--until-stage", "align")) == 0
    capsys.readouterr()
    assert main(convert_args(tiny_teacher, out, "--until-stage", "align", "--set", "align.lr=2e-3")) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert f"{out / '01-align'} was made with other settings (budget.lr 0.001 then, 0.002 now)" in err
    assert "--from-stage align" in err


def test_a_near_uniform_student_of_a_near_uniform_teacher_is_not_a_collapse():
    """The smoke plan's student of the tests' random teacher (near uniform itself) scored 5.7028 against ln 300 =
    5.7038 at every a: a model that learned its teacher's near-uniform prediction, exported; an exactly uniform one
    is not."""
    from hyla.convert.scaling import best_scaling
    from hyla.train import TrainingDiverged

    near = {"None": 5.7028, "20": 5.7028, "500": 5.7028}
    assert best_scaling([None, 20, 500], near, 300) is None  # equal losses: the first candidate
    with pytest.raises(TrainingDiverged, match="collapsed"):
        best_scaling([None, 20, 500], dict.fromkeys(near, math.log(300) - 1e-6), 300)
