"""NIAH prompts for the hit rate: the needle's value tokens are located exactly."""

import pytest
import torch

from hyla.analysis.heads import measure_probe, sample_query_positions
from hyla.analysis.probes import needle_token_positions, niah_probes, text_probes


def test_needle_positions_cover_exactly_the_value_characters(tokenizer):
    prompt = "Haystack text. One of the special magic numbers for tidy-owl is: 4096123. More text."
    input_ids, positions = needle_token_positions(tokenizer, prompt, ["4096123"])
    assert tokenizer.decode(input_ids[positions]) == "4096123"
    assert positions.tolist() == list(range(prompt.index("4096123"), prompt.index("4096123") + 7))


def test_missing_value_is_one_clear_error(tokenizer):
    with pytest.raises(ValueError, match="does not occur"):
        needle_token_positions(tokenizer, "no needle here", ["1234567"])


def test_niah_probes_locate_every_gold_value(tokenizer):
    probes = niah_probes(tokenizer, task="SK1", length=1024, num_samples=2, num_depths=2)
    for probe in probes:
        text = tokenizer.decode(probe.input_ids[probe.needle_positions])
        assert text.isdigit() and len(text) == 7
        assert probe.length <= 1024 - 128


def test_text_probes_are_consecutive_windows(tokenizer, tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("abcdefghij" * 10)
    probes = text_probes(tokenizer, path, length=30, num_samples=5)
    assert len(probes) == 3 and all(probe.length == 30 for probe in probes)
    assert tokenizer.decode(probes[1].input_ids) == ("abcdefghij" * 3)


def test_sampled_query_positions_span_the_sequence():
    assert sample_query_positions(10, 0).tolist() == list(range(1, 10))
    positions = sample_query_positions(2000, 5)
    assert positions[0] == 1 and positions[-1] == 1999 and len(positions) == 5


def test_measure_probe_gives_entropies_in_range_and_hit_rates(tiny_model_folder, tokenizer):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_folder).eval()
    probe = niah_probes(tokenizer, task="SK1", length=1024, num_samples=1)[0]
    layers = measure_probe(model, probe, num_query_positions=50, block_size=16)
    assert [layer.layer_type for layer in layers] == ["lightning", "lightning", "lightning", "attention"]
    for layer in layers:
        assert layer.entropy.shape == (4, 50)
        assert torch.all((layer.entropy >= 0) & (layer.entropy <= 1 + 1e-6))
        assert layer.hit_rate.shape == (4,) and torch.all((layer.hit_rate >= 0) & (layer.hit_rate <= 1))
