"""NIAH scores by how far the needle sits from the question (prompt tokens after it) and by its position in the
prompt (tokens before it), every length of each model's files pooled (`hyla.experiment.niah_distance`, which
`hyla experiment report` also tables for every model of a run).

    N=docs/results/smollm2-135m/halo-sitting-n/results.tar.xz
    python scripts/niah_distance.py N=$N:evals/niah-main-SK2-long/results.json,$N:evals/niah-main-SK2-short/results.json

Each argument is NAME=PATH[,PATH...]; a path is a `hyla eval niah` results.json or ARCHIVE.tar.xz:MEMBER (as
scripts/niah_paired.py reads them).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hyla.experiment.niah_distance import BINS, by_distance

sys.path.insert(0, str(Path(__file__).resolve().parent))
from niah_paired import read_records  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="NAME=PATH[,PATH...]")
    args = parser.parse_args(argv)
    models = []
    for spec in args.models:
        name, _, paths = spec.partition("=")
        if not paths:
            parser.error(f"{spec!r}: expected NAME=PATH[,PATH...]")
        models.append((name, [record for path in paths.split(",") for record in read_records(path)]))
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
