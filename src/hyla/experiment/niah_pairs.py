"""Two models' NIAH answers to the same prompts compared prompt by prompt: how many each got right, how many only
one of them did, and the two-sided sign test over the prompts only one got right (at p = 1/2). With 25 prompts a
cell a difference of 0.1 in accuracy is within one standard error; paired counts over many cells are not.

Prompts are matched by what the model saw and had to answer: task, length, depth, sample index and the expected
answer, so two evaluations from one samples cache (the experiment plans' `--samples-cache`) pair up whatever their
batch order; prompts only one side has are left out and counted.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field, fields


def prompt_key(record: dict) -> tuple:
    return (record["task"], record["length"], record["depth_percent"], record.get("index"), tuple(record["outputs"]))


def sign_test(only_a: int, only_b: int) -> float:
    """Two-sided exact binomial test of only_a against only_b at p = 1/2 (1 when both are 0)."""
    n, k = only_a + only_b, min(only_a, only_b)
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n)


@dataclass
class Counts:
    prompts: int = 0
    right_a: int = 0
    right_b: int = 0
    only_a: int = 0
    only_b: int = 0

    def add(self, right_a: bool, right_b: bool) -> None:
        self.prompts += 1
        self.right_a += right_a
        self.right_b += right_b
        self.only_a += right_a and not right_b
        self.only_b += right_b and not right_a

    @property
    def p(self) -> float:
        return sign_test(self.only_a, self.only_b)


@dataclass
class Pairing:
    by_cell: dict[tuple[str, int], Counts] = field(default_factory=dict)  # (task, length) -> counts
    unmatched: int = 0  # prompts of either side that the other does not have

    def total(self, task: str | None = None, lengths: set[int] | None = None) -> Counts:
        cells = [counts for (cell_task, length), counts in self.by_cell.items()
                 if (task is None or cell_task == task) and (lengths is None or length in lengths)]
        return Counts(*(sum(getattr(c, f.name) for c in cells) for f in fields(Counts)))


def pair_records(records_a: list[dict], records_b: list[dict], names: tuple[str, str] = ("A", "B")) -> Pairing:
    """`hyla eval niah` records of model A and model B matched by `prompt_key` (ValueError naming the side if one
    holds a prompt twice); a record is right when its score is 1."""
    sides = []
    for name, records in zip(names, (records_a, records_b)):
        keyed = {}
        for record in records:
            key = prompt_key(record)
            if key in keyed:
                raise ValueError(f"{name} holds the same prompt twice ({key[0]} at {key[1]}, depth {key[2]}, "
                                 f"sample {key[3]})")
            keyed[key] = record["score"] >= 1
        sides.append(keyed)
    a, b = sides
    cells: dict = defaultdict(Counts)
    for key in sorted(a.keys() & b.keys(), key=str):
        cells[(key[0], key[1])].add(a[key], b[key])
    return Pairing(dict(cells), len(a.keys() ^ b.keys()))
