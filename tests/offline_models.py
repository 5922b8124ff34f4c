"""Tokenizers and teachers built in code for tests: nothing is downloaded."""

from __future__ import annotations

from pathlib import Path


def train_bpe_tokenizer(texts: list[str], *, vocab_size: int, special_tokens: list[str],
                        byte_decoder: bool = True, **named_tokens: str):
    """A byte-level BPE tokenizer (any text encodes) trained on `texts`; the special tokens get ids 0, 1, ...;
    `named_tokens` (eos_token=..., pad_token=...) name some of them for transformers."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    backend = Tokenizer(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if byte_decoder:
        backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special_tokens,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    backend.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=backend, **named_tokens)


TEXT = (
    "The quick brown fox jumps over the lazy dog. A stitch in time saves nine. One of the special magic numbers "
    "is 1234567. def add(a, b):\n    return a + b\n\nclass Point:\n    x: int\n    y: int\n"
)


def teacher_tokenizer():
    """The tokenizer of the tiny conversion teacher (300 tokens, <eos> = 0, <pad> = 1)."""
    return train_bpe_tokenizer([TEXT] * 4, vocab_size=300, special_tokens=["<eos>", "<pad>"],
                               eos_token="<eos>", pad_token="<pad>")


def save_tiny_teacher(folder: Path, *, seed: int = 0, hidden_size: int = 32, family: str = "llama",
                      **config_fields) -> Path:
    """A 4-layer random decoder of `family` (llama, mistral, qwen2, qwen3; GQA 4/2, tied head) with
    `teacher_tokenizer`, saved as an HF folder; `config_fields` are passed to its config."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    tokenizer = teacher_tokenizer()
    torch.manual_seed(seed)
    fields = dict(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=64, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                  tie_word_embeddings=True, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
                  bos_token_id=None)
    if family == "mistral":
        fields["sliding_window"] = None  # MistralConfig's default is a 4096-token window
    config = AutoConfig.for_model(family, **{**fields, **config_fields})
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def tiny_mixed_hypenet(seed: int = 0):
    """A float64 HypeNet of three blocks (Lightning, gated attention with logit scaling, Lightning) in training mode,
    for comparing compiled blocks with eager ones."""
    import torch

    from hyla import HypeNetConfig, HypeNetForCausalLM

    torch.manual_seed(seed)
    config = HypeNetConfig(vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                           layer_types=["lightning", "attention", "lightning"], attention_output_gate=True,
                           attention_logit_scaling_a=5.0)
    return HypeNetForCausalLM(config).double().train()
