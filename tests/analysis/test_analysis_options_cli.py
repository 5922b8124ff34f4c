"""`hyla analyze hitrate|entropy` on tiny GLA and GDN hybrids, with and without the inference options of `hyla eval
niah` (EME's SWLA, logit scaling c(L)): the options reach α~ and results.json, bad ones fail before any model work."""

import json
import math

import pytest
import torch
from test_analysis_cli import SAMPLE_OPTIONS
from transformers import LlamaConfig

import hyla.analysis.plots as plots
import hyla.analysis.run as run
from hyla import HypeNetForCausalLM
from hyla.cli import main

# A window far below the 1K prompts, so that it bites in every recurrent head; c(L) > 1 at the answer position.
EME_WINDOW = 32
EME_OPTIONS = ["--eme-window", str(EME_WINDOW), "--eme-stride", "8", "--logit-scaling", "per_length",
               "--logit-scaling-train-length", "256"]
RECORDED = {"logit_scaling": "per_length", "logit_scaling_train_length": 256, "eme_window": EME_WINDOW,
            "eme_stride": 8}


@pytest.fixture(scope="module", params=["gla", "gdn"])
def hybrid_folder(request, tmp_path_factory, tokenizer, make_tiny_config):
    """A saved 4-layer hybrid: three `request.param` layers and one NoPE attention layer, with its byte tokenizer."""
    folder = tmp_path_factory.mktemp(f"tiny-{request.param}")
    torch.manual_seed(0)
    config = make_tiny_config(layer_types=[request.param] * 3 + ["attention"])
    HypeNetForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def analyze(verb, folder, out, *options):
    assert main(["analyze", verb, "--model", str(folder), "--out", str(out), *SAMPLE_OPTIONS, *options]) == 0
    return json.loads((out / "results.json").read_text())


@pytest.fixture
def saved_figures(monkeypatch):
    """The figures the plots save, by file name."""
    figures, save = {}, plots.save_figure

    def keep(figure, path):
        figures[path.name] = figure
        save(figure, path)

    monkeypatch.setattr(plots, "save_figure", keep)
    return figures


def test_hitrate_runs_under_eme_and_records_it(hybrid_folder, tmp_path, saved_figures):
    plain = analyze("hitrate", hybrid_folder, tmp_path / "plain", "--top-k", "16")
    eme = analyze("hitrate", hybrid_folder, tmp_path / "eme", "--top-k", "16", *EME_OPTIONS)
    assert plain["settings"]["inference_options"] is None
    assert eme["settings"]["inference_options"] == RECORDED
    # SWLA: the answer reads at most W keys, so H~ ≤ log W / log L, which some heads exceed without it.
    bound = math.log(EME_WINDOW) / math.log(max(sample["num_tokens"] for sample in eme["samples"]))
    recurrent = [(before, after) for before, after in zip(plain["heads"], eme["heads"])
                 if after["head_kind"] == "recurrent"]
    assert all(after["answer_entropy"] <= bound + 1e-6 for _, after in recurrent)
    assert any(before["answer_entropy"] > bound for before, _ in recurrent)
    # c(L) changes every NoPE head.
    assert all(after["answer_entropy"] != before["answer_entropy"] for before, after in zip(plain["heads"], eme["heads"])
               if after["head_kind"] == "NoPE attention")
    assert (tmp_path / "eme" / "entropy_vs_hitrate.png").stat().st_size > 0
    # Recurrent and NoPE heads are told apart by their markers, not only by colour (seed 003 Fig. 12(b), 21(b)).
    collections = saved_figures["entropy_vs_hitrate.png"].axes[0].collections
    labels = [collection.get_label() for collection in collections]
    assert any("recurrent" in label for label in labels) and any("NoPE attention" in label for label in labels)
    recurrent, nope = (next(c for c in collections if kind in c.get_label()) for kind in ("recurrent", "NoPE"))
    assert recurrent.get_paths()[0].vertices.shape != nope.get_paths()[0].vertices.shape


def test_entropy_runs_under_eme_and_records_it(hybrid_folder, tmp_path):
    plain = analyze("entropy", hybrid_folder, tmp_path / "plain", "--num-query-positions", "32")
    eme = analyze("entropy", hybrid_folder, tmp_path / "eme", "--num-query-positions", "32", "--eme-window", "32")
    assert plain["settings"]["inference_options"] is None
    # The stride in use (W // 4 by default) is recorded with the window.
    assert eme["settings"]["inference_options"] == {"eme_window": 32, "eme_stride": 8}
    assert {head["head_kind"] for head in eme["heads"]} == {"recurrent", "NoPE attention"}
    assert [head["entropy"] for head in eme["heads"]] != [head["entropy"] for head in plain["heads"]]
    for name in ("entropy_by_head.png", "entropy_by_position.png"):
        assert (tmp_path / "eme" / name).stat().st_size > 0


@pytest.fixture
def no_model_work(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(run, "load_model", refuse)


@pytest.mark.parametrize("options, message", [
    (["--eme-window", "256"], "--eme-window changes no layer of"),
    (["--logit-scaling", "per_length", "--logit-scaling-train-length", "256"],
     "--logit-scaling-train-length changes no layer of"),
    (["--logit-scaling", "per-length"], "logit_scaling must be one of per_query, per_length, off"),
    (["--logit-scaling-train-length", "256"], "logit_scaling_train_length is the L0 of logit_scaling='per_length'"),
    (["--eme-stride", "64"], "eme_stride needs eme_window"),
    (["--eme-window", "64", "--eme-stride", "128"], "EME needs 1 <= eme_stride <= eme_window"),
])
def test_bad_options_fail_in_one_line_before_any_model_work(tmp_path, capsys, no_model_work, make_tiny_config,
                                                            options, message):
    # SWA layers only (they keep their own window under EME, and scale no logits): neither EME nor c(L) has a layer
    # to change. The config alone is enough.
    folder = tmp_path / "swa-only"
    make_tiny_config(layer_types=["swa"] * 4).save_pretrained(folder)
    for verb in ("hitrate", "entropy"):
        code = main(["analyze", verb, "--model", str(folder), "--out", str(tmp_path / "out"), *options])
        error = capsys.readouterr().err.strip()
        assert code == 2 and error.startswith("hyla analyze: error:") and "\n" not in error
        assert message in error


def test_options_on_a_teacher_fail_before_loading_it(tmp_path, capsys, no_model_work):
    folder = tmp_path / "llama"
    LlamaConfig(num_hidden_layers=1).save_pretrained(folder)
    code = main(["analyze", "hitrate", "--model", str(folder), "--eme-window", "256"])
    error = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in error and "--eme-window needs a hyla HypeNet model" in error
