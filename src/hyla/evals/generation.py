"""Batched greedy generation with left padding, for any Hugging Face causal LM: on hyla's inference engine for the
HypeNet models it runs (`hyla.generate`), through transformers' `generate` for every other model.

An evaluation makes one `Generation` for its model: the path is chosen once (`--generation auto|engine|hf`), the
engine is kept across the evaluation's batches, and `describe()` is what its result file records."""

from __future__ import annotations

import time
from collections.abc import Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from hyla.evals.tokens import plain_backend
from hyla.progress import progress

# RULER generates up to 128 tokens; the answers of NIAH and BABILong fit in far fewer, so 32 saves time.
DEFAULT_MAX_NEW_TOKENS = 32


def pad_token_id(tokenizer: Any) -> int:
    """The id that fills padding: the pad token, or eos when the tokenizer has none."""
    for token_id in (tokenizer.pad_token_id, tokenizer.eos_token_id):
        if token_id is not None:
            return token_id
    raise ValueError("the tokenizer has neither a pad token nor an eos token to pad batches with")


def encode_prompts(tokenizer: Any, prompts: list[str]) -> list[list[int]]:
    """Token ids of each prompt, special tokens as the tokenizer adds them by default (a BOS for Llama-style
    tokenizers), as RULER does. One batched call, so that a fast tokenizer encodes them in parallel (tokenizers'
    `encode_batch`): one 64K-token prompt takes ~0.2 s of one CPU core, as long as the engine takes to answer it.
    Where calling the tokenizer's Rust backend gives the ids the tokenizer gives (`plain_backend`), the backend
    encodes without character offsets (`encode_batch_fast`), which nothing here reads: about half the time (on CPU,
    8 prompts of 64K tokens, bench/niah_host.py); the tokenizer's warning about prompts longer than its model's
    maximum is then not printed."""
    if not prompts:
        return []
    backend = plain_backend(tokenizer)
    if backend is not None:
        return [encoding.ids for encoding in backend.encode_batch_fast(list(prompts), add_special_tokens=True)]
    return [list(ids) for ids in tokenizer(list(prompts))["input_ids"]]


