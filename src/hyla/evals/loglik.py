"""Log-likelihood of continuations given contexts, batched, as lm-eval-harness computes it for causal LMs."""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from hyla.evals.generation import model_device, pad_token_id
from hyla.progress import progress


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
    timing: dict[str, Any] | None = None,
) -> list[tuple[float, bool]]:
    """For each (context, continuation): summed log-probability of the continuation, and whether it is greedy.
    timing: where to add the batches scored and their seconds (`encoded_scores`)."""
    encoded = [encode_pair(tokenizer, context, continuation) for context, continuation in pairs]
    return encoded_scores(model, tokenizer, encoded, batch_size=batch_size, description=description,
                          show_progress=show_progress, timing=timing)


def encoded_scores(
    model: Any,
    tokenizer: Any,
    encoded: list[tuple[list[int], list[int]]],
    *,
    batch_size: int = 8,
    description: str = "loglik",
    show_progress: bool = True,
    timing: dict[str, Any] | None = None,
) -> list[tuple[float, bool]]:
    """`continuation_scores` of pairs already tokenized by `encode_pair` (a caller that scores the same pairs on
    several models tokenizes them once); `tokenizer` gives the padding id. timing: a dict where `batches` and
    `seconds` are added to, and `first_batch_s` set once (where a process's first kernels are compiled or autotuned);
    each batch reads its scores back to the host, so its seconds are the device's too."""
    max_length = _max_length(model)
    # Longest first: batches of similar length pad little, and an out-of-memory error shows up at once.
    order = sorted(range(len(encoded)), key=lambda index: -(len(encoded[index][0]) + len(encoded[index][1])))
    results: list[tuple[float, bool]] = [(0.0, False)] * len(encoded)
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    for batch in progress(batches, desc=description, disable=not show_progress, leave=False):
        started = time.perf_counter()
        batch_scores = _score_batch(model, [encoded[index] for index in batch], max_length, tokenizer)
        if timing is not None:
            seconds = time.perf_counter() - started
            timing.setdefault("first_batch_s", seconds)
            timing["batches"] = timing.get("batches", 0) + 1
            timing["seconds"] = timing.get("seconds", 0.0) + seconds
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
    # Every continuation token of the batch at once: (row, position that predicts it, token id), so that the batch
    # costs one transfer to the host rather than two for each row.
    rows, positions, targets, lengths = [], [], [], []
    for row, ((_, continuation), ids) in enumerate(zip(batch, inputs)):
        input_ids[row, : len(ids)] = torch.tensor(ids)
        attention_mask[row, : len(ids)] = 1
        start = len(ids) - len(continuation)
        rows += [row] * len(continuation)
        positions += range(start, len(ids))
        targets += continuation
        lengths.append(len(continuation))
    device = model_device(model)
    # No cache: scoring reads the logits only. For a HypeNet it is also fla's chunk kernels called as in training
    # (no initial or final state), whose autotuning choices the conversion left in Triton's cache; asking for the
    # final states is another autotuning key, tuned again from scratch in each new evaluation process.
    logits = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), use_cache=False).logits
    if not targets:
        return [(0.0, True)] * len(batch)
    picked = logits[torch.tensor(rows, device=logits.device), torch.tensor(positions, device=logits.device)]
    log_probabilities = picked.float().log_softmax(dim=-1)
    wanted = torch.tensor(targets, device=logits.device)
    token_scores = log_probabilities.gather(-1, wanted[:, None])[:, 0]
    greedy = log_probabilities.argmax(dim=-1) == wanted
    token_scores, greedy = token_scores.tolist(), greedy.tolist()
    scores, offset = [], 0
    for length in lengths:
        scores.append((math.fsum(token_scores[offset : offset + length]), all(greedy[offset : offset + length])))
        offset += length
    return scores
