"""What a model's NIAH answers are, cell by cell (hyla.experiment.niah_answers): right, needle-shaped (begins with a
value of the needle's kind), naming the question's key, restating the question, echoing the prompt's first sentence, other; and the needle's
characters copied before the first wrong one, on average. Sitting M's SK3 rows
(docs/log/2026-12-04-smollm2-135m-halo-sitting-m.md) come from:

    M=docs/results/smollm2-135m/halo-sitting-m/results.tar.xz
    python scripts/niah_answers.py $M:evals/niah-main-SK3-short/results.json $M:evals/niah-main-SK3-long/results.json

A path is a `hyla eval niah` results.json, or ARCHIVE.tar.xz:MEMBER inside a run's results archive (as in
scripts/niah_paired.py); the cells of all the files given are printed together. --misses: only the answers RULER's
scoring counts wrong (the SK2 miss counts of sittings L and M: `--misses` over both spans of niah-d125-SK2).
"""

from __future__ import annotations

import argparse
import tarfile

from niah_paired import read_records

from hyla.experiment.niah_answers import KINDS, answer_cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="results.json files (or ARCHIVE.tar.xz:MEMBER)")
    parser.add_argument("--misses", action="store_true", help="only the answers RULER's scoring counts wrong")
    args = parser.parse_args()
    records = []
    for spec in args.files:
        try:
            records += read_records(spec)
        except (OSError, KeyError, ValueError, tarfile.TarError) as err:
            raise SystemExit(f"error: {spec}: cannot read NIAH records ({err!r})") from None
    if args.misses:
        records = [record for record in records if record["score"] < 1]
    print("task  length  prompts  right  " + "  ".join(KINDS) + "  mean copied")
    for (task, length), cell in answer_cells(records).items():
        row = cell.row()
        print(f"{task:4s}  {length:6d}  {row['prompts']:7d}  {row['right']:5d}  "
              + "  ".join(f"{row[kind]:{len(kind)}d}" for kind in KINDS) + f"  {row['mean_copied']:11.1f}")


if __name__ == "__main__":
    main()
