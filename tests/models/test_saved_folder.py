"""A saved HypeNet folder describes only the model it holds and loads through transformers' Auto classes, with
`import hyla` or with `trust_remote_code=True`; without either, or without hyla, the error says what is needed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from hyla import HypeNetConfig, HypeNetForCausalLM


def _save(folder, layer_types):
    torch.manual_seed(0)
    config = HypeNetConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=len(layer_types),
                           num_attention_heads=4, layer_types=layer_types)
    model = HypeNetForCausalLM(config).eval()
    model.save_pretrained(folder)
    return model


def _load_elsewhere(folder, tmp_path, code: str) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter that has not imported hyla (transformers' module cache in tmp_path)."""
    env = dict(os.environ, HF_MODULES_CACHE=str(tmp_path / "modules"), FOLDER=str(folder))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                          stdin=subprocess.DEVNULL, timeout=300)


def test_the_saved_config_names_its_loader_and_only_the_windows_it_has(tmp_path):
    _save(tmp_path / "plain", ["lightning", "attention"])
    config = json.loads((tmp_path / "plain" / "config.json").read_text())
    assert config["auto_map"]["AutoModelForCausalLM"] == "hypenet_hyla.HypeNetForCausalLM"
    assert "swa_window" not in config
    assert (tmp_path / "plain" / "hypenet_hyla.py").exists()
    _save(tmp_path / "swa", ["swa", "attention"])
    assert json.loads((tmp_path / "swa" / "config.json").read_text())["swa_window"] == 128


def test_a_saved_folder_loads_without_import_hyla_given_trust_remote_code(tmp_path):
    model = _save(tmp_path / "model", ["lightning", "attention"])
    ids = torch.tensor([[1, 2, 3, 4]])
    torch.save(model(ids).logits, tmp_path / "expected.pt")
    code = ("import os, sys, torch\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained(os.environ['FOLDER'], trust_remote_code=True).eval()\n"
            "assert 'hyla' in sys.modules\n"
            "expected = torch.load(os.path.join(os.environ['FOLDER'], '..', 'expected.pt'))\n"
            "print(torch.equal(model(torch.tensor([[1, 2, 3, 4]])).logits, expected))")
    completed = _load_elsewhere(tmp_path / "model", tmp_path, code)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert completed.stdout.strip().splitlines()[-1] == "True"


def test_loading_without_hyla_or_the_flag_says_what_is_needed(tmp_path):
    _save(tmp_path / "model", ["lightning", "attention"])
    load = "import os\nfrom transformers import AutoModelForCausalLM\n"
    no_flag = _load_elsewhere(tmp_path / "model", tmp_path,
                              load + "AutoModelForCausalLM.from_pretrained(os.environ['FOLDER'])")
    assert no_flag.returncode != 0 and "trust_remote_code=True" in no_flag.stderr
    # hyla not installed: the folder's module says so (transformers' own check for missing packages is bypassed).
    no_hyla = _load_elsewhere(tmp_path / "model", tmp_path, "import sys\nsys.modules['hyla'] = None\n" + load +
                              "AutoModelForCausalLM.from_pretrained(os.environ['FOLDER'], trust_remote_code=True)")
    assert no_hyla.returncode != 0
    assert "this is a HypeNet model folder: loading it needs the hyla package" in no_hyla.stderr
    assert "import hyla" in no_hyla.stderr


def test_a_folder_saved_after_a_remote_code_load_still_loads_by_itself(tmp_path):
    _save(tmp_path / "model", ["lightning", "attention"])
    code = ("import os\nfrom transformers import AutoModelForCausalLM\n"
            "model = AutoModelForCausalLM.from_pretrained(os.environ['FOLDER'], trust_remote_code=True)\n"
            "model.save_pretrained(os.environ['FOLDER'] + '-again')")
    completed = _load_elsewhere(tmp_path / "model", tmp_path, code)
    assert completed.returncode == 0, completed.stderr[-2000:]
    module = (tmp_path / "model" / "hypenet_hyla.py").read_text()
    assert (tmp_path / "model-again" / "hypenet_hyla.py").read_text() == module


