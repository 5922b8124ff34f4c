"""Offline fixtures: a small BPE tokenizer trained in the test session, a tiny random Llama teacher, text files."""

from __future__ import annotations

from pathlib import Path

import pytest
from offline_models import train_bpe_tokenizer

SAMPLE_TEXT = (
    "The quick brown fox jumps over the lazy dog. A stitch in time saves nine. "
    "def add(a, b):\n    return a + b\n\nclass Point:\n    x: int\n    y: int\n"
    "Numbers like 3.14 and 42 appear in text; so do symbols such as {braces} and [brackets]. "
)


def build_tokenizer(vocab_size: int = 400):
    """A byte-level BPE tokenizer (any text encodes) with <eos> = id 0 and <pad> = id 1."""
    return train_bpe_tokenizer([SAMPLE_TEXT] * 4, vocab_size=vocab_size, special_tokens=["<eos>", "<pad>", "<sep>"],
                               eos_token="<eos>", pad_token="<pad>")


@pytest.fixture(scope="session")
def tokenizer_dir(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("tokenizer")
    build_tokenizer().save_pretrained(folder)
    return folder


@pytest.fixture(scope="session")
def tiny_teacher_dir(tmp_path_factory) -> Path:
    """A 2-layer random Llama with the test tokenizer, saved as a HF folder."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = build_tokenizer()
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    folder = tmp_path_factory.mktemp("tiny-teacher")
    LlamaForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


@pytest.fixture
def text_folder(tmp_path) -> Path:
    """Six small documents of varied length in nested folders, plus a file of an unknown suffix."""
    root = tmp_path / "texts"
    (root / "nested").mkdir(parents=True)
    for index in range(6):
        folder = root / "nested" if index % 2 else root
        suffix = (".txt", ".md", ".py")[index % 3]
        (folder / f"doc{index}{suffix}").write_text(f"Document {index}. " + SAMPLE_TEXT * (index + 1))
    (root / "ignored.bin").write_bytes(b"\x00\x01")
    return root
