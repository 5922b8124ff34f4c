"""Compare the stage-2 (distill) loss curves and throughput of two conversion runs. Usage: compare.py ONE TWO"""

import json
import statistics
import sys
from pathlib import Path


def metrics(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "03-distill" / "metrics.jsonl").read_text().splitlines()]


one, two = (metrics(Path(p)) for p in sys.argv[1:3])
pairs = list(zip(one, two))
rel = [abs(a["loss"] - b["loss"]) / abs(a["loss"]) for a, b in pairs]
# Throughput: median over the steps after the first 5 (kernel compilation and warm-up).
throughput = [statistics.median(r["tok_per_s"] for r in run[5:]) for run in (one, two)]
print(json.dumps({
    "steps": [len(one), len(two)],
    "loss_one_gpu": [r["loss"] for r in one],
    "loss_two_gpus": [r["loss"] for r in two],
    "max_relative_loss_difference": max(rel),
    "mean_relative_loss_difference": sum(rel) / len(rel),
    "median_tokens_per_s": {"one_gpu": throughput[0], "two_gpus": throughput[1]},
    "scaling": throughput[1] / throughput[0],
}, indent=1))