def test_the_tokenizer_of_a_saved_folder_loads_without_hyla_or_the_flag(tmp_path):
    """AutoTokenizer reads config.json first, through a plain PreTrainedConfig when the model's class cannot be
    loaded, and that checks `layer_types` against transformers' own layer names: hyla's are saved under their own
    key. The layer types still load as they were."""
    from offline_models import teacher_tokenizer

    from hyla.models.configuration import SAVED_LAYER_TYPES_KEY

    _save(tmp_path / "model", ["lightning", "attention", "gla", "attention_rope"])
    teacher_tokenizer().save_pretrained(tmp_path / "model")
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    assert "layer_types" not in config and config[SAVED_LAYER_TYPES_KEY][0] == "lightning"
    code = ("import os, sys\nfrom transformers import AutoTokenizer\n"
            "tokenizer = AutoTokenizer.from_pretrained(os.environ['FOLDER'])\n"
            "assert 'hyla' not in sys.modules\n"
            "print('ids', tokenizer('a b').input_ids)")
    completed = _load_elsewhere(tmp_path / "model", tmp_path, code)
    assert completed.returncode == 0, completed.stderr[-2000:]
    # (transformers prints its question about the folder's code to stdout, with no newline, before declining)
    expected = teacher_tokenizer()("a b").input_ids
    assert completed.stdout.strip().splitlines()[-1].endswith(f"ids {expected}"), completed.stdout[-500:]
    loaded = HypeNetConfig.from_pretrained(tmp_path / "model")
    assert loaded.layer_types == ["lightning", "attention", "gla", "attention_rope"]


def test_after_import_hyla_no_flag_is_needed(tmp_path):
    _save(tmp_path / "model", ["lightning", "attention"])
    code = ("import os, hyla\nfrom transformers import AutoModelForCausalLM\n"
            "print(type(AutoModelForCausalLM.from_pretrained(os.environ['FOLDER'])).__module__)")
    completed = _load_elsewhere(tmp_path / "model", tmp_path, code)
    assert completed.returncode == 0, completed.stderr[-2000:]
    assert completed.stdout.strip().splitlines()[-1] == "hyla.models.modeling"


def _written_the_old_way(config: dict) -> dict:
    """A config.json as hyla wrote it before RoPE attention had one spelling and before the mixer options had their
    prefixes and the inference options left the config."""
    old = {{"attention_logit_scaling_a": "attn_logits_scaling_a", "qkv_bias": "attention_bias",
            "o_bias": "attention_out_bias", "swa_window": "sliding_window"}.get(key, key): value
           for key, value in config.items()}
    old["layer_types"] = ["attention" if kind == "attention_rope" else kind for kind in old.pop("hypenet_layer_types")]
    old.update(attention_rope=True, logit_scaling="per_query", logit_scaling_train_length=None, eme_window=None,
               eme_stride=None)
    return old


def test_a_config_saved_by_an_earlier_version_loads_as_the_same_model(tmp_path):
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    config = HypeNetConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, headwise_ratio="1:1",
                           layer_types=["lightning", "attention_rope", "hh_gla", "swa"], swa_window=5,
                           attention_logit_scaling_a=8.0, qkv_bias=True, o_bias=True, attention_output_gate=True)
    model = HypeNetForCausalLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.normal_(0.0, 0.3)  # biases start at zero: make them count
    model.save_pretrained(tmp_path / "model")
    path = tmp_path / "model" / "config.json"
    new = json.loads(path.read_text())
    path.write_text(json.dumps(_written_the_old_way(new)))
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "model").eval()
    for field in ("layer_types", "attention_logit_scaling_a", "qkv_bias", "o_bias", "swa_window"):
        assert getattr(loaded.config, field) == getattr(config, field), field
    ids = torch.randint(0, 50, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert torch.equal(loaded(ids).logits, model(ids).logits)
    loaded.save_pretrained(tmp_path / "again")
    assert json.loads((tmp_path / "again" / "config.json").read_text()) == new


def test_old_configs_that_no_field_can_carry_now_are_refused_with_what_to_do():
    base = dict(num_hidden_layers=2, num_attention_heads=4, hidden_size=32, attention_rope=False)
    with pytest.raises(ValueError, match=r"pass hyla.InferenceOptions\(eme_window=64\) at inference"):
        HypeNetConfig(**base, layer_types=["gla", "attention"], eme_window=64)
    with pytest.raises(ValueError, match="'attention_rope' layers and attn_logits_scaling_a=8.0"):
        HypeNetConfig(**base, layer_types=["lightning", "attention_rope"], attn_logits_scaling_a=8.0)


def test_the_configs_of_the_shipped_results_still_load():
    from pathlib import Path

    for path in sorted((Path(__file__).resolve().parents[2] / "docs" / "results").rglob("config.json")):
        config = HypeNetConfig.from_json_file(path)
        assert len(config.layer_types) == config.num_hidden_layers, path
