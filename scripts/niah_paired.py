"""NIAH results of two models on the same prompts compared prompt by prompt: right in each, right only in one, and
the two-sided sign test over the prompts only one got right. Arguments come in pairs, A then B (e.g. the long and
the short jobs' files of each model); --lengths keeps some lengths. Sitting K's paired counts
(docs/log/2026-12-04-smollm2-135m-halo-sitting-k.md) come from:

    K=docs/results/smollm2-135m/halo-sitting-k2/results.tar.xz F=docs/results/smollm2-135m/halo-sitting-f/results.tar.xz
    python scripts/niah_paired.py --lengths 16384,32768,65536 \
        $K:evals/niah-main-SK2-long/results.json $K:evals/niah-branch-SK2-long/results.json \
        $K:evals/niah-main-SK2-short/results.json $K:evals/niah-branch-SK2-short/results.json
    (and with $F:evals/niah-main-SK2-{long,short}/results.json as B: K's main against F)

A path is a `hyla eval niah` results.json, or ARCHIVE.tar.xz:MEMBER inside a run's results archive. The two files
of a pair must hold the same prompts (the same task, length, depth and expected answer, record by record).
"""

from __future__ import annotations

import argparse
import json
import math
import tarfile
from collections import defaultdict


def read_records(spec: str) -> list[dict]:
    if ".tar.xz:" in spec:
        archive, member = spec.split(".tar.xz:", 1)
        with tarfile.open(archive + ".tar.xz") as tar:
            handle = tar.extractfile(member)
            if handle is None:
                raise SystemExit(f"error: {member} is not a file in {archive}.tar.xz")
            return json.load(handle)["records"]
    with open(spec) as handle:
        return json.load(handle)["records"]


def sign_test(only_a: int, only_b: int) -> float:
    """Two-sided exact binomial test of only_a against only_b at p = 1/2."""
    n, k = only_a + only_b, min(only_a, only_b)
    if n == 0:
        return 1.0
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="A B [A B ...]")
    parser.add_argument("--lengths", help="comma-separated lengths to keep (default: all)")
    args = parser.parse_args()
    if len(args.files) % 2:
        raise SystemExit("error: the files come in pairs, A then B")
    keep = {int(n) for n in args.lengths.split(",")} if args.lengths else None
    pairs = []
    for spec_a, spec_b in zip(args.files[::2], args.files[1::2]):
        a, b = read_records(spec_a), read_records(spec_b)
        if len(a) != len(b):
            raise SystemExit(f"error: {len(a)} records against {len(b)}: not the same prompts")
        pairs += zip(a, b)
    counts: dict[int, list[int]] = defaultdict(lambda: [0, 0, 0, 0, 0])
    for x, y in pairs:
        if keep is not None and x["length"] not in keep:
            continue
        if (x["task"], x["length"], x["depth_percent"], x["outputs"]) != (y["task"], y["length"], y["depth_percent"],
                                                                          y["outputs"]):
            raise SystemExit(f"error: the files' prompts differ ({x['task']} at {x['length']}, record {x['index']})")
        right_a, right_b = x["score"] >= 1, y["score"] >= 1
        row = counts[x["length"]]
        row[0] += 1
        row[1] += right_a
        row[2] += right_b
        row[3] += right_a and not right_b
        row[4] += right_b and not right_a
    print("length  prompts  right A  right B  only A  only B")
    for length, (n, ra, rb, oa, ob) in sorted(counts.items()):
        print(f"{length:>6}  {n:>7}  {ra:>7}  {rb:>7}  {oa:>6}  {ob:>6}")
    only_a = sum(row[3] for row in counts.values())
    only_b = sum(row[4] for row in counts.values())
    print(f"all     only A {only_a}, only B {only_b}: two-sided sign test p = {sign_test(only_a, only_b):.4f}")


if __name__ == "__main__":
    main()
