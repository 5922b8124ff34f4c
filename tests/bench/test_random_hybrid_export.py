"""bench/random_hybrid_export.py: a model folder that hyla's loaders read back as the converted layout, with the
teacher's tokenizer and its special tokens in the config."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_the_export_loads_as_the_converted_layout_with_the_tokenizer(tmp_path, smollm2_tokenizer):
    import torch

    sys.path.insert(0, str(REPO / "bench"))
    import random_hybrid_export

    from hyla.bench.shapes import converted_135m_config
    from hyla.models.loading import load_model

    spec = tmp_path / "tok"
    smollm2_tokenizer.save_pretrained(spec)
    out = random_hybrid_export.export(str(spec), tmp_path / "model", device="cpu", dtype="float32", toy=True)
    loaded = load_model(str(out))
    config = loaded.model.config
    assert config.layer_types == converted_135m_config(toy=True).layer_types
    assert config.vocab_size >= len(smollm2_tokenizer)
    assert config.eos_token_id == smollm2_tokenizer.eos_token_id
    assert loaded.tokenizer.backend_tokenizer.to_str() == smollm2_tokenizer.backend_tokenizer.to_str()
    ids = loaded.tokenizer("The key is", return_tensors="pt").input_ids
    with torch.no_grad():
        logits = loaded.model(ids).logits
    assert logits.shape == (1, ids.shape[1], config.vocab_size) and torch.isfinite(logits).all()


def test_a_tokenizer_that_does_not_resolve_is_one_error_and_writes_nothing(tmp_path):
    import subprocess

    finished = subprocess.run([sys.executable, str(REPO / "bench" / "random_hybrid_export.py"), "--tokenizer",
                               str(tmp_path / "missing"), "--out", str(tmp_path / "model")],
                              capture_output=True, text=True)
    assert finished.returncode != 0
    assert finished.stderr.strip().splitlines()[-1].startswith("error: tokenizer not found")
    assert "Traceback" not in finished.stderr and not (tmp_path / "model").exists()


def test_like_takes_a_conversions_layout_a_and_epsilon(tmp_path, smollm2_tokenizer):
    import json

    import pytest

    sys.path.insert(0, str(REPO / "bench"))
    import random_hybrid_export

    from hyla.models.loading import load_model

    spec = tmp_path / "tok"
    smollm2_tokenizer.save_pretrained(spec)
    # as `hyla convert` saves it: the layer types under hypenet_layer_types
    layout = ["attention", "lightning", "lightning", "attention"]
    like = tmp_path / "config.json"
    like.write_text(json.dumps({"hypenet_layer_types": layout, "attention_logit_scaling_a": 5000,
                                "rms_norm_eps": 1e-6, "hidden_size": 99999}))
    out = random_hybrid_export.export(str(spec), tmp_path / "model", device="cpu", dtype="float32", toy=True,
                                      like=like)
    config = load_model(str(out)).model.config
    assert config.layer_types == layout and config.attention_logit_scaling_a == 5000 and config.rms_norm_eps == 1e-6
    assert config.hidden_size != 99999  # the shape stays the bench's
    like.write_text(json.dumps({"hypenet_layer_types": layout[:3]}))
    with pytest.raises(ValueError, match="has 3 layer types; this shape has 4 layers"):
        random_hybrid_export.export(str(spec), tmp_path / "other", device="cpu", dtype="float32", toy=True, like=like)
