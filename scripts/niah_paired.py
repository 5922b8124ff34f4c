"""NIAH results of two models on the same prompts compared prompt by prompt: right in each, right only in one, and
the two-sided sign test over the prompts only one got right. Arguments come in pairs, A then B (e.g. the long and
the short jobs' files of each model); --lengths keeps some lengths. Sitting K's paired counts
(docs/log/2026-12-04-smollm2-135m-halo-sitting-k.md) come from:

    K=docs/results/smollm2-135m/halo-sitting-k2/results.tar.xz F=docs/results/smollm2-135m/halo-sitting-f/results.tar.xz
    python scripts/niah_paired.py --lengths 16384,32768,65536 \
        $K:evals/niah-main-SK2-long/results.json $K:evals/niah-branch-SK2-long/results.json \
        $K:evals/niah-main-SK2-short/results.json $K:evals/niah-branch-SK2-short/results.json
    (and with $F:evals/niah-main-SK2-{long,short}/results.json as B: K's main against F)

A path is a `hyla eval niah` results.json, or ARCHIVE.tar.xz:MEMBER inside a run's results archive. A's and B's
files must hold the same prompts (task, length, depth, sample index, expected answer: hyla.experiment.niah_pairs,
which `hyla experiment report` also uses for its table against the main model).
"""

from __future__ import annotations

import argparse
import json
import tarfile

from hyla.experiment.niah_pairs import pair_records


def read_result(spec: str) -> dict:
    """A results.json, or ARCHIVE.tar.xz:MEMBER inside a run's results archive."""
    if ".tar.xz:" in spec:
        archive, member = spec.split(".tar.xz:", 1)
        with tarfile.open(archive + ".tar.xz") as tar:
            handle = tar.extractfile(member)
            if handle is None:
                raise SystemExit(f"error: {member} is not a file in {archive}.tar.xz")
            return json.load(handle)
    with open(spec) as handle:
        return json.load(handle)


def read_records(spec: str) -> list[dict]:
    return read_result(spec)["records"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("files", nargs="+", help="A B [A B ...]")
    parser.add_argument("--lengths", help="comma-separated lengths to keep (default: all)")
    args = parser.parse_args()
    if len(args.files) % 2:
        raise SystemExit("error: the files come in pairs, A then B")
    keep = {int(n) for n in args.lengths.split(",")} if args.lengths else None
    a, b = [], []
    for spec_a, spec_b in zip(args.files[::2], args.files[1::2]):
        try:
            a += [r for r in read_records(spec_a) if keep is None or r["length"] in keep]
            b += [r for r in read_records(spec_b) if keep is None or r["length"] in keep]
        except (OSError, KeyError, ValueError, tarfile.TarError) as err:
            raise SystemExit(f"error: {spec_a} / {spec_b}: cannot read NIAH records ({err!r})") from None
    try:
        pairing = pair_records(a, b)
    except ValueError as err:
        raise SystemExit(f"error: {err}") from None
    if pairing.unmatched:
        raise SystemExit(f"error: {pairing.unmatched} prompts are in one side only: not the same prompts")
    lengths = sorted({length for _, length in pairing.by_cell})
    print("length  prompts  right A  right B  only A  only B")
    for length in lengths:
        c = pairing.total(lengths={length})
        print(f"{length:>6}  {c.prompts:>7}  {c.right_a:>7}  {c.right_b:>7}  {c.only_a:>6}  {c.only_b:>6}")
    total = pairing.total(lengths=set(lengths))
    p = f"= {total.p:.4f}" if total.p >= 1e-4 else "< 0.0001"
    print(f"all     only A {total.only_a}, only B {total.only_b}: two-sided sign test p {p}")


if __name__ == "__main__":
    main()
