"""How much of a retrieval key's tokens its haystack also holds: RULER's NIAH keys in RULER's essay haystack against
the keys of hyla's recall documents (made-up names, or `-words` keys of the haystack's own words) in theirs. A key
whose tokens are rare in the text around it is found by token identity alone; one whose tokens recur there must be
told apart from them. Sitting M's plan (docs/log/2026-12-04-smollm2-135m-halo-sitting-m.md) quotes it:

    HYLA_TEXT_DIR=~/.cache/hyla/text python scripts/key_token_overlap.py --tokenizer MODEL_DIR

MODEL_DIR: any folder with the SmolLM2 tokenizer.json. The last column, the share of documents whose key is made of
words, gives docs/data.md's share of repeated-passage documents with word keys (`--samples 600 --specs
recall-repeat-lead-words@2000-14000:hotpotqa recall-repeat-lead-dense-words@16000-32000:wordnet`). Needs RULER's data package and wonderwords (the NIAH extras).
"""

from __future__ import annotations

import argparse
import itertools
import random
from collections import Counter
from pathlib import Path

from transformers import PreTrainedTokenizerFast

from hyla.data.recall import parse_recall_spec, recall_documents
from hyla.data.sources import open_source
from hyla.evals.haystack import adjective_noun_lists, essay_word_prefix, load_essay_words


def overlap(tokenizer, key: str, haystack: str) -> tuple[float, float, bool]:
    """The share of the key's tokens that occur in the haystack, their mean count there per 1K haystack tokens, and
    whether the key is made of words (hyphen-joined: RULER's and `-words` keys; made-up names have no hyphen)."""
    key_ids = tokenizer(" " + key, add_special_tokens=False).input_ids
    counts = Counter(tokenizer(haystack, add_special_tokens=False).input_ids)
    total = sum(counts.values())
    return (sum(counts[i] > 0 for i in key_ids) / len(key_ids),
            sum(counts[i] for i in key_ids) / len(key_ids) / total * 1000, "-" in key)


def ruler_rows(tokenizer, samples: int, words: int) -> list[tuple[float, float, bool]]:
    adjectives, nouns = adjective_noun_lists()
    rng = random.Random(0)
    count = len(load_essay_words())
    return [overlap(tokenizer, f"{rng.choice(adjectives)}-{rng.choice(nouns)}",
                    essay_word_prefix(words, rng.randrange(count))) for _ in range(samples)]


def recall_rows(tokenizer, spec: str, samples: int) -> list[tuple[float, float, bool]]:
    recall = parse_recall_spec(spec)
    docs = recall_documents(open_source(recall.inner).documents(), seed=0, min_chars=recall.min_chars,
                            max_chars=recall.max_chars, repeat=recall.repeat, lead=recall.lead, dense=recall.dense,
                            word_keys=recall.word_keys)
    rows = []
    for doc in itertools.islice(docs, samples):
        key = doc.keys[doc.asked]
        body = doc.text.split("\n\nQuestion: ")[0]
        haystack = "\n".join(line for line in body.split("\n") if not any(k in line for k in doc.keys))
        rows.append(overlap(tokenizer, key, haystack))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", type=Path, required=True, help="a folder holding tokenizer.json")
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--specs", nargs="+", default=[
        "recall-lead@2000-14000:linux-doc", "recall-lead-words@2000-14000:linux-doc",
        "recall-lead@2000-14000:hotpotqa", "recall-lead-words@2000-14000:hotpotqa"])
    args = parser.parse_args()
    if not (args.tokenizer / "tokenizer.json").is_file():
        parser.error(f"--tokenizer {args.tokenizer}: no tokenizer.json in it")
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(args.tokenizer / "tokenizer.json"))
    try:  # RULER's data and word lists, and the specs' sources, before any table line
        adjective_noun_lists(), load_essay_words()
        for spec in args.specs:
            open_source(parse_recall_spec(spec).inner)
    except (FileNotFoundError, ValueError) as err:
        parser.error(str(err))
    print("| keys, haystack | samples | key tokens found in the haystack | their count per 1K haystack tokens | "
          "word keys |")
    print("|---|---|---|---|---|")
    for name, rows in [("RULER NIAH adjective-noun keys, essays (~2.5K words)", ruler_rows(tokenizer, args.samples,
                                                                                          2500))] + \
            [(spec, recall_rows(tokenizer, spec, args.samples)) for spec in args.specs]:
        share = sum(r[0] for r in rows) / len(rows)
        rate = sum(r[1] for r in rows) / len(rows)
        words = sum(r[2] for r in rows) / len(rows)
        print(f"| {name} | {len(rows)} | {share:.2f} | {rate:.2f} | {words:.2f} |", flush=True)


if __name__ == "__main__":
    main()
