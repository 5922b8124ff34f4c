"""The recipe's conversion plumbing on a tiny teacher: corpora of their own for stage 3 and for choosing `a`, the mix
each stage trained on, document-aligned windows, the scaling report (c(L), loss by position, NIAH), the preset."""

from __future__ import annotations

import json
import shutil

import pytest

from hyla.cli import main
from hyla.convert.presets import apply_overrides, check_plan, make_plan
from hyla.convert.recipes import scale_tokens
from test_convert_pipeline import convert_args, manifest

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma tau".split()


def text_folder(root, name: str, count: int, words: int):
    folder = root / name
    folder.mkdir()
    for i in range(count):
        (folder / f"{i:03d}.txt").write_text(" ".join(WORDS[(i + j) % len(WORDS)] for j in range(words)) + "\n")
    return folder


def test_stage_three_and_scaling_read_corpora_of_their_own(tiny_teacher, tmp_path, capsys):
    main_text = text_folder(tmp_path, "main", 40, 200)
    long_text = text_folder(tmp_path, "long", 6, 600)
    held_out = text_folder(tmp_path, "heldout", 2, 600)
    out = tmp_path / "run"
    extra = ["--data", str(main_text),
             "--set", f"data.long_sources={long_text},recall@200-400:{main_text}", "--set", "data.long_weights=1,1",
             "--set", f"data.scaling_sources={held_out}", "--set", "finetune.align_documents=true",
             "--set", "scaling.per_length=true", "--set", "scaling.niah_lengths=512", "--set",
             "scaling.niah_tasks=SK1", "--set", "scaling.niah_samples=1", "--set", "scaling.niah_max_new_tokens=4",
             "--set", f"scaling.recall_source=recall-lead:{held_out}", "--set", "scaling.recall_lengths=512",
             "--set", "scaling.recall_docs=1", "--set", "scaling.criterion=recall", "--until-stage", "scaling"]
    assert main(convert_args(tiny_teacher, out, *extra, select="1")) == 0
    printed = capsys.readouterr().out
    data = manifest(out, "data")["results"]
    assert sorted(data["corpora"]) == ["long", "main", "scaling"]
    long_mix = data["corpora"]["long"]["sources"]
    assert [source["spec"] for source in long_mix] == [str(long_text), f"recall@200-400:{main_text}"]
    assert sum(source["share"] for source in long_mix) == pytest.approx(1.0)
    assert "[data] long:" in printed
    finetune = manifest(out, "finetune")["results"]["data"]
    assert finetune["corpus"] == "long" and finetune["align_documents"] and finetune["epochs"] > 0
    assert manifest(out, "distill")["results"]["data"]["corpus"] == "main"
    scaling = manifest(out, "scaling")["results"]
    # Paths relative to their stage folder: the run folder can move.
    assert data["corpora"]["scaling"]["path"] == "scaling" and data["corpora"]["long"]["path"] == "long"
    assert scaling["source"] == "../00-data/scaling"
    # --set parses "20" as an integer: the labels are the candidates as given.
    assert set(scaling["loss_by_a"]) == {"None", "20", "500"} and scaling["loss_per_length"] > 0
    assert set(scaling["loss_by_position"]) == {"None", "20", "500", "c(L)"}
    assert all(0 <= cells["SK1@512"]["score"] <= 1 for cells in scaling["niah"].values())
    assert scaling["generation_path"] == "engine"
    assert scaling["chosen_a"] in (None, 20, 500)
    # chosen by the answer loss on one recall document of ~512 tokens, both criteria reported
    answer = scaling["recall_loss_by_a"]
    assert scaling["criterion"] == "recall" and set(answer) == {"None", "20", "500"}
    assert scaling["chosen_a"] == min((None, 20, 500), key=lambda a: answer[str(a)])
    assert scaling["recall_per_length"]["loss"] > 0 and 486 <= scaling["recall_documents"]["tokens"][0] <= 512
    assert "recall answer loss" in printed and "by the lowest answer loss on the recall documents" in printed
    # each pass's seconds, to tell where the stage's time went
    assert set(scaling["seconds_by_candidate"]["loss"]) == set(scaling["seconds_by_candidate"]["niah"]) == set(
        scaling["seconds_by_candidate"]["recall"]) == set(scaling["loss_by_position"])
    assert "triton_cache_dir" in scaling["compile"]
    assert (out / "05-scaling" / "scaling.png").exists()
    # Moved, stage 3 and the scaling stage find their corpora again.
    moved = tmp_path / "moved"
    shutil.move(out, moved)
    assert main(convert_args(tiny_teacher, moved, *extra, "--from-stage", "finetune", select="1")) == 0
    assert manifest(moved, "finetune")["results"]["data"]["corpus"] == "long"
    assert manifest(moved, "scaling")["results"]["source"] == "../00-data/scaling"


