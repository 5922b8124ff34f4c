import pytest
import torch

from hyla import HypeNetConfig, HypeNetForCausalLM


def byte_tokenizer():
    """A byte-level tokenizer with no merges (one token per byte), built offline, with character offsets."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    vocab = {"<s>": 0, "</s>": 1, **{symbol: index + 2 for index, symbol in enumerate(alphabet)}}
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>")


def tiny_config(**overrides) -> HypeNetConfig:
    kwargs = dict(vocab_size=258, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, layer_types=["lightning", "lightning", "lightning", "attention"],
                  attention_qk_norm=True, bos_token_id=0, eos_token_id=1)
    kwargs.update(overrides)
    return HypeNetConfig(**kwargs)


@pytest.fixture(scope="session")
def make_tiny_config():
    return tiny_config


@pytest.fixture(scope="session")
def tokenizer():
    return byte_tokenizer()


@pytest.fixture(scope="session")
def tiny_model_folder(tmp_path_factory, tokenizer):
    """A saved 4-layer HypeNet (3 Lightning + 1 GQA attention) with its byte tokenizer."""
    folder = tmp_path_factory.mktemp("tiny-hypenet")
    torch.manual_seed(0)
    HypeNetForCausalLM(tiny_config()).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
