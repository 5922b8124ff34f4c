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
    """For each (context, continuation): summed log-probability of the continuation, and whether it is greedy.

    Continuations that share a context (the choices of one question) reuse one forward pass of that context
    through the model's cache, which halves the work on HellaSwag; models whose cache cannot be repeated along
    the batch take the plain path, one full sequence per row.
    """
    max_length = _max_length(model)
    encoded = [encode_pair(tokenizer, context, continuation) for context, continuation in pairs]
    results: list[tuple[float, bool] | None] = [None] * len(encoded)
    progress = tqdm(total=len(encoded), desc=description, disable=not show_progress, leave=False)
    plain = _score_shared_contexts(model, encoded, results, max_length, progress)
    # Longest first: batches of similar length pad little, and an out-of-memory error shows up at once.
    plain.sort(key=lambda index: -(len(encoded[index][0]) + len(encoded[index][1])))
    for start in range(0, len(plain), batch_size):
        batch = plain[start : start + batch_size]
        for index, result in zip(batch, _score_batch(model, [encoded[i] for i in batch], max_length, tokenizer)):
            results[index] = result
        progress.update(len(batch))
    progress.close()
    return results


def _score_shared_contexts(
    model: Any, encoded: list[tuple[list[int], list[int]]], results: list, max_length: int, progress: Any
) -> list[int]:
    """Score every group of ≥ 2 continuations of one context through a shared cache; returns the indices left."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for index, (context_ids, continuation_ids) in enumerate(encoded):
        if context_ids and len(context_ids) + len(continuation_ids) <= max_length:
            groups.setdefault(tuple(context_ids), []).append(index)
    left = [index for members in groups.values() if len(members) == 1 for index in members]
    grouped = {index for members in groups.values() for index in members}
    left += [index for index in range(len(encoded)) if index not in grouped]
    shared_groups = [members for members in groups.values() if len(members) > 1]
    for number, members in enumerate(shared_groups):
        scores = _score_one_context(model, list(encoded[members[0]][0]), [encoded[i][1] for i in members])
        if scores is None:
            # The model's cache cannot be shared: score everything not yet scored the plain way.
            return left + [index for later in shared_groups[number:] for index in later]
        for index, result in zip(members, scores):
            results[index] = result
        progress.update(len(members))
    return left


@torch.inference_mode()
def _score_one_context(
    model: Any, context_ids: list[int], continuations: list[list[int]]
) -> list[tuple[float, bool]] | None:
    """Scores of several continuations after one context pass; None when the cache cannot be repeated."""
    device = model_device(model)
    outputs = model(input_ids=torch.tensor([context_ids], device=device), use_cache=True)
    cache = outputs.past_key_values
    if not callable(getattr(cache, "batch_repeat_interleave", None)):
        return None
    try:
        cache.batch_repeat_interleave(len(continuations))
    except NotImplementedError:
        return None
    # The context's last position predicts each continuation's first token; the rest are fed right-padded.
    first_log_probs = outputs.logits[0, -1].float().log_softmax(dim=-1)
    rest_log_probs = _continuation_log_probs(model, cache, len(context_ids), continuations, device)
    scores = []
    for row, continuation in enumerate(continuations):
        log_probs = first_log_probs[None]
        if len(continuation) > 1:
            log_probs = torch.cat([log_probs, rest_log_probs[row, : len(continuation) - 1]])
        targets = torch.tensor(continuation, device=log_probs.device)
        log_probability = log_probs.gather(-1, targets[:, None]).sum().item()
        scores.append((log_probability, bool((log_probs.argmax(dim=-1) == targets).all())))
    return scores


def _continuation_log_probs(
    model: Any, cache: Any, context_length: int, continuations: list[list[int]], device: torch.device
) -> torch.Tensor | None:
    """Log-probabilities [N, T-1, V] at each continuation position but the last, after the shared context."""
    inputs = [continuation[:-1] for continuation in continuations]
    longest = max(len(ids) for ids in inputs)
    if longest == 0:
        return None
    input_ids = torch.zeros((len(inputs), longest), dtype=torch.long)
    attention_mask = torch.zeros((len(inputs), context_length + longest), dtype=torch.long)
    attention_mask[:, :context_length] = 1
    for row, ids in enumerate(inputs):
        input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[row, context_length : context_length + len(ids)] = 1
    logits = model(
        input_ids=input_ids.to(device), attention_mask=attention_mask.to(device), past_key_values=cache, use_cache=True
    ).logits
    return logits.float().log_softmax(dim=-1)


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
