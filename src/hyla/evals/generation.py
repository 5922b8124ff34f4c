"""Batched greedy generation with left padding, for any Hugging Face causal LM."""

from __future__ import annotations

from typing import Any

import torch
from tqdm.auto import tqdm

# RULER generates up to 128 tokens; the answers of NIAH and BABILong fit in far fewer, so 32 saves time.
DEFAULT_MAX_NEW_TOKENS = 32


def pad_token_id(tokenizer: Any) -> int:
    """The id that fills padding: the pad token, or eos when the tokenizer has none."""
    for token_id in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if token_id is not None:
            return token_id
    raise ValueError("the tokenizer has neither a pad token nor an eos token to pad batches with")


def left_padded_batch(tokenizer: Any, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) [B, T] with every prompt right-aligned, so each answer starts at column T.

    Pads by hand rather than through `tokenizer.padding_side`, because tokenizers may be shared (cached by the
    teacher loader) and must not be mutated.
    """
    encoded = [tokenizer(prompt)["input_ids"] for prompt in prompts]
    longest = max(len(ids) for ids in encoded)
    input_ids = torch.full((len(encoded), longest), pad_token_id(tokenizer), dtype=torch.long)
    attention_mask = torch.zeros((len(encoded), longest), dtype=torch.long)
    for row, ids in enumerate(encoded):
        input_ids[row, longest - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, longest - len(ids) :] = 1
    return input_ids, attention_mask


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
    input_ids, attention_mask = (tensor.to(device) for tensor in left_padded_batch(tokenizer, prompts))
    output_ids = model.generate(
        input_ids=input_ids,
        attention_mask=attention_mask,
        max_new_tokens=max_new_tokens,
        do_sample=False,
        num_beams=1,
        pad_token_id=pad_token_id(tokenizer),
    )
    new_tokens = output_ids[:, input_ids.shape[1] :]
    return tokenizer.batch_decode(new_tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)
