"""Time building RULER NIAH prompts (`hyla.evals.niah_samples.build_samples`), the CPU work every NIAH evaluation
does before it generates: seconds and tokenizations per sample, the shipped search (each sample starts from the
previous sample's haystack size) against the search from zero for every sample, on the same prompts.

    python bench/niah_samples.py --tokenizer smollm2-135m --cases SK1:64K,SK2:64K,SK3:32K --samples 8
"""

from __future__ import annotations

import argparse
import time

import hyla.evals.niah_samples as niah_samples
from hyla.evals.cli import _parse_length as parse_length
from hyla.models.loading import load_tokenizer


def timed(build, tokenizer) -> tuple[float, int, list]:
    calls = 0
    counting = niah_samples.prompt_tokens

    def count(*args):
        nonlocal calls
        calls += 1
        return counting(*args)

    niah_samples.prompt_tokens = count
    try:
        started = time.perf_counter()
        samples = build()
        return time.perf_counter() - started, calls, samples
    finally:
        niah_samples.prompt_tokens = counting


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokenizer", default="smollm2-135m", help="tokenizer spec (HF folder, GGUF file, alias)")
    parser.add_argument("--cases", default="SK1:64K,SK2:64K,SK3:32K", help="comma list of TASK:LENGTH")
    parser.add_argument("--samples", type=int, default=8)
    args = parser.parse_args()
    cases = []
    for case in args.cases.split(","):
        try:
            task_name, length_text = case.split(":")
            cases.append((task_name, length_text, parse_length(length_text), niah_samples.get_task(task_name)))
        except ValueError as err:
            parser.error(f"--cases {case!r}: expected TASK:LENGTH with a NIAH task, e.g. SK2:64K ({err})")
    if args.samples < 1:
        parser.error(f"--samples must be at least 1, got {args.samples}")
    tokenizer = load_tokenizer(args.tokenizer)
    print("| task | length | samples | s/sample (from zero) | s/sample (shipped) | tokenizations/sample (from zero) "
          "| tokenizations/sample (shipped) | same prompts |")
    print("|---|---|---|---|---|---|---|---|")
    for task_name, length_text, length, task in cases:
        depths = niah_samples.depth_grid(11)
        zero_s, zero_calls, alone = timed(lambda: [
            niah_samples.build_sample(tokenizer, task, length, depths[i % len(depths)], i, 42,
                                      niah_samples.RULER_TOKENS_TO_GENERATE) for i in range(args.samples)], tokenizer)
        shipped_s, shipped_calls, samples = timed(
            lambda: niah_samples.build_samples(tokenizer, task_name, length, args.samples), tokenizer)
        same = [s.input for s in samples] == [s.input for s in alone]
        n = args.samples
        print(f"| {task_name} | {length_text} | {n} | {zero_s / n:.2f} | {shipped_s / n:.2f} | {zero_calls / n:.1f} "
              f"| {shipped_calls / n:.1f} | {same} |", flush=True)


if __name__ == "__main__":
    main()
