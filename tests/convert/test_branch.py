"""A conversion's variant from its own earlier stages: the stage folders copied into a new run folder, then `hyla
convert --from-stage` there with other settings (what the recipe plan's branch jobs do)."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import torch

from test_convert_pipeline import convert_args

from hyla.cli import main


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def copied_stages(source: Path, branch: Path) -> Path:
    """Stages 0-3 of `source` in a new run folder, as the plan's branch-copy job copies them."""
    for stage in ("00-data", "01-align", "02-select", "03-distill"):
        shutil.copytree(source / stage, branch / stage, ignore=shutil.ignore_patterns("checkpoints"))
    return branch


def test_a_second_stage_three_from_a_copied_distilled_student(distilled_run, tiny_teacher, tmp_path):
    branch = copied_stages(distilled_run[0], tmp_path / "branch")
    student = digest(branch / "03-distill" / "student.safetensors")
    distill_manifest = (branch / "03-distill" / "manifest.json").read_text()
    assert main(convert_args(tiny_teacher, branch, "--from-stage", "finetune", "--set", "finetune.lr=3e-3",
                             "--set", "finetune.schedule=cosine", "--set", "finetune.warmup_steps=1")) == 0
    # Stages 0-3 are read, not redone; stage 3 trained with the branch's settings; the branch exports a model.
    assert digest(branch / "03-distill" / "student.safetensors") == student
    assert (branch / "03-distill" / "manifest.json").read_text() == distill_manifest
    finetune = json.loads((branch / "04-finetune" / "manifest.json").read_text())
    assert finetune["status"] == "complete"
    lrs = [json.loads(line)["lr"] for line in (branch / "04-finetune" / "metrics.jsonl").read_text().splitlines()
           if line.strip()]
    assert max(lrs) > 1e-3  # the branch's peak (the preset's stage 3 is 1e-5 constant)
    assert (branch / "06-export" / "config.json").is_file()


def test_a_second_distillation_from_copied_aligned_twins(distilled_run, tiny_teacher, tmp_path):
    branch = copied_stages(distilled_run[0], tmp_path / "branch")
    twins = digest(branch / "01-align" / "twins.safetensors")
    student = digest(branch / "03-distill" / "student.safetensors")
    assert main(convert_args(tiny_teacher, branch, "--from-stage", "distill", "--set", "distill.lr=3e-3",
                             "--until-stage", "distill")) == 0
    assert digest(branch / "01-align" / "twins.safetensors") == twins
    lrs = [json.loads(line)["lr"] for line in (branch / "03-distill" / "metrics.jsonl").read_text().splitlines()
           if line.strip()]
    assert max(lrs) > 1e-3  # the branch's peak; the run it came from distilled at the smoke preset's 1e-4
    assert digest(branch / "03-distill" / "student.safetensors") != student


def test_a_branch_with_more_distillation_tokens_reuses_a_data_stage_prepared_for_it(tiny_teacher, tmp_path, capsys):
    """The data stage's settings hold its token count (the largest draw): a variant that distils longer finds it
    incompatible unless the run it is copied from prepared as many (`data.min_tokens`), and then reads it as is."""
    small, large = ["--set", "distill.tokens=1024"], ["--set", "distill.tokens=4096"]
    main_run = tmp_path / "main"
    assert main(convert_args(tiny_teacher, main_run, *small, "--until-stage", "distill")) == 0
    refused = copied_stages(main_run, tmp_path / "refused")
    assert main(convert_args(tiny_teacher, refused, *large, "--from-stage", "distill")) == 2
    assert "00-data was made with other settings" in capsys.readouterr().err
    prepared = tmp_path / "prepared"
    at_least = ["--set", "data.min_tokens=4096"]
    assert main(convert_args(tiny_teacher, prepared, *small, *at_least, "--until-stage", "distill")) == 0
    corpus = digest(prepared / "00-data" / "manifest.json")
    branch = copied_stages(prepared, tmp_path / "branch")
    assert main(convert_args(tiny_teacher, branch, *large, *at_least, "--from-stage", "distill",
                             "--until-stage", "distill")) == 0
    assert digest(branch / "00-data" / "manifest.json") == corpus
    distilled = json.loads((branch / "03-distill" / "manifest.json").read_text())["results"]["tokens"]
    assert distilled == 4096 and json.loads((prepared / "03-distill" / "manifest.json").read_text())[
        "results"]["tokens"] == 1024


def _tensors(path: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(path))


def _teacher_tensors(teacher: Path) -> dict:
    tensors = {}
    for file in sorted(teacher.glob("*.safetensors")):
        tensors.update(_tensors(file))
    return tensors


