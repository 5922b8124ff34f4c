"""Attention alignment before distillation (`model.align_attention`) and the stage-1 twin init, on a tiny teacher."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from hyla.cli import main
from hyla.convert.align_attention import AttentionAlignment, attention_alignment_loss
from hyla.convert.distill import build_student
from hyla.models.transfer import to_hypenet
from test_convert_pipeline import convert_args, manifest


def tiny_pair(attention_rope: bool):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    teacher = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=3,
                                           num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=True))
    with torch.no_grad():
        for layer in teacher.model.layers:
            # Sharp attention of a sizeable output, so that RoPE matters (random init is near uniform and tiny).
            for name, factor in (("q_proj", 8.0), ("k_proj", 8.0), ("v_proj", 10.0)):
                getattr(layer.self_attn, name).weight.mul_(factor)
    equivalent = to_hypenet(teacher, attention_rope=True).eval()
    student = build_student(teacher, [0, 2], attention_rope=attention_rope)
    return equivalent, student


def test_a_student_layer_that_equals_its_teacher_has_zero_loss():
    equivalent, student = tiny_pair(attention_rope=True)
    for i in (0, 2):
        with torch.no_grad():
            # An open gate makes the RoPE student layer the teacher's own.
            student.model.layers[i].mixer.g_proj.bias.fill_(50.0)
    batch = {"input_ids": torch.randint(0, 64, (2, 16))}
    loss, metrics = attention_alignment_loss(AttentionAlignment(equivalent, student, [0, 2]), batch)
    assert loss.item() < 1e-10 and sorted(metrics) == ["energy_00", "energy_02", "mse_00", "mse_02"]


def test_nope_layers_move_toward_the_rope_teacher_and_the_teacher_stays_frozen():
    equivalent, student = tiny_pair(attention_rope=False)
    model = AttentionAlignment(equivalent, student, [2, 0])
    assert model.layers == [0, 2] and len(list(model.parameters())) > 0
    teacher_state = {k: v.clone() for k, v in equivalent.state_dict().items()}
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    batch = {"input_ids": torch.randint(0, 64, (4, 32), generator=torch.Generator().manual_seed(1))}
    losses = []
    for _ in range(30):
        loss, _ = attention_alignment_loss(model, batch)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert losses[0] > 1e-4 and losses[-1] < 0.8 * losses[0]
    assert all(torch.equal(teacher_state[k], v) for k, v in equivalent.state_dict().items())
    # The student itself is untouched until the aligned weights are loaded into it.
    assert torch.equal(student.model.layers[0].mixer.q_proj.weight, equivalent.model.layers[0].mixer.q_proj.weight)


def test_convert_with_attention_alignment_records_it_and_resumes_without_redoing_it(tiny_teacher, tmp_path, capsys):
    out = tmp_path / "run"
    extra = ["--set", "model.align_attention=true", "--set", "attn_align.tokens=512", "--set", "attn_align.seq_len=64",
             "--set", "attn_align.batch_size=2", "--set", "attn_align.checkpoint_every=2", "--set",
             "attn_align.warmup_steps=1", "--set", "attn_align.lr=1e-3", "--until-stage", "distill"]
    assert main(convert_args(tiny_teacher, out, *extra, select="1,3")) == 0
    printed = capsys.readouterr().out
    assert "attn_align" in printed or "attn-align" in printed
    aligned = manifest(out, "distill")["results"]["attention_align"]
    assert aligned["layers"] == [1, 3] and aligned["steps"] == 4 and not aligned["skipped"]
    assert set(aligned["relative_error_last"]) == {"01", "03"}
    weights = load_file(str(out / "03-distill" / "attention-align" / "attention.safetensors"))
    assert sorted({key.split(".")[0] for key in weights}) == ["1", "3"] and "1.g_proj.bias" in weights
    # The same settings find the stage complete; without the option the distill stage's settings differ.
    assert main(convert_args(tiny_teacher, out, *extra, select="1,3")) == 0
    assert "[distill] complete" in capsys.readouterr().out
    assert main(convert_args(tiny_teacher, out, "--until-stage", "distill", select="1,3")) == 2
    assert "--from-stage distill" in capsys.readouterr().err


def test_stage_one_records_the_twin_init_and_the_energies(tiny_teacher, tmp_path):
    out = tmp_path / "run"
    assert main(convert_args(tiny_teacher, out, "--until-stage", "align", "--set", "model.twin_init=rms")) == 0
    init = manifest(out, "align")["results"]["init"]
    assert init["mode"] == "rms" and init["batches"] == 4
    assert len(init["relative_error_before"]) == len(init["relative_error_after"]) == len(init["energy"]) == 4
    rows = [json.loads(line) for line in (out / "01-align" / "metrics.jsonl").read_text().splitlines()]
    assert {"mse_00", "energy_00", "energy_03"} <= rows[0].keys()
