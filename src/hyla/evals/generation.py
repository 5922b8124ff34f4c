"""Batched greedy generation with left padding, for any Hugging Face causal LM."""

from __future__ import annotations

from typing import Any

import torch
from tqdm.auto import tqdm

# RULER generates up to 128 tokens; the answers of NIAH and BABILong fit in far fewer, so 32 saves time.
DEFAULT_MAX_NEW_TOKENS = 32


def prepare_tokenizer_for_generation(tokenizer: Any) -> Any:
    """Left padding (the answer starts right after every prompt) and a pad token (eos when the model has none)."""
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        if tokenizer.eos_token is None:
            raise ValueError("the tokenizer has neither a pad token nor an eos token to pad batches with")
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def model_device(model: Any) -> torch.device:
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    parameters = getattr(model, "parameters", None)
    if callable(parameters):
        for parameter in parameters():
            return parameter.device
    return torch.device("cpu")


def generate_greedy(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    *,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    batch_size: int = 1,
    description: str = "generate",
    show_progress: bool = True,
) -> list[str]:
    """Greedy continuations of `prompts` (the new text only, special tokens dropped), in the order given."""
    if batch_size < 1:
        raise ValueError(f"batch size must be at least 1, got {batch_size}")
    prepare_tokenizer_for_generation(tokenizer)
    device = model_device(model)
    # Batching prompts of similar length wastes the least compute on padding.
    order = sorted(range(len(prompts)), key=lambda index: len(prompts[index]))
    completions: list[str] = [""] * len(prompts)
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    for batch in tqdm(batches, desc=description, disable=not show_progress, leave=False):
        texts = _generate_batch(model, tokenizer, [prompts[index] for index in batch], max_new_tokens, device)
        for index, text in zip(batch, texts):
            completions[index] = text
    return completions


@torch.inference_mode()
def _generate_batch(
    model: Any, tokenizer: Any, prompts: list[str], max_new_tokens: int, device: torch.device
) -> list[str]:
    # Special tokens as the model's tokenizer adds them by default (a BOS for Llama-style tokenizers), as RULER does.
    encoded = tokenizer(prompts, return_tensors="pt", padding=True)
    input_ids = encoded["input_ids"].to(device)
    attention_mask = encoded["attention_mask"].to(device)
    output_ids = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        pad_token_id=tokenizer.pad_token_id,
    )
    new_tokens = output_ids[:, input_ids.shape[1] :]
    return tokenizer.batch_decode(new_tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)
