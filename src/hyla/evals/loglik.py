"""Log-likelihood of continuations given contexts, batched, as lm-eval-harness computes it for causal LMs."""

from __future__ import annotations

from typing import Any

import torch
from tqdm.auto import tqdm

from hyla.evals.generation import model_device, pad_token_id


def encode_pair(tokenizer, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """Token ids of context and continuation, split as lm-eval does.

    Trailing spaces of the context move to the continuation, and the continuation's tokens are taken from the
    tokenization of the whole text, so that a word is tokenized as it would be in running text.
    """
    num_spaces = len(context) - len(context.rstrip())
    if num_spaces:
        context, continuation = context[:-num_spaces], context[-num_spaces:] + continuation
    whole = tokenizer(context + continuation, add_special_tokens=False)["input_ids"]
    context_ids = tokenizer(context, add_special_tokens=False)["input_ids"]
    return context_ids, whole[len(context_ids) :]


def _max_length(model) -> int:
    config = getattr(model, "config", None)
    for name in ("max_position_embeddings", "n_positions"):
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 2048


def continuation_scores(
    model: Any,
    tokenizer: Any,
    pairs: list[tuple[str, str]],
    *,
    batch_size: int = 8,
    description: str = "loglik",
    show_progress: bool = True,
) -> list[tuple[float, bool]]:
    """For each (context, continuation): summed log-probability of the continuation, and whether it is greedy."""
    max_length = _max_length(model)
    encoded = [encode_pair(tokenizer, context, continuation) for context, continuation in pairs]
    # Longest first: batches of similar length pad little, and an out-of-memory error shows up at once.
    order = sorted(range(len(encoded)), key=lambda index: -(len(encoded[index][0]) + len(encoded[index][1])))
    results: list[tuple[float, bool]] = [(0.0, False)] * len(encoded)
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    for batch in tqdm(batches, desc=description, disable=not show_progress, leave=False):
        batch_scores = _score_batch(model, [encoded[index] for index in batch], max_length, tokenizer)
        for index, result in zip(batch, batch_scores):
            results[index] = result
    return results


@torch.inference_mode()
def _score_batch(
    model: Any, batch: list[tuple[list[int], list[int]]], max_length: int, tokenizer: Any
) -> list[tuple[float, bool]]:
    # The model reads context + continuation minus its last token, cut from the left to fit its context window.
    inputs = [(context + continuation)[-(max_length + 1) :][:-1] for context, continuation in batch]
    longest = max(len(ids) for ids in inputs)
    input_ids = torch.full((len(inputs), longest), pad_token_id(tokenizer), dtype=torch.long)
    attention_mask = torch.zeros((len(inputs), longest), dtype=torch.long)
    for row, ids in enumerate(inputs):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
    device = model_device(model)
    logits = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)).logits
    scores = []
    for row, ((_, continuation), ids) in enumerate(zip(batch, inputs)):
        start = len(ids) - len(continuation)
        row_logits = logits[row, start : len(ids)].float().log_softmax(dim=-1)
        targets = torch.tensor(continuation, device=row_logits.device)
        log_probability = row_logits.gather(-1, targets[:, None]).sum().item()
        is_greedy = bool((row_logits.argmax(dim=-1) == targets).all())
        scores.append((log_probability, is_greedy))
    return scores
