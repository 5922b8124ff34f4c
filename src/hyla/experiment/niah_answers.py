"""What a model's NIAH answers are, cell by cell: right; needle-shaped (the answer begins with a value of the needle's
kind: a number of 4 or more digits, or 8 hex digits and a hyphen for a UUID); a key (words joined by hyphens, the
shape of RULER's keys: "hard-iridescence.", the question's key named where its value is asked for); a restatement
of the question ("the special magic number for KEY mentioned in the provided text"); an echo of the prompt's first
sentence ("hidden within the following text", RULER's opening line continued); or other text. And how many of the
needle's characters an answer copies before its first wrong one. A miss that is needle-shaped found the needle and
miscopied it; a restatement or an echo never reached it; a key copied the key's words (from the question, or from
the needle's line just before its value) where the value was asked for.

An answer is read after its leading punctuation and spaces (": 8346069", '"8346069'), as RULER's scoring also finds
the needle anywhere in the text.
"""

from __future__ import annotations

import re
from collections import defaultdict
from dataclasses import dataclass, fields

KINDS = ("needle_shaped", "key", "restates", "echo", "other")
_UUID_START = re.compile(r"[0-9a-fA-F]{8}-")
_NUMBER_START = re.compile(r"\d{4,}")
_KEY_START = re.compile(r"[a-z]+(?:-[a-z]+)+(?![a-z-])")  # "hard-iridescence", "x-rated-choosing"
_LEADING = " \t\n:\"'`*-"


def answer_text(prediction: str) -> str:
    return prediction.lstrip(_LEADING)


def answer_kind(prediction: str, expected: str) -> str:
    """One of KINDS for `prediction`, an answer to a prompt whose needle value is `expected`."""
    text = answer_text(prediction)
    shape = _UUID_START if _UUID_START.match(expected) else _NUMBER_START
    if shape.match(text):
        return "needle_shaped"
    lowered = text.lower()
    if lowered.startswith("the special magic") or "mentioned in the provided text" in lowered[:120]:
        return "restates"
    if lowered.startswith("hidden"):
        return "echo"
    if _KEY_START.match(text):
        return "key"
    return "other"


def copied_characters(prediction: str, expected: str) -> int:
    """How many of `expected`'s characters the answer copies, from its start, before the first wrong one."""
    count = 0
    for got, want in zip(answer_text(prediction), expected):
        if got != want:
            break
        count += 1
    return count


@dataclass
class Cell:
    prompts: int = 0
    right: int = 0
    needle_shaped: int = 0
    key: int = 0
    restates: int = 0
    echo: int = 0
    other: int = 0
    copied: int = 0  # characters copied, summed over the prompts

    def add(self, record: dict) -> None:
        expected = record["outputs"][0]
        self.prompts += 1
        self.right += record["score"] >= 1
        kind = answer_kind(record["pred"], expected)
        setattr(self, kind, getattr(self, kind) + 1)
        self.copied += copied_characters(record["pred"], expected)

    def row(self) -> dict:
        values = {item.name: getattr(self, item.name) for item in fields(self)}
        values["mean_copied"] = self.copied / self.prompts if self.prompts else 0.0
        return values


def answer_cells(records: list[dict]) -> dict[tuple[str, int], Cell]:
    """Each (task, length) cell of `records` (a `hyla eval niah` results.json's records), summarised."""
    cells: dict[tuple[str, int], Cell] = defaultdict(Cell)
    for record in records:
        cells[(record["task"], record["length"])].add(record)
    return dict(sorted(cells.items()))


def miss_kinds(records: list[dict]) -> dict[str, dict[str, int]]:
    """The answers RULER's scoring counts wrong, by task over every length: {task: {"misses": n, kind: n, ...}}."""
    by_task: dict[str, dict[str, int]] = {}
    scored = [r for r in records if {"score", "pred", "outputs"} <= r.keys() and r["outputs"]]
    for (task, _), cell in answer_cells([r for r in scored if r["score"] < 1]).items():
        counts = by_task.setdefault(task, {"misses": 0, **dict.fromkeys(KINDS, 0)})
        counts["misses"] += cell.prompts
        for kind in KINDS:
            counts[kind] += getattr(cell, kind)
    return by_task

