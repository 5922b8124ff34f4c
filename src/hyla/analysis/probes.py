"""Sequences to analyse: NIAH prompts of the evaluation suite (with the token positions of their needle values),
or windows of a plain text file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from hyla.analysis.heads import Probe


def needle_token_positions(tokenizer: Any, prompt: str, values: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids of `prompt` (special tokens as the tokenizer adds them, as NIAH generation does) and the positions of
    every token that overlaps a character of one of `values` in it.

    Needs a fast tokenizer (character offsets); every value must occur in the prompt.
    """
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("locating needle tokens needs a fast tokenizer (with character offsets)")
    encoded = tokenizer(prompt, return_offsets_mapping=True)
    offsets = torch.tensor(encoded["offset_mapping"]).reshape(-1, 2)
    spans = []
    for value in values:
        start = prompt.find(value)
        if start < 0:
            raise ValueError(f"needle value {value!r} does not occur in the prompt")
        while start >= 0:
            spans.append((start, start + len(value)))
            start = prompt.find(value, start + 1)
    nonempty = offsets[:, 1] > offsets[:, 0]
    overlaps = torch.zeros(len(offsets), dtype=torch.bool)
    for start, end in spans:
        overlaps |= nonempty & (offsets[:, 0] < end) & (offsets[:, 1] > start)
    positions = overlaps.nonzero().flatten()
    if len(positions) == 0:
        raise ValueError("no token of the needle values was found in the tokenized prompt")
    return torch.tensor(encoded["input_ids"]), positions


def niah_probes(
    tokenizer: Any, *, task: str = "SK2", length: int = 2048, num_samples: int = 4, seed: int = 42,
    num_depths: int = 11,
) -> list[Probe]:
    """Prompts of the NIAH evaluation (`hyla.evals.niah_samples.build_samples`, RULER's length definition: prompt +
    128 generation tokens = `length`), each with its needle value token positions; the answer position is the
    prompt's last token."""
    from hyla.evals.niah_samples import build_samples

    samples = build_samples(tokenizer, task, length, num_samples, seed, num_depths=num_depths)
    probes = []
    for sample in samples:
        input_ids, positions = needle_token_positions(tokenizer, sample.input, sample.outputs)
        label = f"{sample.task}/{sample.target_length}/depth{sample.depth_percent}/{sample.index}"
        probes.append(Probe(input_ids, positions, label))
    return probes


def text_probes(tokenizer: Any, path: str | Path, *, length: int, num_samples: int) -> list[Probe]:
    """Up to `num_samples` consecutive windows of `length` tokens of a text file (no needles)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no text file at {path}")
    input_ids = torch.tensor(tokenizer(path.read_text(errors="replace"))["input_ids"])
    num_windows = min(num_samples, len(input_ids) // length)
    if num_windows < 1:
        raise ValueError(f"{path} has {len(input_ids)} tokens, fewer than one window of {length}")
    return [Probe(input_ids[i * length : (i + 1) * length], label=f"{path.name}/{i}") for i in range(num_windows)]
