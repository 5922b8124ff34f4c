"""bench/first_prefill_probe.py on a CPU: the engine prefills the given lengths in order in one process, each timed
alone, and the first prefill and the first longer one are profiled."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def prefill_probe():
    sys.path.insert(0, str(REPO / "bench"))
    import first_prefill_probe

    return first_prefill_probe


@pytest.fixture
def tiny_model(tmp_path):
    from hyla.models import HypeNetConfig, HypeNetForCausalLM

    torch.manual_seed(0)
    config = HypeNetConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                           layer_types=["lightning", "attention"])
    HypeNetForCausalLM(config).save_pretrained(tmp_path / "model")
    return tmp_path / "model"


def test_each_length_is_prefilled_in_order_and_the_first_ones_profiled(prefill_probe, tiny_model, tmp_path):
    out = tmp_path / "probe"
    assert prefill_probe.main(["--model", str(tiny_model), "--out", str(out), "--device", "cpu", "--dtype",
                               "float32", "--lengths", "16,16,96,90", "--profile"]) == 0
    result = json.loads((out / "first-prefill.json").read_text())
    assert [row["length"] for row in result["prefills"]] == [16, 16, 96, 90]
    assert all(row["seconds"] > 0 for row in result["prefills"])
    assert list(result["profiles"]) == ["0: 16 tokens", "2: 96 tokens"]  # the first, and the first longer one
    assert all("tottime" in text for text in result["profiles"].values())
    from hyla.inference.settings import tuned_settings
    from hyla.models import HypeNetForCausalLM

    evaluation = tuned_settings("cpu").for_evaluation(HypeNetForCausalLM.from_pretrained(tiny_model))
    assert result["settings"] == evaluation.name  # the device's settings for an evaluation, by default
    table = (out / "first-prefill.md").read_text()
    assert "| 2 | 96 |" in table and "Prefill 2: 96 tokens" in table


def test_bad_lengths_are_one_error_before_the_model_loads(prefill_probe, tmp_path, capsys):
    with pytest.raises(SystemExit):
        prefill_probe.main(["--model", str(tmp_path), "--out", str(tmp_path / "o"), "--lengths", "256,a"])
    assert "--lengths: comma-separated token counts" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        prefill_probe.main(["--model", str(tmp_path / "none"), "--out", str(tmp_path / "o")])
    assert "no model at" in capsys.readouterr().err