def test_a_distillation_that_freezes_the_attention_layers(distilled_run, tiny_teacher, tmp_path):
    """`distill.freeze`: the kept attention layers' teacher weights leave stage 2 as the teacher has them (the
    student's attention mixer is the teacher's attention: to_hypenet copies q, k, v, o), everything else trains."""
    selection = json.loads((distilled_run[0] / "02-select" / "selection.json").read_text())
    chosen = selection["chosen"]
    assert chosen, "the uniform selection keeps one attention layer of four"
    teacher = _teacher_tensors(tiny_teacher)
    trained = _tensors(distilled_run[0] / "03-distill" / "student.safetensors")
    results = {}
    for name, part, lr in (("attention", "attention", "3e-3"), ("attention-layers", "attention-layers", "3e-3"),
                           ("attention-layers-lr", "attention-layers", "1e-3")):
        branch = copied_stages(distilled_run[0], tmp_path / name)
        assert main(convert_args(tiny_teacher, branch, "--from-stage", "distill", "--set", f"distill.freeze={part}",
                                 "--set", f"distill.lr={lr}", "--until-stage", "distill")) == 0
        results[name] = _tensors(branch / "03-distill" / "student.safetensors")
        settings = json.loads((branch / "03-distill" / "manifest.json").read_text())["settings"]
        assert json.dumps(settings).count(f'"freeze": "{part}"') == 1
    for layer in chosen:
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            student_key, teacher_key = f"model.layers.{layer}.mixer.{name}.weight", \
                f"model.layers.{layer}.self_attn.{name}.weight"
            expected = teacher[teacher_key].float()
            for part in results:
                assert torch.equal(results[part][student_key], expected), (part, student_key)
            assert not torch.equal(trained[student_key], expected)  # the run without freeze moved them
        prefix = f"model.layers.{layer}."
        gate, mlp = prefix + "mixer.g_proj.weight", prefix + "mlp.down_proj.weight"
        norm = prefix + "input_layernorm.weight"
        # "attention": the new output gate and the layer's MLP still train; "attention-layers": neither moves, so
        # two such runs at different learning rates end with the gate they both started from.
        assert not torch.equal(results["attention"][mlp], teacher[mlp].float())
        assert not torch.equal(results["attention"][gate], results["attention-layers"][gate])
        assert torch.equal(results["attention-layers"][mlp], teacher[mlp].float())
        assert torch.equal(results["attention-layers"][norm], teacher[norm].float())
        assert torch.equal(results["attention-layers"][gate], results["attention-layers-lr"][gate])
    # Every layer that is not attention trains either way.
    layers = {int(key.split(".")[2]) for key in trained if key.startswith("model.layers.")}
    other = next(i for i in sorted(layers) if i not in chosen)
    key = f"model.layers.{other}.mlp.down_proj.weight"
    assert not torch.equal(results["attention"][key], teacher[key].float())
    assert not torch.equal(results["attention-layers"][key], results["attention-layers-lr"][key])


def test_freeze_keeps_nope_and_rope_attention_layers_and_refuses_a_student_without_them():
    from hyla.convert.distill import freeze
    from hyla.models import HypeNetConfig, HypeNetForCausalLM

    def tiny(layer_types):
        return HypeNetForCausalLM(HypeNetConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=len(layer_types),
            num_attention_heads=4, num_key_value_heads=2, layer_types=layer_types, attention_output_gate=True))

    model = tiny(["lightning", "attention", "attention_rope"])
    mixer = ["q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight"]
    assert sorted(freeze(model, "attention")) == sorted(f"model.layers.{i}.mixer.{name}" for i in (1, 2)
                                                        for name in mixer)
    assert {name for name, p in model.named_parameters() if not p.requires_grad} == set(freeze(model, "attention"))
    whole = tiny(["lightning", "attention", "attention_rope"])
    names = set(freeze(whole, "attention-layers"))
    assert {name for name, _ in whole.named_parameters() if name.startswith(("model.layers.1.", "model.layers.2."))} \
        == names
    assert freeze(tiny(["lightning", "attention"]), "none") == []
    with pytest.raises(ValueError, match="no attention layer"):
        freeze(tiny(["lightning", "lightning"]), "attention")


def test_freeze_is_refused_for_the_alignment(tiny_teacher, tmp_path, capsys):
    assert main(convert_args(tiny_teacher, tmp_path / "run", "--set", "align.freeze=attention")) == 2
    err = capsys.readouterr().err
    assert "align.freeze" in err and not (tmp_path / "run").exists()
    assert main(convert_args(tiny_teacher, tmp_path / "run", "--set", "distill.freeze=attn")) == 2
    assert "distill.freeze" in capsys.readouterr().err and not (tmp_path / "run").exists()
