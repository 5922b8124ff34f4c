"""Token lengths of the first documents of text sources (recall specs above all): mean, min, max, how many exceed a
training window, and questions a document. The counts in docs/data.md's `-dense` row come from:

    HYLA_TEXT_DIR=~/.cache/hyla/text python scripts/recall_doc_tokens.py --tokenizer MODEL_DIR \
        recall-lead-dense@32000-56000:hotpotqa recall-lead-dense@28000-50000:wordnet \
        recall-lead-dense@20000-40000:perl-doc recall-repeat-lead-dense@16000-32000:wordnet

MODEL_DIR: any folder with the SmolLM2 tokenizer.json (a converted model's export folder will do).
"""

from __future__ import annotations

import argparse
import itertools
from pathlib import Path

from transformers import PreTrainedTokenizerFast

from hyla.data.sources import open_source


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("specs", nargs="+", help="source specs (hyla data prepare --source)")
    parser.add_argument("--tokenizer", type=Path, required=True, help="a folder holding tokenizer.json")
    parser.add_argument("--documents", type=int, default=200, help="the first N documents of each source")
    parser.add_argument("--window", type=int, default=16384, help="the training window, in tokens")
    args = parser.parse_args()
    if not (args.tokenizer / "tokenizer.json").is_file():
        parser.error(f"--tokenizer {args.tokenizer}: no tokenizer.json in it")
    try:
        sources = [open_source(spec) for spec in args.specs]  # each checked before any is read
    except (ValueError, FileNotFoundError) as err:
        parser.error(str(err))
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(args.tokenizer / "tokenizer.json"))
    for spec, source in zip(args.specs, sources):
        documents = list(itertools.islice(source.documents(), args.documents))
        if not documents:
            parser.error(f"{spec}: no documents")
        lengths = [len(tokenizer(text).input_ids) for text in documents]
        questions = sum(text.count("Question: ") for text in documents) / len(documents)
        over = sum(length > args.window for length in lengths)
        print(f"{spec}: {len(documents)} documents, tokens mean {sum(lengths) / len(lengths):,.0f}, min "
              f"{min(lengths):,}, max {max(lengths):,}, over {args.window:,}: {over}; questions a document "
              f"{questions:.1f}", flush=True)


if __name__ == "__main__":
    main()