def test_zero_finetune_tokens_pass_the_distilled_weights_on_unchanged(tiny_teacher, tmp_path, capsys):
    from safetensors.torch import load_file

    out = tmp_path / "run"
    extra = ["--set", "finetune.tokens=0", "--set", "scaling.per_length=true"]
    assert main(convert_args(tiny_teacher, out, *extra, select="1")) == 0
    printed = capsys.readouterr().out
    assert "[finetune] skipped (finetune.tokens=0)" in printed
    finetune = manifest(out, "finetune")
    assert finetune["status"] == "complete" and finetune["settings"]["budget"]["tokens"] == 0
    assert {k: finetune["results"][k] for k in ("skipped", "steps", "tokens", "weights_from")} == {
        "skipped": True, "steps": 0, "tokens": 0, "weights_from": "../03-distill/student.safetensors"}
    assert not (out / "04-finetune" / "checkpoints").exists() and not (out / "04-finetune" / "metrics.jsonl").exists()
    distilled = load_file(str(out / "03-distill" / "student.safetensors"))
    passed = load_file(str(out / "04-finetune" / "student.safetensors"))
    assert passed.keys() == distilled.keys() and all(passed[k].equal(distilled[k]) for k in distilled)
    exported = load_file(str(out / "06-export" / "model.safetensors"))
    assert all(exported[k].equal(distilled[k]) for k in distilled if k in exported) and exported.keys() & distilled
    report = json.loads((out / "06-export" / "conversion.json").read_text())
    assert report["total_training_tokens"] == 2048 + 2048  # align + distill: no stage 3
    # c(L) takes the distillation's window as L0 when stage 3 is skipped.
    assert manifest(out, "scaling")["results"]["per_length_train_length"] == 64
    plan = apply_overrides(make_plan("smoke", 1), ["finetune.tokens=0", "distill.seq_len=64"])
    assert plan.trained_seq_len == 64 and plan.finetune.steps == 0
    assert apply_overrides(make_plan("smoke", 1), ["distill.seq_len=64"]).trained_seq_len == 1024
    assert scale_tokens(apply_overrides(make_plan("smoke", 1), ["finetune.tokens=0", "token_scale=2"])).finetune.tokens \
        == 0


def test_zero_finetune_tokens_with_long_sources_is_one_clear_error():
    with pytest.raises(ValueError) as error:
        apply_overrides(make_plan("halo-smollm2", 1), ["finetune.tokens=0"])
    assert "set data.long_sources= (empty) too" in str(error.value) and "\n" not in str(error.value)
    assert apply_overrides(make_plan("halo-smollm2", 1), ["finetune.tokens=0", "data.long_sources="]).finetune_skipped


def test_the_recipe_preset_is_sized_as_documented():
    plan = make_plan("halo-smollm2", 135_000_000)
    check_plan(plan)
    tokens = {name: getattr(plan, name).tokens for name in ("align", "distill", "finetune")}
    assert tokens == {"align": 50_000_000, "distill": 150_000_000, "finetune": 50_000_000}
    seconds = tokens["align"] / 400e3 + tokens["distill"] / 200e3 + tokens["finetune"] / 150e3
    assert 19 * 60 < seconds < 21 * 60
    assert plan.distill.lr == 3e-4 and plan.distill.seq_len == 4096 and plan.distill.batch_size == 16
    assert plan.model.twin_init == "lstsq" and plan.selection.noise_z == 2.0
    assert len(plan.selection.niah_tasks) * plan.selection.niah_samples >= 100
    assert plan.selection.niah_lengths == [4096]
    assert plan.data.long_sources and plan.data.scaling_sources == ["docs@26-30:aa-lcr"]
    assert not plan.model.align_attention, "the option is the ablation, not the default"
    assert make_plan("quick", 135_000_000).distill.lr == 1e-4


