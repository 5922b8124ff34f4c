"""bench/engine_first_call.py on a CPU: each engine-settings variant runs `hyla eval niah` in a process of its own
with the settings it names, and the table reads each run's own generation record."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def first_call():
    sys.path.insert(0, str(REPO / "bench"))
    import engine_first_call

    return engine_first_call


@pytest.fixture
def model(tmp_path, smollm2_tokenizer):
    """A tiny HypeNet folder (a Lightning and an attention layer) with SmolLM2's tokenizer."""
    import torch

    from hyla.models import HypeNetConfig, HypeNetForCausalLM

    torch.manual_seed(0)
    config = HypeNetConfig(
        vocab_size=len(smollm2_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, layer_types=["lightning", "attention"],
        pad_token_id=smollm2_tokenizer.pad_token_id, eos_token_id=smollm2_tokenizer.eos_token_id)
    folder = tmp_path / "model"
    HypeNetForCausalLM(config).save_pretrained(folder)
    smollm2_tokenizer.save_pretrained(folder)
    return folder


def test_each_variant_is_the_shipped_settings_with_its_changes(first_call):
    from hyla.inference.settings import settings_from_json, tuned_settings

    shipped = tuned_settings("cpu")
    for variant, changes in first_call.VARIANTS.items():
        settings = settings_from_json(first_call.variant_settings("cpu", changes), name=variant)
        for name in ("decode_step", "matvec", "prefill_chunk", "launch_pdl"):
            assert getattr(settings, name) == getattr(shipped, name), (variant, name)
        for name in ("compile_prefill", "compile_decode", "attention_backend"):
            assert getattr(settings, name) == changes.get(name, getattr(shipped, name)), (variant, name)


def test_a_variants_batch_size_is_the_evaluations_not_a_setting(first_call, tmp_path):
    import argparse

    assert "batch_size" not in first_call.variant_settings("cpu", first_call.VARIANTS["eager-flash-batch8"])["engine"]
    args = argparse.Namespace(model="m", device="cpu", dtype="float32", tasks="SK2", lengths="64K", num_samples=25,
                              batch_size=1, max_new_tokens=64, samples_cache=None)

    def batch_size(command):
        return command[command.index("--batch-size") + 1]

    assert batch_size(first_call.niah_command(args, tmp_path, tmp_path / "s.json", 8)) == "8"
    assert batch_size(first_call.niah_command(args, tmp_path, tmp_path / "s.json")) == "1"


def _run(first_call, model, out, variants: str, *, prompts: int) -> tuple[int, list[dict]]:
    """The script on CPU, SK1 at 256 tokens, `prompts` prompts and as many new tokens, with the profile; its exit
    code and table rows."""
    code = first_call.main(["--model", str(model), "--out", str(out), "--device", "cpu", "--dtype", "float32",
                            "--tasks", "SK1", "--lengths", "256", "--num-samples", str(prompts), "--max-new-tokens",
                            str(prompts), "--variants", variants, "--profile"])
    return code, json.loads((out / "first-call.json").read_text())["rows"]


def test_variants_run_in_processes_of_their_own_and_a_failing_one_is_a_row(first_call, tmp_path, model):
    """Each variant in a process of its own, tabled from its own generation record. cuDNN's kernels take a CUDA model
    in bf16/fp16: on this CPU `eager-cudnn-padded` fails at once; it becomes a row with its error, the next variants
    run, the profile takes the first one that ran, and the script exits 1."""
    out = tmp_path / "first-call"
    code, rows = _run(first_call, model, out, "eager-cudnn-padded,shipped,eager", prompts=3)
    assert code == 1
    assert [row["variant"] for row in rows] == ["eager-cudnn-padded", "shipped", "eager"]
    assert "exited 2" in rows[0]["error"]
    assert "| eager-cudnn-padded | hyla eval niah exited 2" in (out / "first-call.md").read_text()
    for row in rows[1:]:
        ran = json.loads((out / row["variant"] / "results.json").read_text())["generation"]
        assert row["seconds"] == ran["seconds"] and row["first_prefill_s"] == ran["first_prefill_s"]
        assert row["calls"] == 3 and row["engines_built"] == 1 and row["after_first_s_per_prompt"] > 0
        # the one engine was reserved before the first batch: its build is in `seconds`, not in a later prompt's
        assert ran["reserve_s"] == ran["engine_build_s"] > 0
        assert ran["first_batch_s"] + ran["reserve_s"] + 2 * row["after_first_s_per_prompt"] == pytest.approx(
            ran["seconds"])
        assert not ran["engine"]["compile_prefill"]
    from hyla.inference.settings import tuned_settings

    assert rows[1]["settings"] == tuned_settings("cpu").name and "compile_decode=False" in rows[2]["settings"]
    profile = (out / "first-call-profile.txt").read_text()
    assert "cumulative" in profile  # a process of its own, 2 prompts
    cumulative, own = profile.split("== generation's functions by cumulative time")[1].split(
        "== generation's functions by own time")
    assert "hyla/inference/engine.py" in cumulative and "(<module>)" not in cumulative + own  # no imports there
    profiled = json.loads((out / "profile" / "results.json").read_text())["generation"]
    assert profiled["calls"] == 2 and profiled["engine"]["settings"] == tuned_settings("cpu").name  # not the failed
    assert "| shipped |" in (out / "first-call.md").read_text()


def test_an_unknown_variant_or_model_is_one_error_before_any_run(first_call, tmp_path, capsys):
    with pytest.raises(SystemExit):
        first_call.main(["--model", str(tmp_path), "--out", str(tmp_path / "o"), "--variants", "fast"])
    assert "unknown variants ['fast']" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        first_call.main(["--model", str(tmp_path / "missing"), "--out", str(tmp_path / "o")])
    assert "no model at" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
