"""Time the host (CPU) work of `hyla eval niah` outside generation, stage by stage, with generation replaced by a
stand-in that returns each prompt plus fixed tokens at once: encoding, the padded tensors, detokenizing the new
tokens, scoring, and the rest of `evaluate_samples` (sorting, the progress bar). Prompts are built before the timed
region, as `hyla bench generate` builds them: the bench's own (synthetic word-level tokenizer, RULER-style needle)
and, with --tokenizer, RULER NIAH prompts of a real tokenizer (`build_samples`); each set twice where hyla keeps
a sample's token ids: without them (encoded when evaluated) and with them. With --engine it also times the per-batch
host work of `GenerationSession.generate` around prefill and decode, on the converted 135M shape on CPU.

    python bench/niah_host.py --length 64K --prompts 8 --batch-size 1 --tokenizer smollm2-135m --task SK2 --engine

Milliseconds a prompt (median of --repeats runs after one untimed run); on a GPU host `to(device)` adds the
host-to-device copies, which the CPU tensors here skip.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict
from contextlib import contextmanager
from dataclasses import replace

import torch

import hyla.evals.generation as generation_module
import hyla.evals.niah as niah
from hyla.bench.generate import synthetic_niah_samples, synthetic_tokenizer
from hyla.evals.cli import _parse_length as parse_length
from hyla.evals.generation import Generation

STAGES = ("encode", "tensors", "generation (stand-in)", "detokenize", "score")


class InstantGeneration(Generation):
    """`Generation.batch` as a stand-in: the prompt followed by `tokens` [new], no model."""

    def __init__(self, tokens: torch.Tensor):
        self.model, self.path, self.reason, self.session = None, "stand-in", "host timing", None
        self.tokens = tokens
        self.totals = defaultdict(float)

    def batch(self, input_ids, attention_mask, *, max_new_tokens, pad_token_id):
        return torch.cat([input_ids, self.tokens[:, :max_new_tokens].expand(input_ids.shape[0], -1)], dim=1)


class CpuModel:
    device = torch.device("cpu")


@contextmanager
def stage_timers(tokenizer, seconds: dict):
    """Wrap each stage's function (in the modules that call it) to add its seconds to `seconds[stage]`."""

    def timed(stage, function):
        def wrapper(*args, **kwargs):
            started = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                seconds[stage] += time.perf_counter() - started
        return wrapper

    patches = [(generation_module, "encode_prompts", "encode"), (generation_module, "left_padded_ids", "tensors"),
               (niah, "_score_samples", "score"), (InstantGeneration, "batch", "generation (stand-in)")]
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in patches]
    for owner, name, stage in patches:
        setattr(owner, name, timed(stage, getattr(owner, name)))
    tokenizer.batch_decode = timed("detokenize", type(tokenizer).batch_decode.__get__(tokenizer))
    try:
        yield
    finally:
        for owner, name, function in saved:
            setattr(owner, name, function)
        del tokenizer.batch_decode


def time_eval(tokenizer, samples, *, batch_size: int, max_new_tokens: int, repeats: int) -> dict[str, float]:
    """Median seconds of each stage and of the whole `evaluate_samples`, over `repeats` runs after one untimed."""
    answer = tokenizer(" 1 2 3 4 5 6 7.", add_special_tokens=False)["input_ids"]
    tokens = torch.tensor((answer * max_new_tokens)[:max_new_tokens])[None]
    runs = []
    for repeat in range(repeats + 1):
        seconds = defaultdict(float)
        with stage_timers(tokenizer, seconds):
            started = time.perf_counter()
            records = niah.evaluate_samples(CpuModel(), tokenizer, samples, batch_size=batch_size,
                                            max_new_tokens=max_new_tokens, generation=InstantGeneration(tokens))
            seconds["all"] = time.perf_counter() - started
        seconds["rest"] = seconds["all"] - sum(seconds[stage] for stage in STAGES)
        if repeat:
            runs.append(seconds)
    assert len(records) == len(samples)
    return {name: statistics.median(run[name] for run in runs) for name in (*STAGES, "rest", "all")}


