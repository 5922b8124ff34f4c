"""`hyla convert` with `model.rnn_mixer` = gla, gdn or swa on a tiny random teacher: the exported hybrid loads, holds
the trained twins, survives save/load and decodes as its full forward; the setting is checked before any work and
recorded; Lightning runs keep their settings (and hash)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from test_convert_pipeline import convert_args, manifest, tiny_corpus  # noqa: F401  (the module's corpus fixture)
from transformers import LlamaConfig, LlamaForCausalLM

from hyla.cli import main
from hyla.convert.align import AlignmentTwins
from hyla.convert.distill import build_student
from hyla.convert.pipeline import ConvertRequest, stage_settings
from hyla.convert.presets import RNN_MIXERS, apply_overrides, make_plan
from hyla.models import HybridCache
from hyla.models.transfer import TWIN_BUILDERS, to_hypenet

# Two steps per training stage: what is checked is the plumbing, not what the stages learn.
SHORTER = ["--set", "align.tokens=512", "--set", "distill.tokens=512", "--set", "finetune.tokens=512"]
WINDOW = 16  # below the decode test's 40 tokens, so that the window matters there
# float32 end to end, prefill/decode against one forward: the model tests' bound (tests/models/test_hypenet.py).
ATOL = 1e-4


def mixer_args(kind: str) -> list[str]:
    args = ["--set", f"model.rnn_mixer={kind}"]
    return args + (["--set", f"model.swa_window={WINDOW}"] if kind == "swa" else [])


def decoded_logits(model, tokens: torch.Tensor, prefill: int) -> torch.Tensor:
    """Logits of `tokens` from a prefill of the first `prefill` tokens, then one token at a time from the cache."""
    cache = HybridCache(model.config.layer_types)
    pieces = [model(tokens[:, :prefill], past_key_values=cache, use_cache=True).logits]
    for t in range(prefill, tokens.shape[1]):
        pieces.append(model(tokens[:, t : t + 1], past_key_values=cache, use_cache=True).logits)
    return torch.cat(pieces, 1)


@pytest.mark.parametrize("kind,rope", [("gla", False), ("gdn", False), ("swa", False), ("gla", True)])
def test_conversion_with_each_mixer_exports_a_model_that_loads_round_trips_and_decodes(kind, rope, tiny_teacher,
                                                                                       tiny_corpus, tmp_path):
    """With `model.gla_rope=true` the twins, the student and the export have RoPE, and the manifests say so."""
    from transformers import AutoModelForCausalLM

    out = tmp_path / "run"
    rope_args = ["--set", f"model.{kind}_rope=true"] if rope else []
    assert main(convert_args(tiny_teacher, out, "--data", str(tiny_corpus), *SHORTER, *mixer_args(kind),
                             *rope_args)) == 0
    model = AutoModelForCausalLM.from_pretrained(out / "06-export").eval()
    assert sorted(model.config.layer_types) == ["attention"] + [kind] * 3
    report = json.loads((out / "06-export" / "conversion.json").read_text())
    assert report["plan"]["model"]["rnn_mixer"] == kind
    assert manifest(out, "align")["settings"]["rnn_mixer"] == kind
    if kind in ("gla", "gdn"):
        assert getattr(model.config, f"{kind}_rope") is rope and report["plan"]["model"][f"{kind}_rope"] is rope
        assert manifest(out, "align")["settings"]["twins"].get(f"{kind}_rope", False) is rope
        assert all(block.mixer.use_rope is rope for block in model.model.layers if block.layer_type == kind)
        assert (f"`model.{kind}_rope`" in (out / "06-export" / "README.md").read_text()) is rope
    align = manifest(out, "align")["results"]
    if kind == "swa":
        assert model.config.swa_window == WINDOW
        assert align["steps"] == 0 and align["aligned"] is False and len(align["relative_error"]) == 4
        assert not (out / "01-align" / "metrics.jsonl").exists()
    else:
        assert align["steps"] == 2 and len(align["init"]["input_mean_share"]) == 4
    # The exported weights are stage 3's, which started from the twins of stage 1.
    trained = load_file(out / "04-finetune" / "student.safetensors")
    exported = model.state_dict()
    # A parameter only the mixer has: 3 layers; for swa, the stage-2 output gate, on the attention layer too.
    own, count = {"gla": ("gk_proj.1.bias", 3), "gdn": ("A_log", 3), "swa": ("g_proj.bias", 4)}[kind]
    assert sum(name.endswith(own) for name in trained) == count
    assert all(torch.equal(exported[name], value) for name, value in trained.items())
    tokens = torch.randint(3, 200, (2, 40), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        full = model(tokens, use_cache=False).logits
        assert (decoded_logits(model, tokens, prefill=23) - full).abs().max().item() <= ATOL
        model.save_pretrained(tmp_path / "again")
        again = AutoModelForCausalLM.from_pretrained(tmp_path / "again").eval()
        assert torch.equal(again(tokens, use_cache=False).logits, full)


@pytest.mark.parametrize("kind", ["gla", "swa"])
def test_halo_selection_scores_each_layer_with_its_twin(kind, tiny_teacher, tiny_corpus, tmp_path):
    """Selection swaps the stage-1 twins in one at a time; SWA's tie-break reads the error stage 1 measured."""
    out = tmp_path / "run"
    scoring = ["--set", "selection.niah_lengths=512", "--set", "selection.niah_samples=1",
               "--set", "selection.csr_tasks=arc_easy", "--set", "selection.csr_limit=2"]
    args = convert_args(tiny_teacher, out, "--data", str(tiny_corpus), *SHORTER, *scoring, *mixer_args(kind),
                        select="halo")
    assert main(["convert", "select", *args[1:]]) == 0
    selection = json.loads((out / "02-select" / "selection.json").read_text())
    assert [row["layer"] for row in selection["layers"]] == [0, 1, 2, 3] and len(selection["chosen"]) == 1
    if kind == "swa":
        measured = manifest(out, "align")["results"]["relative_error"]
        assert selection["noise"]["tie_break"] == "alignment"
        assert [row["alignment_error"] for row in selection["layers"]] == pytest.approx(measured, rel=1e-12)


