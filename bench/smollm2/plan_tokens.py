"""Distillation tokens for a time budget, from bench/smollm2/probe.py's measured throughput at the run's shape.

    python bench/smollm2/plan_tokens.py PROBE_JSON SECONDS MAX_TOKENS [DRIVER ARGS ...]

The shape is read from the driver arguments (`--main-set distill.seq_len=N`, `distill.batch_size=B`; the quick
preset's 512 x 32 otherwise); prints the token count, rounded down to whole steps."""

from __future__ import annotations

import json
import sys


def plan(probe: dict, seconds: float, max_tokens: float, driver_args: list[str]) -> int:
    shape = {"seq_len": 512, "batch_size": 32}
    for item in driver_args:
        key, _, value = item.partition("=")
        if key in ("distill.seq_len", "distill.batch_size"):
            shape[key.split(".")[1]] = int(float(value))
    cases = [c for c in probe["cases"] if c["stage"] == "distill" and c["seq_len"] == shape["seq_len"]]
    if not cases:
        raise SystemExit(f"plan_tokens: the probe has no distill case at seq_len {shape['seq_len']}")
    step = shape["seq_len"] * shape["batch_size"]
    tokens = min(max_tokens, cases[0]["tok_per_s"] * seconds)
    return max(1, int(tokens // step)) * step


if __name__ == "__main__":
    probe_path, seconds, max_tokens, *rest = sys.argv[1:]
    print(plan(json.loads(open(probe_path).read()), float(seconds), float(max_tokens), rest))
