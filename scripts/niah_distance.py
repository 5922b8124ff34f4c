"""NIAH scores by how far the needle sits from the question (prompt tokens after it) and by its position in the
prompt (tokens before it), every length of each model's files pooled (`hyla.experiment.niah_distance`, which
`hyla experiment report` also tables for every model of a run).

    N=docs/results/smollm2-135m/halo-sitting-n/results.tar.xz
    python scripts/niah_distance.py N=$N:evals/niah-main-SK2-long/results.json,$N:evals/niah-main-SK2-short/results.json

Each argument is NAME=PATH[,PATH...]; a path is a `hyla eval niah` results.json or ARCHIVE.tar.xz:MEMBER (as
scripts/niah_paired.py reads them). `--grid`: each model's score by length and needle depth instead (RULER's haystack
holds the same text at a position at every length: a failure tied to that text shows at one position across the
lengths' rows, one tied to the distance to the question along a diagonal).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hyla.experiment.niah_distance import BINS, by_distance, by_length_and_depth

sys.path.insert(0, str(Path(__file__).resolve().parent))
from niah_paired import read_records  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="NAME=PATH[,PATH...]")
    parser.add_argument("--grid", action="store_true",
                        help="instead, each model's score by length and depth (a cell a length and depth)")
    args = parser.parse_args(argv)
    models = []
    for spec in args.models:
        name, _, paths = spec.partition("=")
        if not paths:
            parser.error(f"{spec!r}: expected NAME=PATH[,PATH...]")
        models.append((name, [record for path in paths.split(",") for record in read_records(path)]))
    if args.grid:
        for name, records in models:
            for task, cells in by_length_and_depth(records).items():
                print(f"\n{name} {task}: score by length (rows) and the needle's depth % (columns); mean / prompts")
                depths = sorted({depth for _, depth in cells})
                print("| length | " + " | ".join(f"{depth:g}" for depth in depths) + " |")
                print("|---|" + "---|" * len(depths))
                for length in sorted({length for length, _ in cells}):
                    row = [cells.get((length, depth)) for depth in depths]
                    print(f"| {length // 1024}K | " + " | ".join(
                        f"{total / count:.2f} / {count}" if count else "" for total, count in
                        (cell or (0, 0) for cell in row)) + " |")
        return 0
    for measure, what in (("distance", "tokens after it"), ("position", "tokens before it")):
        print(f"\nscore by the needle's {measure} ({what}); mean / prompts")
        print("| model | task | " + " | ".join(BINS) + " |")
        print("|---|---|" + "---|" * len(BINS))
        for name, records in models:
            for task, cells in by_distance(records, measure=measure).items():
                print(f"| {name} | {task} | " + " | ".join(
                    f"{total / count:.2f} / {count}" if count else "" for total, count in cells.values()) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
