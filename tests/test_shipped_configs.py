"""Every config shipped in configs/ builds a HypeNet model."""

import json
from pathlib import Path

import pytest

from hyla import HypeNetConfig, HypeNetForCausalLM

CONFIGS = sorted((Path(__file__).parents[1] / "configs").glob("*.json"))


def test_configs_are_shipped():
    assert CONFIGS


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_shipped_config_builds_a_model(path):
    values = json.loads(path.read_text())
    config = HypeNetConfig(vocab_size=49152, **values)
    model = HypeNetForCausalLM(config)
    params = sum(p.numel() for p in model.parameters()) / 1e6
    # The names promise the size (with the SmolLM2 vocabulary, tied embeddings): within 10%.
    promised = float(path.stem.rsplit("-", 1)[1].removesuffix("m"))
    assert abs(params - promised) / promised < 0.1, params
