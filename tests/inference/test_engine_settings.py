"""The engine's settings: the shipped files, their `evaluation` fields (what an evaluation runs on top of the tuned
settings), and fitting a settings' fused prefill attention to a model that cannot run it."""

import dataclasses
import json
from importlib import resources

import pytest
import torch

from hyla import HypeNetConfig, HypeNetForCausalLM
from hyla.inference import generate as generate_module
from hyla.inference.generate import GenerationSession
from hyla.inference.settings import (
    TUNED_DIR,
    EngineSettings,
    load_settings,
    settings_from_json,
)


def shipped_files():
    folder = resources.files("hyla.inference") / TUNED_DIR
    return sorted(entry.name for entry in folder.iterdir() if entry.name.endswith(".json"))


@pytest.mark.parametrize("file_name", shipped_files())
def test_each_shipped_file_reads_and_writes_back_the_same(file_name):
    payload = json.loads((resources.files("hyla.inference") / TUNED_DIR / file_name).read_text())
    settings = settings_from_json(payload, name=file_name)
    assert settings_from_json(settings.to_json(), name=file_name) == settings
    for field, value in settings.evaluation:  # each evaluation field names a real field, of its type
        assert isinstance(value, type(getattr(settings, field))), field


def test_the_h200_evaluation_compiles_nothing_and_runs_cudnn_on_bucketed_lengths():
    """The fastest variant end to end that passed the GPU test of its prefill against float32
    (docs/results/generate-speed.md: eager-cudnn-padded, 8.07 s against 9.20 s for 25 prompts at 64K)."""
    payload = json.loads((resources.files("hyla.inference") / TUNED_DIR / "nvidia-h200.json").read_text())
    shipped = settings_from_json(payload, name="nvidia-h200")
    evaluation = shipped.for_evaluation()
    assert shipped.compile_prefill and shipped.compile_decode and shipped.attention_backend == "auto"  # benchmarks'
    assert not evaluation.compile_prefill and not evaluation.compile_decode
    assert evaluation.attention_backend == "cudnn-padded"
    assert evaluation.evaluation == () and "evaluation: " in evaluation.name
    # everything else as shipped
    same = {f.name for f in dataclasses.fields(EngineSettings)} - {"compile_prefill", "compile_decode",
                                                                   "attention_backend", "evaluation", "name"}
    assert all(getattr(evaluation, name) == getattr(shipped, name) for name in same)


def test_settings_without_evaluation_fields_are_their_own_evaluation():
    settings = EngineSettings(prefill_chunk=128, name="plain")
    assert settings.for_evaluation() is settings


def test_an_unknown_evaluation_field_is_one_error(tmp_path):
    path = tmp_path / "settings.json"
    path.write_text(json.dumps({"name": "x", "engine": {}, "evaluation": {"compile_everything": True}}))
    with pytest.raises(ValueError, match=r"unknown engine settings \['compile_everything'\]"):
        load_settings(path)


def tiny_model(dtype=torch.float32):
    torch.manual_seed(0)
    config = HypeNetConfig(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                           layer_types=["lightning", "attention"], pad_token_id=0, eos_token_id=None,
                           bos_token_id=None)
    return HypeNetForCausalLM(config).to(dtype).eval()


def test_an_evaluations_fused_attention_kernel_applies_only_to_a_model_that_can_run_it():
    settings = EngineSettings(evaluation=(("attention_backend", "flash"), ("compile_prefill", False)), name="t")
    for_cpu = settings.for_evaluation(tiny_model())  # float32 on CPU: flash cannot run it, the rest applies
    assert (for_cpu.attention_backend, for_cpu.compile_prefill) == ("auto", False)
    assert for_cpu.name == "t (evaluation: compile_prefill=False)"
    only_flash = EngineSettings(evaluation=(("attention_backend", "flash"),), name="t").for_evaluation(tiny_model())
    assert (only_flash.attention_backend, only_flash.evaluation, only_flash.name) == ("auto", (), "t")
    assert settings.for_evaluation().attention_backend == "flash"  # no model given: as written


@pytest.mark.parametrize("evaluation", [True, False])
def test_an_evaluation_session_builds_its_engine_with_the_evaluation_fields(monkeypatch, evaluation):
    """GenerationSession(evaluation=True) (every evaluation's, through hyla.evals.generation.Generation) applies the
    tuned settings' evaluation fields; other generation (hyla.generate, model.generate) runs them as they are."""
    tuned = EngineSettings(prefill_chunk=4096, evaluation=(("prefill_chunk", 16),), name="tuned")
    monkeypatch.setattr(generate_module, "tuned_settings", lambda device: tuned)
    session = GenerationSession(tiny_model(), evaluation=evaluation)
    ids = torch.randint(1, 61, (1, 40))
    session.generate(ids, max_new_tokens=2)
    assert session.engine.settings.prefill_chunk == (16 if evaluation else 4096)
    assert ("evaluation: prefill_chunk=16" in session.engine.settings.name) == evaluation


def test_an_evaluations_generation_asks_for_the_evaluation_settings(monkeypatch):
    from hyla.evals.generation import Generation

    tuned = EngineSettings(evaluation=(("prefill_chunk", 16),), name="tuned")
    monkeypatch.setattr(generate_module, "tuned_settings", lambda device: tuned)
    generation = Generation(tiny_model(), "engine")
    generation.batch(torch.randint(1, 61, (1, 20)), torch.ones(1, 20, dtype=torch.long), max_new_tokens=2,
                     pad_token_id=0)
    assert generation.describe()["engine"]["prefill_chunk"] == 16


def test_given_settings_take_their_batched_fields_above_batch_1():
    """Settings given to a session (`hyla eval niah --engine-settings FILE`) are fitted to each engine's batch size as
    the tuned ones are: a file whose batch-1 step is triton-fused decodes a batch of 3 on its `batched` step (before,
    the engine refused it: 'decode_step='triton-fused' decodes one sequence')."""
    given = EngineSettings(decode_step="triton-fused", batched=(("decode_step", "fused-projections"),), name="file")
    session = GenerationSession(tiny_model(), settings=given)
    out = session.generate(torch.randint(1, 61, (3, 24)), max_new_tokens=2)
    assert out.shape == (3, 26) and session.engine.settings.decode_step == "fused-projections"
    session.generate(torch.randint(1, 61, (1, 24)), max_new_tokens=2)  # batch 1 reuses the engine's 3 rows
    assert session.engine.batch_size == 3
