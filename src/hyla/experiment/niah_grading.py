"""Graded retrieval from `hyla eval niah` records, beside the harness's exact string match.

For numeric needles (SK1, SK2: 7-digit numbers), the first 7-digit number of each answer against the needle: exact
(the harness's score), mean digits right by position (chance 0.1 for a random 7-digit answer), the share with at
least 4 leading digits right (near misses included) and the share of answers that hold a 7-digit number at all. They
tell a model that answers with the wrong number from one that does not answer with a number. `prefix_4`: the answer's
first number of any length begins with the needle's first 4 digits; it counts copies cut short ("175488" for
1754823), which the 7-digit grades miss: a model that reached the needle but did not copy it whole.
"""

from __future__ import annotations

import re
from collections import defaultdict

NUMERIC_TASKS = ("SK1", "SK2")


def grade_record(record: dict) -> dict:
    """One record's graded scores (numeric needles only)."""
    needle = record["outputs"][0]
    found = re.search(r"\d{7}", record["pred"].replace(",", ""))
    guess = found.group(0) if found else ""
    leading = next((i for i, (a, b) in enumerate(zip(guess, needle)) if a != b), min(len(guess), len(needle)))
    first = re.search(r"\d+", record["pred"].replace(",", ""))
    return {"exact": needle in record["pred"], "digits_right": sum(a == b for a, b in zip(guess, needle)) / 7,
            "leading_4": leading >= 4, "number_answer": bool(guess),
            "prefix_4": bool(first) and len(first.group(0)) >= 4 and first.group(0)[:4] == needle[:4]}


def grade(records: list[dict]) -> dict[tuple[str, int], dict]:
    """Means of grade_record by (task, length), for the numeric tasks, with their count `n`."""
    cells: dict = defaultdict(list)
    for record in records:
        if record["task"] in NUMERIC_TASKS:
            cells[(record["task"], record["length"])].append(grade_record(record))
    return {key: {name: sum(g[name] for g in graded) / len(graded) for name in graded[0]} | {"n": len(graded)}
            for key, graded in cells.items()}
