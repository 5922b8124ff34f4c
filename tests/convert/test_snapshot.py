"""`hyla convert snapshot`: a finished training stage's student as an HF folder, from a tiny CPU conversion's
records; bad requests refused in one line before the teacher loads; nothing half-written."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from hyla.cli import main
from offline_models import save_tiny_teacher
from test_convert_pipeline import TINY_PLAN, convert_args

# Two steps a training stage: the test is of what the snapshot writes, not of what the stages learn.
SHORTER = ["--set", "align.tokens=512", "--set", "distill.tokens=512"]


@pytest.fixture(scope="module")
def distilled_run(tiny_teacher, tmp_path_factory) -> Path:
    """A conversion through its distill stage, on one small text file."""
    root = tmp_path_factory.mktemp("snapshot")
    (root / "text").mkdir()
    (root / "text" / "convert.md").write_text((Path(__file__).parents[2] / "docs" / "convert.md").read_text())
    out = root / "run"
    assert main(convert_args(tiny_teacher, out, "--data", str(root / "text"), *SHORTER,
                             "--until-stage", "distill")) == 0
    return out


def files_of(folder: Path) -> dict[str, tuple[int, int]]:
    return {str(path.relative_to(folder)): (path.stat().st_size, path.stat().st_mtime_ns)
            for path in sorted(folder.rglob("*")) if path.is_file()}


def snapshot_args(run: Path, to: Path, teacher: Path, *extra: str, stage: str = "distill") -> list[str]:
    return ["convert", "snapshot", "--out", str(run), "--stage", stage, "--to", str(to), "--teacher", str(teacher),
            *extra]


def test_the_distill_snapshot_loads_and_gives_the_stages_student_logits(distilled_run, tiny_teacher, tmp_path):
    from transformers import AutoModelForCausalLM

    from hyla.convert.presets import apply_overrides, make_plan
    from hyla.convert.runners import Run, load_student
    from hyla.convert.stages import STAGES, Stage
    from hyla.models.loading import load_teacher
    from hyla.train.distributed import init_distributed

    before = files_of(distilled_run)
    to = tmp_path / "distill"
    assert main(snapshot_args(distilled_run, to, tiny_teacher)) == 0
    assert files_of(distilled_run) == before  # the run is read, not changed
    model = AutoModelForCausalLM.from_pretrained(to).eval()
    assert model.config.attention_logit_scaling_a is None  # as stage 2 trains
    # The pipeline's own student of the stage: the run's plan, its stage folders, load_student.
    hf_teacher, tokenizer = load_teacher(str(tiny_teacher))
    plan = apply_overrides(make_plan("smoke", 0), TINY_PLAN)
    run = Run(str(tiny_teacher), hf_teacher, tokenizer, plan, init_distributed("cpu"),
              {name: Stage(distilled_run, name, {}, {}) for name in STAGES}, [])
    student = load_student(run, "distill").eval()
    assert model.config.layer_types == student.config.layer_types
    ids = torch.randint(0, model.config.vocab_size, (2, 37), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        # Same weights and the same float32 CPU ops on either side: equal to the bit.
        torch.testing.assert_close(model(ids).logits, student(ids).logits, rtol=0, atol=0)
    card = (to / "README.md").read_text()
    assert "the student after the `distill` stage (an intermediate checkpoint)" in card and "Not the converted" in card
    record = json.loads((to / "snapshot.json").read_text())
    assert record["stage"] == "distill" and record["intermediate"] and record["stages"]["distill"]["tokens"] == 512
    assert (to / "tokenizer.json").is_file()


def test_a_snapshot_takes_a_logit_scaling_constant(distilled_run, tiny_teacher, tmp_path):
    from transformers import AutoConfig

    assert main(snapshot_args(distilled_run, tmp_path / "a500", tiny_teacher, "--logit-scaling-a", "500")) == 0
    assert AutoConfig.from_pretrained(tmp_path / "a500").attention_logit_scaling_a == 500


@pytest.mark.parametrize("change, message", [
    (dict(stage="distil"), "--stage 'distil' is not a stage; a snapshot is of distill or finetune"),
    (dict(stage="align"), "--stage align: its output is the stage-1 twins, layer by layer, not a student"),
    (dict(stage="export"), "--stage export: its output is already a model folder, not a student"),
    (dict(stage="finetune"), "the finetune stage of RUN has not finished"),
    (dict(to="full"), "exists and is not empty"),
    (dict(to="inside"), "is inside the conversion folder"),
    (dict(teacher=None), "--teacher is required"),
    (dict(teacher="qwen2"), "was converted from another teacher than"),
    (dict(extra=["--logit-scaling-a", "1"]), "--logit-scaling-a must be > 1 or off, got 1"),
], ids=["unknown", "align", "export", "unfinished", "not-empty", "inside-run", "no-teacher", "other-teacher",
        "a-1"])
def test_bad_snapshot_requests_are_one_line_before_the_teacher_loads(distilled_run, tiny_teacher, tmp_path, capsys,
                                                                      monkeypatch, change, message):
    import hyla.convert.snapshot as snapshot

    monkeypatch.setattr(snapshot, "load_teacher", lambda *a, **k: pytest.fail("the teacher loaded"))
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep.txt").write_text("mine")
    to = {"full": tmp_path / "full", "inside": distilled_run / "snapshot"}.get(change.get("to"), tmp_path / "new")
    teacher = change.get("teacher", "llama")
    teacher = None if teacher is None else tiny_teacher if teacher == "llama" else \
        save_tiny_teacher(tmp_path / "other", family=teacher)
    args = snapshot_args(distilled_run, to, teacher, *change.get("extra", []), stage=change.get("stage", "distill"))
    if teacher is None:
        args = args[:args.index("--teacher")]
    capsys.readouterr()
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and message.replace("RUN", str(distilled_run)) in err, err
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"
    assert not (tmp_path / "new").exists() and not (distilled_run / "snapshot").exists()


def test_a_damaged_student_is_named_with_the_stage_to_redo(distilled_run, tiny_teacher, tmp_path, capsys):
    run = tmp_path / "run"
    shutil.copytree(distilled_run, run)
    student = run / "03-distill" / "student.safetensors"
    student.write_bytes(student.read_bytes()[:100])
    capsys.readouterr()
    assert main(snapshot_args(run, tmp_path / "distill", tiny_teacher)) == 2
    err = capsys.readouterr().err.strip()
    assert f"{student} (the distill stage's output) is damaged or truncated" in err and "--from-stage distill" in err


def test_a_failed_snapshot_leaves_no_folder(distilled_run, tiny_teacher, tmp_path, monkeypatch):
    import hyla.convert.snapshot as snapshot

    def disk_full(*args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr(snapshot, "write_atomic", disk_full)  # the model card: the last file written
    to = tmp_path / "distill"
    with pytest.raises(OSError, match="No space left"):
        snapshot.snapshot(snapshot.SnapshotRequest(distilled_run, "distill", to, str(tiny_teacher)), log=lambda _: None)
    assert list(tmp_path.iterdir()) == []  # neither the folder nor its staging copy


def test_stage_3_trains_under_logit_scaling_when_set_and_the_finetune_snapshot_says_so(distilled_run, tiny_teacher,
                                                                                      tmp_path, capsys):
    """`finetune.logit_scaling_a`: stage 3 trains with the NoPE attention's s_t on (its first loss, on the same
    distilled weights and batch, differs from the plain run's), the setting enters the stage's hash only when set
    (the earlier stages are reused), and a snapshot of the stage names the a it trained with."""
    extra = ["--data", str(distilled_run.parent / "text"), *SHORTER, "--until-stage", "finetune"]
    runs = {}
    for name, settings in (("plain", []), ("scaled", ["--set", "finetune.logit_scaling_a=2"])):
        runs[name] = tmp_path / name
        shutil.copytree(distilled_run, runs[name])
        capsys.readouterr()
        assert main(convert_args(tiny_teacher, runs[name], *extra, *settings)) == 0
        log = capsys.readouterr().out
        assert ("[finetune] trains with the NoPE attention's logit scaling on" in log) == bool(settings)
        assert "[distill]" not in log or "done" in log  # the distill stage is reused, not trained again
    plain, scaled = ({stage: json.loads((next(runs[name].glob(f"*-{stage}")) / "manifest.json").read_text())
                      for stage in ("distill", "finetune")} for name in ("plain", "scaled"))
    assert plain["distill"]["settings_hash"] == scaled["distill"]["settings_hash"]
    assert "logit_scaling_a" not in plain["finetune"]["settings"]["budget"]
    assert scaled["finetune"]["settings"]["budget"]["logit_scaling_a"] == 2
    first, first_scaled = plain["finetune"]["results"]["first"]["loss"], scaled["finetune"]["results"]["first"]["loss"]
    # The same distilled weights and first batch, float32 CPU ops: without the scaling the two first losses are equal
    # to the bit. The tiny random teacher's attention is near uniform, so s_t moves the loss by little, but it moves.
    assert math.isfinite(first_scaled) and first_scaled != first
    assert main(snapshot_args(runs["scaled"], tmp_path / "snap", tiny_teacher, stage="finetune")) == 0
    card = (tmp_path / "snap" / "README.md").read_text()
    assert "logit scaling a: off, set by the snapshot (the stage trained with a = 2" in card
    assert main(snapshot_args(runs["scaled"], tmp_path / "snap2", tiny_teacher, "--logit-scaling-a", "2",
                              stage="finetune")) == 0
    assert "logit scaling a: 2, as the stage trained" in (tmp_path / "snap2" / "README.md").read_text()
