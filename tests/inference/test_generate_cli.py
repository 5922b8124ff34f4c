"""`hyla generate`: streamed text and the speeds line, on a tiny HypeNet (the engine's CPU fallback) and on a model
hyla does not own (transformers' generate)."""

import pytest
import torch

from hyla import HypeNetConfig, HypeNetForCausalLM
from hyla.bench.generate import synthetic_tokenizer
from hyla.cli import main


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory):
    tokenizer = synthetic_tokenizer(64)
    torch.manual_seed(0)
    config = HypeNetConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                           layer_types=["lightning", "attention"], pad_token_id=0, eos_token_id=1)
    folder = tmp_path_factory.mktemp("tiny-generate")
    HypeNetForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_generate_streams_text_and_reports_tokens_per_second(capsys, tiny_folder, tmp_path):
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("w20 w21 w22 w23")
    assert main(["generate", "--model", str(tiny_folder), "--prompt-file", str(prompt), "--max-new-tokens", "6",
                 "--device", "cpu"]) == 0
    out, err = capsys.readouterr()
    assert "path=engine" in err and "prompt: 4 tokens" in err and "tokens/s" in err
    assert out.strip()  # the streamed continuation
    assert main(["generate", "--model", str(tiny_folder), "--prompt", "w20 w21", "--max-new-tokens", "3",
                 "--device", "cpu", "--generation", "hf", "--sample", "--top-k", "5"]) == 0
    assert "transformers' generate" in capsys.readouterr().err


def test_generate_refuses_a_missing_prompt_file(capsys, tiny_folder, tmp_path):
    assert main(["generate", "--model", str(tiny_folder), "--prompt-file", str(tmp_path / "none.txt")]) == 2
    assert "no prompt file" in capsys.readouterr().err
