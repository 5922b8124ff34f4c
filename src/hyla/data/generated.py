"""Teacher-generated text: batched sampling from varied built-in prompts (a distillation corpus needing no data).

Each document is a prompt followed by the teacher's continuation. Batch `b` samples under seed `(seed, b)`, so the
same settings give the same documents on the same hardware and software. The teacher samples as its
teacher-equivalent HypeNet (`hyla.models.transfer.to_hypenet(..., attention_rope=True)`: the teacher's weights, RoPE
attention in every layer, the teacher's logits), which generates on hyla's inference engine (`hyla.generate`); a
teacher that does not convert samples through transformers' generate.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# Openings across prose, explanation, dialogue, lists and code, so that sampled text covers the teacher's range.
PROMPTS = (
    "Once upon a time, in a small village by the sea,",
    "The history of the printing press begins",
    "In mathematics, a prime number is",
    "Here is a step-by-step recipe for bread:\n1.",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The main causes of the French Revolution were",
    "Dear Sam,\nThank you for your letter about",
    "Photosynthesis is the process by which",
    "A short guide to writing clear emails:",
    "Q: Why is the sky blue?\nA:",
    "The following is a conversation between a teacher and a student about fractions.\nTeacher:",
    "import numpy as np\n\n# Compute the moving average of a signal\n",
    "Chapter 1\n\nThe train was late again, and",
    "Climate change affects agriculture in several ways.",
    "The rules of chess are simple to learn:",
    "An introduction to the theory of evolution:",
    "Abstract. We study the problem of",
    "Top ten tips for learning a new language:\n1.",
    "The city council met on Tuesday to discuss",
    "SELECT name, COUNT(*) FROM orders",
    "How do vaccines work? In simple terms,",
    "The Roman Empire reached its greatest extent",
    "class Stack:\n    \"\"\"A last-in, first-out collection.\"\"\"\n",
    "Product review: I bought this bicycle last month and",
    "The water cycle describes how water moves",
    "In economics, inflation is defined as",
    "My favourite childhood memory is",
    "To solve the equation 3x + 7 = 22, we",
    "The human heart has four chambers:",
    "Instructions for assembling the bookshelf:",
    "Music theory basics: a major scale",
    "The first computers were built",
)


@dataclass(frozen=True)
class GenerationSettings:
    """How `teacher:SPEC` sources sample text."""

    num_documents: int = 256
    max_new_tokens: int = 256
    temperature: float = 0.8
    top_p: float = 0.95
    batch_size: int = 16
    seed: int = 0
    dtype: str = "float32"
    device: str = "cpu"

    def __post_init__(self) -> None:
        if min(self.num_documents, self.max_new_tokens, self.batch_size) < 1 or self.temperature <= 0:
            raise ValueError("generation needs num_documents, max_new_tokens, batch_size >= 1 and temperature > 0")


def teacher_documents(teacher_spec: str, settings: GenerationSettings, show_progress: bool = True, *,
                      record: dict[str, Any] | None = None) -> Iterator[str]:
    """Sample `settings.num_documents` documents from the teacher, `batch_size` prompts at a time. record: where
    the `generation_path` they are sampled on is written once the teacher is loaded (for the corpus manifest)."""
    from hyla.inference.generate import generation_path, generation_path_record
    from hyla.models.loading import load_teacher
    from hyla.progress import progress

    teacher = load_teacher(teacher_spec, dtype=settings.dtype, device=settings.device)
    model = generating_model(teacher.model)
    if record is not None:
        # the path `hyla.generate` takes in `sample_batch`: "auto" under the model's own options
        record["generation_path"] = generation_path_record(generation_path(model)[0])
    prompts = _prompt_order(settings)
    batches = range(0, settings.num_documents, settings.batch_size)
    for start in progress(batches, desc="teacher text", unit="batch", disable=not show_progress, leave=False):
        batch_prompts = prompts[start:start + settings.batch_size]
        yield from sample_batch(model, teacher.tokenizer, batch_prompts, settings, start)


def generating_model(teacher_model):
    """The teacher-equivalent HypeNet of `teacher_model` (same logits, generates on the engine), or the teacher
    itself when it does not convert (an architecture `to_hypenet` does not take)."""
    import torch

    from hyla.models.transfer import to_hypenet

    try:
        # building the HypeNet draws its (overwritten) initial weights: not from the caller's generator
        with torch.random.fork_rng(devices=[]):
            return to_hypenet(teacher_model, attention_rope=True).eval()
    except (ValueError, KeyError, AttributeError, NotImplementedError):
        return teacher_model


def sample_batch(model, tokenizer, prompts: list[str], settings: GenerationSettings, batch_seed: int) -> list[str]:
    """Continue each prompt by sampling; returns prompt + continuation, special tokens removed."""
    import torch

    input_ids, attention_mask = _left_padded(tokenizer, prompts, model.device)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    import hyla

    # fork_rng keeps the caller's global RNG untouched while generation draws from it.
    with torch.random.fork_rng(devices=[model.device] if model.device.type == "cuda" else []), torch.no_grad():
        torch.manual_seed(settings.seed * 1_000_003 + batch_seed)
        # top_k=50: what transformers' generate applied to these requests by default (its global default)
        output = hyla.generate(
            model, input_ids, attention_mask, do_sample=True, temperature=settings.temperature, top_k=50,
            top_p=settings.top_p, max_new_tokens=settings.max_new_tokens, pad_token_id=pad_id,
            eos_token_id=tokenizer.eos_token_id,
        )
    continuations = tokenizer.batch_decode(output[:, input_ids.shape[1]:], skip_special_tokens=True,
                                           clean_up_tokenization_spaces=False)
    return [prompt + continuation for prompt, continuation in zip(prompts, continuations, strict=True)]


def _prompt_order(settings: GenerationSettings) -> list[str]:
    order = list(PROMPTS) * (settings.num_documents // len(PROMPTS) + 1)
    random.Random(settings.seed).shuffle(order)
    return order[:settings.num_documents]


def _left_padded(tokenizer, prompts: list[str], device):
    # Padding by hand also works for tokenizers without a pad token (EOS stands in; the mask hides it).
    import torch

    encoded = [tokenizer(prompt)["input_ids"] for prompt in prompts]
    length = max(len(ids) for ids in encoded)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    input_ids = torch.full((len(prompts), length), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(prompts), length), dtype=torch.long)
    for row, ids in enumerate(encoded):
        input_ids[row, length - len(ids):] = torch.tensor(ids)
        attention_mask[row, length - len(ids):] = 1
    return input_ids.to(device), attention_mask.to(device)
