"""Distillation tokens for a time budget, from bench/smollm2/probe.py's measured throughput at the run's shape.

    python bench/smollm2/plan_tokens.py PROBE_JSON SECONDS MAX_TOKENS [DRIVER ARGS ...]

The shape is the driver's main conversion's (its GPU preset and settings, then the `--main-set` items among the
driver arguments); prints the token count, rounded down to whole steps."""

from __future__ import annotations

import json
import sys

from driver import GPU

from hyla.convert.presets import apply_overrides, make_plan


def plan(probe: dict, seconds: float, max_tokens: float, driver_args: list[str]) -> int:
    main_sets = [value for flag, value in zip(driver_args, driver_args[1:]) if flag == "--main-set"]
    distill = apply_overrides(make_plan(GPU.preset, 0), GPU.main + main_sets).distill
    # The rate of the run's own variant: compiled (`--main-set distill.compile=true`), with activation checkpointing
    # (`distill.checkpoint_activations=true`), or neither.
    cases = [c for c in probe["cases"] if c["stage"] == "distill" and c["seq_len"] == distill.seq_len
             and "error" not in c and bool(c.get("compiled", False)) == bool(distill.compile)
             and bool(c.get("checkpointed", False)) == distill.checkpoint_activations]
    if not cases:
        variant = (" compiled" if distill.compile else "") + (" checkpointed" if distill.checkpoint_activations else "")
        raise SystemExit(f"plan_tokens: the probe has no{variant} distill case at seq_len {distill.seq_len}")
    # The run's own batch size where the probe measured it (a larger step can be faster per token).
    cases = [c for c in cases if c["batch"] == distill.batch_size] or cases
    step = distill.seq_len * distill.batch_size
    tokens = min(max_tokens, cases[0]["tok_per_s"] * seconds)
    return max(1, int(tokens // step)) * step


if __name__ == "__main__":
    probe_path, seconds, max_tokens, *rest = sys.argv[1:]
    print(plan(json.loads(open(probe_path).read()), float(seconds), float(max_tokens), rest))