def time_engine_host(length: int, max_new_tokens: int, repeats: int) -> dict[str, float]:
    """Seconds of the per-batch host work of `GenerationSession.generate` outside prefill and decode, on CPU at
    batch 1: the weights' fingerprint, the engine's reset, the left-padding check, the output's concatenation;
    and the cache's allocation (once per engine)."""
    from hyla.bench import shapes
    from hyla.bench.model import build_hypenet
    from hyla.inference.engine import InferenceEngine, _left_padded_counts
    from hyla.inference.generate import GenerationSession, _buffer_length

    model = build_hypenet(shapes.converted_135m_config(), device=torch.device("cpu"), dtype=torch.bfloat16)
    session = GenerationSession(model)
    mask = torch.ones(1, length - 128, dtype=torch.long)
    ids = torch.zeros_like(mask)
    new = torch.zeros(1, max_new_tokens, dtype=torch.long)
    started = time.perf_counter()
    engine = InferenceEngine(model, batch_size=1, max_length=_buffer_length(length - 128 + max_new_tokens))
    allocate_s = time.perf_counter() - started
    work = {"fingerprint": session._weights_fingerprint, "reset": engine.reset,
            "left-padding check": lambda: _left_padded_counts(mask), "concatenate": lambda: torch.cat([ids, new], 1)}
    timings = {}
    for name, call in work.items():
        call()
        runs = []
        for _ in range(repeats):
            started = time.perf_counter()
            call()
            runs.append(time.perf_counter() - started)
        timings[name] = statistics.median(runs)
    return {**timings, "engine build (once per engine)": allocate_s}


def with_and_without_ids(name: str, tokenizer, samples: list) -> list[tuple]:
    """The samples without token ids (encoded when evaluated), and, where hyla keeps a sample's token ids
    (`NiahSample.prompt_ids`, not on older versions), with the ids `build_samples` keeps (the bench's synthetic
    samples: those `hyla bench generate` gives them)."""
    fields = getattr(samples[0], "__dataclass_fields__", {})
    if "prompt_ids" not in fields:
        return [(name, tokenizer, samples)]
    from hyla.evals.tokens import kept_prompt_ids

    kept = [sample.prompt_ids for sample in samples]
    if any(ids is None for ids in kept):
        kept = kept_prompt_ids(tokenizer, [sample.input for sample in samples])
    encoded = [replace(sample, prompt_ids=None) for sample in samples]
    return [(f"{name}, encoded", tokenizer, encoded),
            (f"{name}, ids kept", tokenizer, [replace(s, prompt_ids=ids) for s, ids in zip(samples, kept)])]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--length", default="64K")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--batch-size", type=int, default=1)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--tokenizer", default=None, help="also a real tokenizer's RULER prompts (e.g. smollm2-135m)")
    parser.add_argument("--task", default="SK2", help="the RULER task of --tokenizer's prompts")
    parser.add_argument("--engine", action="store_true", help="also the engine's per-batch host work on CPU")
    args = parser.parse_args()
    length = parse_length(args.length)
    synthetic = synthetic_tokenizer(49152)
    cases = [("synthetic word-level (the bench's)", synthetic,
              synthetic_niah_samples(49152, length, args.prompts, tokens_to_generate=128, seed=0))]
    if args.tokenizer:
        from hyla.evals.niah_samples import build_samples
        from hyla.models.loading import load_tokenizer

        tokenizer = load_tokenizer(args.tokenizer)
        cases.append((f"{args.tokenizer} {args.task}", tokenizer, build_samples(tokenizer, args.task, length,
                                                                                 args.prompts)))
    cases = [case for name, tokenizer, samples in cases for case in with_and_without_ids(name, tokenizer, samples)]
    print(f"length {args.length}, {args.prompts} prompts, batch {args.batch_size}, {args.max_new_tokens} new tokens, "
          f"torch {torch.__version__} with {torch.get_num_threads()} threads; ms a prompt, median of {args.repeats}")
    print("| prompts | " + " | ".join(STAGES) + " | rest | all |")
    print("|---" * (len(STAGES) + 3) + "|")
    for name, tokenizer, samples in cases:
        seconds = time_eval(tokenizer, samples, batch_size=args.batch_size, max_new_tokens=args.max_new_tokens,
                            repeats=args.repeats)
        cells = [f"{1e3 * seconds[stage] / len(samples):.1f}" for stage in (*STAGES, "rest", "all")]
        print(f"| {name} | " + " | ".join(cells) + " |", flush=True)
    if args.engine:
        print("\nengine host work on CPU, batch 1 (ms a batch):")
        for name, seconds in time_engine_host(length, args.max_new_tokens, args.repeats).items():
            print(f"  {name}: {1e3 * seconds:.2f}")


if __name__ == "__main__":
    main()