def small_teacher():
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=120, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                        num_attention_heads=4, num_key_value_heads=2)).eval()


@pytest.mark.parametrize("kind", ["gla", "gdn"])
def test_the_student_takes_its_layers_from_the_twins_file(kind, tmp_path):
    teacher = small_teacher()
    equivalent = to_hypenet(teacher, attention_rope=True).eval()
    twins = AlignmentTwins(equivalent, teacher, rnn_mixer=kind)
    with torch.no_grad():
        for param in twins.parameters():
            param.add_(torch.randn_like(param))  # "trained": unlike anything the transfer builds
    save_file(twins.twin_state_dict(), tmp_path / "twins.safetensors")
    student = build_student(teacher, [1], tmp_path / "twins.safetensors", rnn_mixer=kind)
    assert [block.layer_type for block in student.model.layers] == [kind, "attention", kind]
    for index in (0, 2):
        expected = twins.twins[index].state_dict()
        actual = student.model.layers[index].mixer.state_dict()
        assert expected.keys() == actual.keys()
        assert all(torch.equal(actual[name], expected[name]) for name in expected)


def test_swa_student_layers_are_the_teacher_attention_with_the_new_output_gate(tmp_path):
    teacher = small_teacher()
    equivalent = to_hypenet(teacher, attention_rope=True).eval()
    twins = AlignmentTwins(equivalent, teacher, rnn_mixer="swa")
    save_file(twins.twin_state_dict(), tmp_path / "twins.safetensors")
    student = build_student(teacher, [1], tmp_path / "twins.safetensors", rnn_mixer="swa", swa_window=WINDOW)
    assert student.config.layer_types == ["swa", "attention", "swa"] and student.config.swa_window == WINDOW
    for index in (0, 2):
        mixer, source = student.model.layers[index].mixer, teacher.model.layers[index].self_attn
        for name in ("q_proj", "k_proj", "v_proj", "o_proj"):
            assert torch.equal(getattr(mixer, name).weight, getattr(source, name).weight)
        # Stage 2's gate, as on the kept attention layers: W = 0, b = attention_gate_init_bias.
        assert torch.equal(mixer.g_proj.weight, torch.zeros_like(mixer.g_proj.weight))
        assert torch.equal(mixer.g_proj.bias, torch.full_like(mixer.g_proj.bias, 4.0))


def test_plan_mixers_are_the_transfer_builders():
    assert RNN_MIXERS == tuple(TWIN_BUILDERS)


def test_an_unknown_mixer_stops_with_one_line_before_any_work(tiny_teacher, tmp_path, capsys):
    out = tmp_path / "run"
    capsys.readouterr()
    assert main(convert_args(tiny_teacher, out, "--set", "model.rnn_mixer=glaa")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert "model.rnn_mixer must be one of lightning, gla, gdn, swa (did you mean 'gla'?), got 'glaa'" in err[0]
    assert not out.exists()


def test_lightning_runs_keep_their_stage_settings_and_other_mixers_change_stage_1_on():
    request = ConvertRequest(teacher="unused", out=Path("unused"), data=["stdlib"])
    default = stage_settings(make_plan("smoke", 0), request)
    # A Lightning plan's settings name neither the mixer nor the SWA window: earlier runs keep their hash.
    lightning = stage_settings(apply_overrides(make_plan("smoke", 0), ["model.rnn_mixer=lightning"]), request)
    assert lightning == default and "rnn_mixer" not in default["align"]
    assert set(default["align"]["twins"]) == {"lightning_rope", "lightning_qk_norm"}
    gla = stage_settings(apply_overrides(make_plan("smoke", 0), ["model.rnn_mixer=gla"]), request)
    assert gla["data"] == default["data"] and gla["align"]["rnn_mixer"] == "gla"
    assert all(gla[name] != default[name] for name in ("align", "select", "distill", "export"))
    # GLA's RoPE is named only when on (GLA runs without it keep their hash) and redoes stage 1 on.
    assert "gla_rope" not in gla["align"]["twins"]
    gla_rope = stage_settings(apply_overrides(make_plan("smoke", 0), ["model.rnn_mixer=gla", "model.gla_rope=true"]),
                              request)
    assert gla_rope["align"]["twins"]["gla_rope"] is True and gla_rope["align"] != gla["align"]
    swa = stage_settings(apply_overrides(make_plan("smoke", 0), ["model.rnn_mixer=swa", "model.swa_window=64"]),
                         request)
    assert swa["align"]["twins"]["swa_window"] == 64


def test_another_mixer_on_an_aligned_run_folder_is_refused(tiny_teacher, tiny_corpus, tmp_path, capsys):
    out = tmp_path / "run"
    stop = ["--data", str(tiny_corpus), *SHORTER, "--until-stage", "align"]
    assert main(convert_args(tiny_teacher, out, *stop, *mixer_args("gla"))) == 0
    capsys.readouterr()
    assert main(convert_args(tiny_teacher, out, *stop, *mixer_args("gdn"))) == 2
    err = capsys.readouterr().err
    assert "rnn_mixer 'gla' then, 'gdn' now" in err and "--from-stage align" in err