def left_padded_ids(encoded: Sequence[Sequence[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) [B, T] int64 of token-id rows (lists or arrays), each right-aligned, so each
    answer starts at column T. Built in numpy: a 64K-token row goes in at C speed, where `torch.tensor(list)` and
    torch's fills (which may wake its thread pool) take milliseconds each (bench/niah_host.py)."""
    lengths = np.array([len(ids) for ids in encoded], dtype=np.int64)
    longest = int(lengths.max())
    input_ids = np.full((len(encoded), longest), pad_id, dtype=np.int64)
    for row, ids in enumerate(encoded):
        input_ids[row, longest - len(ids) :] = ids
    attention_mask = (np.arange(longest)[None, :] >= longest - lengths[:, None]).astype(np.int64)
    return torch.from_numpy(input_ids), torch.from_numpy(attention_mask)


def left_padded_batch(tokenizer: Any, prompts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """(input_ids, attention_mask) [B, T] with every prompt right-aligned, so each answer starts at column T.

    Pads by hand rather than through `tokenizer.padding_side`, because tokenizers may be shared (cached by the
    teacher loader) and must not be mutated.
    """
    return left_padded_ids(encode_prompts(tokenizer, prompts), pad_token_id(tokenizer))


def model_device(model: Any) -> torch.device:
    device = getattr(model, "device", None)
    if isinstance(device, torch.device):
        return device
    parameters = getattr(model, "parameters", None)
    if callable(parameters):
        for parameter in parameters():
            return parameter.device
    return torch.device("cpu")


class Generation:
    """How one evaluation generates for `model`: path "auto" (the engine where it runs the model, else
    transformers'), "engine" or "hf"; settings: the engine's (None: the tuned settings of the model's device, with
    their `evaluation` fields, `EngineSettings.for_evaluation`);
    overrides: EngineSettings fields replaced on top of them (the engine path), e.g. decode_step="eager".

    totals: calls (batches), prompt_tokens and new_tokens (summed over rows), new_positions (each batch's generated
    width: the first position comes from the prefill, each later one from a decode step over every row), and the
    seconds of prefill, decode (the engine path) and all of it; and the host work around it (`generate_greedy`):
    seconds encoding prompts, building the padded tensors and copying them to the device, decoding new tokens to
    text. The first batch apart (where compiling, autotuning and graph capture show): its seconds in all
    (first_batch_s) and, on the engine, in prefill and decode (first_prefill_s, first_decode_s); and the engine
    path's seconds building engines and capturing their decode graphs (engine_build_s, graph_capture_s: every
    batch that needed a new engine, for more rows or a longer buffer, and `reserve`'s, which `seconds` includes
    too, apart in reserve_s: before the first batch, outside first_batch_s) and the engines it built
    (engines_built)."""

    def __init__(self, model: Any, path: str = "auto", *, settings=None, **overrides):
        from hyla.inference.generate import generation_path

        self.model = model
        self.path, self.reason = generation_path(model, path)
        self.session = None
        if self.path == "engine":
            from hyla.inference.generate import GenerationSession

            self.session = GenerationSession(model, settings=settings, evaluation=True, **overrides)
        self.totals = {"calls": 0, "prompt_tokens": 0, "new_tokens": 0, "new_positions": 0, "prefill_s": 0.0,
                       "decode_s": 0.0, "seconds": 0.0, "encode_s": 0.0, "tensors_s": 0.0, "detokenize_s": 0.0,
                       "first_batch_s": None}
        if self.session is not None:
            self.totals.update({"engine_build_s": 0.0, "graph_capture_s": 0.0, "reserve_s": 0.0,
                                "first_prefill_s": None, "first_decode_s": None})

    def reserve(self, batch_size: int, positions: int) -> None:
        """On the engine path, an engine for greedy batches of up to `batch_size` rows of up to `positions`
        positions each (prompt and new tokens), built now unless the current one serves them
        (`GenerationSession.reserve`): an evaluation's batches then share one engine and one decode graph. Nothing on
        transformers' path."""
        if self.session is not None:
            built = self.session.reserve(batch_size, positions)
            self.totals["engine_build_s"] += built
            self.totals["reserve_s"] += built
            self.totals["seconds"] += built

    # no_grad rather than inference_mode: the engine's cache, made in the first call, is updated in place by later
    # ones, which inference tensors allow only inside inference mode.
    @torch.no_grad()
    def batch(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *, max_new_tokens: int,
              pad_token_id: int, sampling=None, eos_token_id=None) -> torch.Tensor:
        """Output ids [B, T + new] of one left-padded batch, greedy unless `sampling` (a
        `hyla.inference.generate.Sampling`) says otherwise, stopping at `eos_token_id` (an id or a list; None: the
        model's end-of-sequence token, as transformers' generate does)."""
        from hyla.inference.generate import Sampling, hf_generate

        started = time.perf_counter()
        sampling = sampling or Sampling()
        if eos_token_id is None:
            eos_token_id = getattr(getattr(self.model, "generation_config", None), "eos_token_id", None)
        if self.session is not None:
            output = self.session.generate(input_ids, attention_mask, max_new_tokens=max_new_tokens,
                                           sampling=sampling, eos_token_id=eos_token_id, pad_token_id=pad_token_id)
            stats = self.session.stats
            for name in ("prompt_tokens", "new_tokens", "prefill_s", "decode_s", "engine_build_s", "graph_capture_s"):
                self.totals[name] += getattr(stats, name)
            if self.totals["first_prefill_s"] is None:
                self.totals["first_prefill_s"], self.totals["first_decode_s"] = stats.prefill_s, stats.decode_s
            self._add_call(input_ids, output, started)
        else:
            # hf_generate: transformers' own, which HypeNetForCausalLM.generate hands to the engine on CUDA
            output = hf_generate(self.model, input_ids, attention_mask, max_new_tokens=max_new_tokens,
                                 sampling=sampling, eos_token_id=eos_token_id, pad_token_id=pad_token_id)
            self.record_hf_call(input_ids, attention_mask, output, started)
        return output

    def record_hf_call(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None, output: torch.Tensor,
                       started: float) -> None:
        """Count one batch that transformers' generate made from `input_ids` [B, T] into `output` [B, T + new],
        begun at `started` (time.perf_counter): by `batch`, or by a library that calls generate itself."""
        real = attention_mask.sum() if attention_mask is not None else input_ids.numel()
        self.totals["prompt_tokens"] += int(real)
        self.totals["new_tokens"] += (output.shape[1] - input_ids.shape[1]) * output.shape[0]
        self._add_call(input_ids, output, started)

    def _add_call(self, input_ids: torch.Tensor, output: torch.Tensor, started: float) -> None:
        self.totals["calls"] += 1
        self.totals["new_positions"] += output.shape[1] - input_ids.shape[1]
        seconds = time.perf_counter() - started
        self.totals["seconds"] += seconds
        if self.totals["first_batch_s"] is None:  # where compiling and autotuning show
            self.totals["first_batch_s"] = seconds

    def describe(self) -> dict[str, Any]:
        """The generation path, why, the engine's settings, and the tokens and seconds spent (for results.json)."""
        engine = None
        if self.session is not None and self.session.engine is not None:
            engine = {**self.session.engine.settings.summary(), "notes": self.session.engine.notes}
        built = {} if self.session is None else {"engines_built": self.session.builds}
        return {"path": self.path, "reason": self.reason, "engine": engine, **self.totals, **built,
                "compile": compile_record()}


def compile_record() -> dict[str, Any]:
    """What this process compiled so far, to tell a slow first batch's causes apart: Triton's cache folder in use
    (`hyla.compile.share_triton_cache`), and torch.compile's graphs and inductor's cache hits and misses (none
    when nothing was compiled)."""
    import os
    import sys

    record: dict[str, Any] = {"triton_cache_dir": os.environ.get("TRITON_CACHE_DIR")}
    if "torch._dynamo" in sys.modules:  # not imported: nothing was compiled
        from torch._dynamo.utils import counters

        record["graphs"] = counters["stats"].get("unique_graphs", 0)
        record.update({name: counters["inductor"].get(name, 0)
                       for name in ("fxgraph_cache_hit", "fxgraph_cache_miss", "fxgraph_cache_bypass")})
    return record


def as_generation(model: Any, generation: str | Generation | None) -> Generation:
    """`generation` itself, or a new Generation for the path it names (None: "auto")."""
    return generation if isinstance(generation, Generation) else Generation(model, generation or "auto")


def generate_greedy(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    *,
    max_new_tokens: int = DEFAULT_MAX_NEW_TOKENS,
    batch_size: int = 1,
    description: str = "generate",
    show_progress: bool = True,
    generation: str | Generation | None = None,
    encoded: Sequence[Sequence[int]] | None = None,
) -> list[str]:
    """Greedy continuations of `prompts` (the new text only, special tokens dropped), in the order given.
    generation: a Generation shared across calls, or a path ("auto", "engine", "hf"); encoded: the prompts' token
    ids as `encode_prompts(tokenizer, prompts)` gives them, where the caller has them (None: encoded here)."""
    if batch_size < 1:
        raise ValueError(f"batch size must be at least 1, got {batch_size}")
    if encoded is not None and len(encoded) != len(prompts):
        raise ValueError(f"{len(encoded)} rows of token ids for {len(prompts)} prompts")
    generation = as_generation(model, generation)
    device = model_device(model)
    if encoded is None:
        with _timed(generation.totals, "encode_s"):
            encoded = encode_prompts(tokenizer, prompts)
    # Batching prompts of similar length wastes the least compute on padding.
    order = sorted(range(len(prompts)), key=lambda index: len(encoded[index]))
    if prompts:  # one engine for every batch (a smaller last batch runs with filler rows)
        generation.reserve(min(batch_size, len(prompts)), len(encoded[order[-1]]) + max_new_tokens)
    completions: list[str] = [""] * len(prompts)
    batches = [order[start : start + batch_size] for start in range(0, len(order), batch_size)]
    for batch in progress(batches, desc=description, disable=not show_progress, leave=False):
        texts = _generate_batch(generation, tokenizer, [encoded[index] for index in batch], max_new_tokens, device)
        for index, text in zip(batch, texts):
            completions[index] = text
    return completions


def _generate_batch(
    generation: Generation, tokenizer: Any, encoded: list[Sequence[int]], max_new_tokens: int, device: torch.device
) -> list[str]:
    with _timed(generation.totals, "tensors_s"):
        padded = left_padded_ids(encoded, pad_token_id(tokenizer))
        input_ids, attention_mask = (tensor.to(device) for tensor in padded)
    output_ids = generation.batch(input_ids, attention_mask, max_new_tokens=max_new_tokens,
                                  pad_token_id=pad_token_id(tokenizer))
    with _timed(generation.totals, "detokenize_s"):
        new_tokens = output_ids[:, input_ids.shape[1] :]
        return tokenizer.batch_decode(new_tokens, skip_special_tokens=True, clean_up_tokenization_spaces=False)


@contextmanager
def _timed(totals: dict[str, float], name: str):
    """Add the seconds the block takes to totals[name]."""
    started = time.perf_counter()
    try:
        yield
    finally:
        totals[name] = totals.get(name, 0.0) + time.perf_counter() - started