def test_token_scale_scales_every_stage_after_the_other_settings():
    plan = scale_tokens(apply_overrides(make_plan("halo-smollm2", 1), ["token_scale=0.1", "finetune.tokens=2e6"]))
    assert (plan.align.tokens, plan.distill.tokens, plan.finetune.tokens) == (5_000_000, 15_000_000, 200_000)
    assert plan.token_scale == 1.0
    with pytest.raises(ValueError, match="token_scale"):
        scale_tokens(apply_overrides(make_plan("smoke", 1), ["token_scale=-1"]))


@pytest.mark.parametrize("setting, message", [
    ("model.twin_init=ones", "model.twin_init must be one of none, rms, lstsq, got 'ones'"),
    ("model.twin_init_batches=0", "model.twin_init_batches must be >= 1, got 0"),
    ("selection.tie_break=random", "selection.tie_break must be one of alignment, halo, got 'random'"),
    ("selection.noise_z=-1", "selection.noise_z must be >= 0, got -1"),
    ("selection.noise_z=two", "selection.noise_z: expected a number, got 'two'"),
    ("token_scale=0", "token_scale must be > 0, got 0"),
    ("attn_align.lr=0", "attn_align.lr must be > 0, got 0"),
    ("attn_align.tokens=0.5", "attn_align.tokens: expected an integer, got 0.5"),
    ("attn_align.checkpoint_activations=true", "attn_align.checkpoint_activations: the alignment"),
    ("distill.align_documents=maybe", "distill.align_documents: expected true or false, got 'maybe'"),
    ("scaling.niah_tasks=SK1,XX", "scaling.niah_tasks: item 'XX' is not a NIAH task"),
    ("scaling.niah_samples=-1", "scaling.niah_samples must be >= 0, got -1"),
    ("scaling.per_length=1", "scaling.per_length: expected true or false, got '1'"),
    ("data.weights=1,2", "data.weights gives 2 numbers for 0 sources"),
    ("data.long_weights=0", "data.long_weights: item 0 must be > 0"),
    ("data.long_tokens=0", "data.long_tokens must be >= 1, got 0"),
])
def test_bad_recipe_settings_are_one_clear_error(setting, message):
    with pytest.raises(ValueError) as error:
        apply_overrides(make_plan("smoke", 1), [setting])
    assert message in str(error.value) and "\n" not in str(error.value)


def test_an_empty_list_switches_the_scaling_niah_off():
    plan = apply_overrides(make_plan("halo-smollm2", 1), ["scaling.niah_lengths="])
    assert plan.scaling.niah_lengths == []


def test_convert_cli_reports_a_bad_recipe_setting_in_one_line(tiny_teacher, tmp_path, capsys, monkeypatch):
    import hyla.models.loading as loading

    monkeypatch.setattr(loading, "load_teacher", lambda *a, **k: pytest.fail("the teacher loaded first"))
    assert main(convert_args(tiny_teacher, tmp_path / "run", "--set", "model.twin_init=ones")) == 2
    assert "model.twin_init" in capsys.readouterr().err
    assert not (tmp_path / "run").exists()
    assert json.dumps(make_plan("halo-smollm2", 1).to_dict())  # the plan is JSON for conversion.json


def test_a_missing_offline_text_stops_before_the_teacher_loads(tiny_teacher, tmp_path, capsys, monkeypatch):
    import hyla.data.offline as offline
    import hyla.models.loading as loading

    monkeypatch.setenv("HYLA_TEXT_DIR", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(offline, "_installed_root", lambda text: None)  # nor installed on this machine
    monkeypatch.setattr(loading, "load_teacher", lambda *a, **k: pytest.fail("the teacher loaded first"))
    assert main(convert_args(tiny_teacher, tmp_path / "run", "--set", "data.long_sources=aa-lcr")) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "aa-lcr" in err
    assert not (tmp_path / "run").exists()
