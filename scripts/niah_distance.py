"""NIAH scores by how far the needle sits from the question (prompt tokens after it) and by its position in the
prompt (tokens before it), pooled over every length of each model's files. NoPE attention has no notion of
distance, and a Lightning layer's slowest head decays by e^(-1/256) a token (g_h = -2^(-8h/H), h = 1..H: a half-life
of ~177 tokens, e^-8 after 2K), so beyond ~2K tokens only the attention layers can carry the needle to the question:
where retrieval falls with distance, the attention layers' inputs differ with it.

    N=docs/results/smollm2-135m/halo-sitting-n/results.tar.xz
    python scripts/niah_distance.py N=$N:evals/niah-main-SK2-long/results.json,$N:evals/niah-main-SK2-short/results.json

Each argument is NAME=PATH[,PATH...]; a path is a `hyla eval niah` results.json or ARCHIVE.tar.xz:MEMBER (as
scripts/niah_paired.py reads them). A needle's position is depth_percent of the prompt's tokens (RULER's placement,
to within a sentence).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from niah_paired import read_records  # noqa: E402

EDGES = (0, 1024, 4096, 8192, 16384, 32768, 131072)


def bin_of(tokens: float) -> str:
    for low, high in zip(EDGES, EDGES[1:]):
        if low <= tokens < high:
            return f"{low // 1024}-{high // 1024}K"
    return f">={EDGES[-1] // 1024}K"


def by_bins(records: list[dict]) -> dict[str, dict[str, list[float]]]:
    """{"distance": {bin: scores}, "position": {bin: scores}} of the records."""
    table = {"distance": {}, "position": {}}
    for record in records:
        tokens = record["num_prompt_tokens"]
        position = record["depth_percent"] / 100 * tokens
        table["position"].setdefault(bin_of(position), []).append(record["score"])
        table["distance"].setdefault(bin_of(tokens - position), []).append(record["score"])
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="NAME=PATH[,PATH...]")
    args = parser.parse_args(argv)
    bins = [bin_of(edge) for edge in EDGES[:-1]]
    for kind in ("distance", "position"):
        print(f"\nscore by the needle's {kind} ({'tokens after it' if kind == 'distance' else 'tokens before it'}); "
              "mean / prompts")
        print("| model | " + " | ".join(bins) + " |")
        print("|---|" + "---|" * len(bins))
        for spec in args.models:
            name, _, paths = spec.partition("=")
            if not paths:
                parser.error(f"{spec!r}: expected NAME=PATH[,PATH...]")
            records = [record for path in paths.split(",") for record in read_records(path)]
            cells = by_bins(records)[kind]
            print(f"| {name} | " + " | ".join(
                f"{sum(cells[b]) / len(cells[b]):.2f} / {len(cells[b])}" if b in cells else "" for b in bins) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
