"""Graded retrieval from `hyla eval niah` records. For numeric needles (SK1, SK2: 7-digit numbers), the first 7-digit
number in each answer against the needle: exact (the harness's string-match score), mean digits right by position
(chance 0.1 for a random 7-digit answer), the share with >= 4 leading digits right (near misses included), and the
share of answers that hold a 7-digit number at all. `summarize.py` adds these to each NIAH cell; run alone, this
prints a markdown table for every `niah-*/results.json` under EVALS:

    python bench/smollm2/niah_digits.py EVALS
"""

from __future__ import annotations

import glob
import json
import re
import sys
from collections import defaultdict

NUMERIC_TASKS = ("SK1", "SK2")


def grade_record(record: dict) -> dict:
    """One record's graded scores (numeric needles only)."""
    needle = record["outputs"][0]
    found = re.search(r"\d{7}", record["pred"].replace(",", ""))
    guess = found.group(0) if found else ""
    leading = next((i for i, (a, b) in enumerate(zip(guess, needle)) if a != b), min(len(guess), len(needle)))
    return {"exact": needle in record["pred"], "digits_right": sum(a == b for a, b in zip(guess, needle)) / 7,
            "leading_4": leading >= 4, "number_answer": bool(guess)}


def grade(records: list[dict]) -> dict[tuple[str, int], dict]:
    """Means of grade_record by (task, length), for the numeric tasks."""
    cells: dict = defaultdict(list)
    for record in records:
        if record["task"] in NUMERIC_TASKS:
            cells[(record["task"], record["length"])].append(grade_record(record))
    return {key: {name: sum(g[name] for g in graded) / len(graded) for name in graded[0]} | {"n": len(graded)}
            for key, graded in cells.items()}


def main() -> int:
    if len(sys.argv) != 2 or not glob.glob(sys.argv[1] + "/niah-*/results.json"):
        print("usage: python bench/smollm2/niah_digits.py EVALS  (a folder holding niah-*/results.json)",
              file=sys.stderr)
        return 2
    print("| model | task | length | n | exact | digits right | >= 4 leading digits | answers with 7 digits |")
    print("|---|---|---|---|---|---|---|---|")
    for path in sorted(glob.glob(sys.argv[1] + "/niah-*/results.json")):
        model = path.split("/")[-2].removeprefix("niah-").rsplit("-", 2)[0]
        for (task, length), g in sorted(grade(json.load(open(path))["records"]).items()):
            print(f"| {model} | {task} | {length} | {g['n']} | {g['exact']:.2f} | {g['digits_right']:.2f} | "
                  f"{g['leading_4']:.2f} | {g['number_answer']:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
