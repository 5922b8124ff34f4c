"""Build the family-LH training corpus: a prepared corpus with synthetic RULER-SK1-like retrieval documents and
copy lists mixed in.

    python bench/family_lh/build_mix.py --corpus CORPUS --out MIX --seq-len 1024 --num-sequences 16000 \
        --retrieval-share 0.5 --copy-share 0.25 --eval-lengths 1024,4096,16384 --eval-num-samples 20 \
        --eval-num-depths 5

The output is a `hyla data prepare` corpus folder (same format, so `hyla train --data MIX` reads it) laid out in
blocks of exactly `seq_len` tokens, one block per training sequence of `hyla train --seq-len` (the loader's
sequence i is the window at i * seq_len). A retrieval block starts with one retrieval document (at most seq_len
tokens with its separator) and is filled up with corpus text; a copy block holds copy lists back to back; the
other blocks are corpus text only. So every retrieval document is seen whole, starting at position 0 as the
evaluation prompts do. Corpus text is read in order from the start of CORPUS (wrapping around if the mix needs
more than it has).

Besides the corpus files, MIX holds `retrieval-docs.jsonl` (block, key, value, lines, needle line, tokens of every
retrieval document) and `block-kinds.json` (each block's kind: retrieval, copy or corpus); `--save-tokenizer DIR`
also writes the tokenizer as a HF tokenizer folder.
Rerunning with the same settings does nothing; other settings into an existing MIX are an error.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

import numpy as np

from hyla.data.loader import TokenCorpus
from hyla.data.tokenize import (
    DOCUMENT_STARTS,
    FORMAT,
    FORMAT_VERSION,
    MANIFEST,
    provenance,
    staging_folder,
    tokenizer_identity,
    write_json,
)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from retrieval_docs import CopyDocGenerator, RetrievalDocGenerator, evaluation_exclusions  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", type=Path, required=True, help="prepared corpus (hyla data prepare)")
    parser.add_argument("--out", type=Path, required=True, help="mixed corpus folder to create")
    parser.add_argument("--seq-len", type=int, required=True, help="training sequence length (hyla train --seq-len)")
    parser.add_argument("--num-sequences", type=int, required=True, help="training sequences: steps x batch size")
    parser.add_argument("--retrieval-share", type=float, default=0.5, help="fraction of sequences that start with "
                        "a retrieval document (default 0.5)")
    parser.add_argument("--copy-share", type=float, default=0.0, help="fraction of sequences filled with copy "
                        "documents (a random list, then the same list again; default 0)")
    parser.add_argument("--min-doc-tokens", type=int, default=None,
                        help="smallest retrieval document (default: two haystack lines); the largest is seq_len - 1")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--eval-lengths", required=True, help="lengths hyla eval niah will use, e.g. 1024,16384")
    parser.add_argument("--eval-num-samples", type=int, required=True)
    parser.add_argument("--eval-num-depths", type=int, required=True)
    parser.add_argument("--eval-seed", type=int, default=42)
    parser.add_argument("--eval-tokens-to-generate", type=int, default=128)
    parser.add_argument("--tokenizer", default=None, help="tokenizer spec or folder (default: the corpus's, e.g. "
                        "smollm2-135m); it must be the corpus's tokenizer")
    parser.add_argument("--save-tokenizer", type=Path, default=None, help="also save the tokenizer here (HF folder)")
    return parser.parse_args(argv)


def settings_of(args: argparse.Namespace, corpus: TokenCorpus) -> dict:
    return {
        "corpus": str(corpus.path.resolve()), "corpus_id": corpus.corpus_id, "seq_len": args.seq_len,
        "num_sequences": args.num_sequences, "retrieval_share": args.retrieval_share, "copy_share": args.copy_share,
        "min_doc_tokens": args.min_doc_tokens, "seed": args.seed,
        "eval_lengths": [int(x) for x in args.eval_lengths.split(",")], "eval_num_samples": args.eval_num_samples,
        "eval_num_depths": args.eval_num_depths, "eval_seed": args.eval_seed,
        "eval_tokens_to_generate": args.eval_tokens_to_generate,
    }


def check_tokenizer(corpus: TokenCorpus, tokenizer, spec: str) -> list[str]:
    """Raise if the tokenizer cannot be the corpus's; return warnings for differences that may be harmless."""
    theirs, mine = corpus.manifest["tokenizer"], tokenizer_identity(tokenizer, spec)
    for key in ("vocab_size", "eos_token_id"):
        if theirs[key] != mine[key]:
            raise ValueError(f"{corpus.path} was tokenized with another tokenizer: {key} {theirs[key]} there, "
                             f"{mine[key]} for {spec}")
    if theirs["sha256"] != mine["sha256"]:
        return [f"tokenizer definition hash differs from the corpus's ({theirs['sha256'][:12]} there, "
                f"{mine['sha256'][:12]} here): same size and EOS, e.g. another transformers version"]
    return []


class CorpusReader:
    """Corpus text in order from the start, wrapping around; yields pieces cut at document starts."""

    def __init__(self, corpus: TokenCorpus):
        self.corpus, self.position, self.num_read = corpus, 0, 0

    def take(self, count: int) -> list[tuple[np.ndarray, bool]]:
        """`count` tokens as (tokens, starts_a_document) pieces."""
        pieces = []
        while count > 0:
            stop = min(self.position + count, self.corpus.num_tokens)
            starts = self.corpus.document_starts
            low, high = np.searchsorted(starts, [self.position, stop])
            cuts = [self.position, *starts[low:high].tolist(), stop]
            for begin, end in zip(cuts[:-1], cuts[1:]):
                if end > begin:
                    is_start = bool(np.isin(begin, starts[low:high]))
                    pieces.append((self.corpus.read(begin, end), is_start))
            count -= stop - self.position
            self.num_read += stop - self.position
            self.position = stop % self.corpus.num_tokens
        return pieces


class CopyReader:
    """Copy documents (`CopyDocGenerator`) back to back, each closed by the separator; same pieces as CorpusReader."""

    def __init__(self, generator, separator_id: int):
        self.generator, self.separator_id = generator, separator_id
        self.pending: list[np.ndarray] = []
        self.offset, self.num_read, self.num_documents = 0, 0, 0

    def take(self, count: int) -> list[tuple[np.ndarray, bool]]:
        pieces = []
        while count > 0:
            if not self.pending:
                self.pending = [np.asarray(ids + [self.separator_id], dtype=np.int64)
                                for ids in self.generator.draw_tokenized(256)]
            document = self.pending[0]
            piece = document[self.offset:self.offset + count]
            pieces.append((piece, self.offset == 0))
            self.num_documents += self.offset == 0
            self.offset += len(piece)
            count -= len(piece)
            self.num_read += len(piece)
            if self.offset == len(document):
                self.pending.pop(0)
                self.offset = 0
        return pieces


def build_stream(num_sequences: int, seq_len: int, kinds: np.ndarray, docs: list, readers: dict,
                 separator_id: int) -> tuple[np.ndarray, np.ndarray]:
    """The token stream (num_sequences * seq_len + 1 tokens) and its document starts. Block kinds: "retrieval"
    (one retrieval document, then corpus text), "copy" (copy documents), "corpus"."""
    stream = np.empty(num_sequences * seq_len + 1, dtype=np.int64)
    document_starts: list[int] = []
    position, doc_iter = 0, iter(docs)
    for block, kind in enumerate(kinds):
        after_retrieval_doc = kind == "retrieval"
        if after_retrieval_doc:
            _, ids = next(doc_iter)
            tokens = np.asarray(ids + [separator_id], dtype=np.int64)
            document_starts.append(position)
            stream[position:position + len(tokens)] = tokens
            position += len(tokens)
        room = (block + 1) * seq_len - position + (1 if block == num_sequences - 1 else 0)
        reader = readers["copy" if kind == "copy" else "corpus"]
        for index, (tokens, is_start) in enumerate(reader.take(room)):
            # Text cut from a document continues it, unless a retrieval document came in between.
            if is_start or (index == 0 and after_retrieval_doc):
                document_starts.append(position)
            stream[position:position + len(tokens)] = tokens
            position += len(tokens)
    assert position == len(stream), (position, len(stream))
    return stream, np.asarray(document_starts, dtype=np.int64)


def block_kinds(num_sequences: int, num_retrieval: int, num_copy: int, seed: int) -> np.ndarray:
    """Each block's kind, "retrieval", "copy" or "corpus", at seeded random places."""
    order = np.random.default_rng([seed, 1]).permutation(num_sequences)
    kinds = np.full(num_sequences, "corpus", dtype=object)
    kinds[order[:num_retrieval]] = "retrieval"
    kinds[order[num_retrieval:num_retrieval + num_copy]] = "copy"
    return kinds


def mix_summary(stream: np.ndarray, kinds: np.ndarray, docs: list, readers: dict, corpus: TokenCorpus,
                exclusions, warnings: list[str]) -> dict:
    """What the mix holds, for the manifest and the results: counts and shares of each kind."""
    overlap_keys = exclusions.keys & {doc.key for doc, _ in docs}
    overlap_values = exclusions.values & {doc.value for doc, _ in docs}
    assert not overlap_keys and not overlap_values, "an evaluation needle leaked into training"
    num_tokens = len(stream) - 1
    doc_tokens = np.array([len(ids) + 1 for _, ids in docs] or [0])
    return {
        "layout": "blocks of seq_len tokens, one per training sequence; a retrieval document starts its block",
        "num_retrieval_docs": len(docs),
        "retrieval_share_of_sequences": len(docs) / len(kinds),
        "retrieval_tokens": int(doc_tokens.sum()),
        "retrieval_share_of_tokens": float(doc_tokens.sum() / num_tokens),
        "retrieval_doc_tokens": {"min": int(doc_tokens.min()), "mean": float(doc_tokens.mean()),
                                 "max": int(doc_tokens.max())},
        "num_copy_blocks": int((kinds == "copy").sum()),
        "num_copy_docs": readers["copy"].num_documents,
        "copy_tokens": readers["copy"].num_read,
        "copy_share_of_tokens": readers["copy"].num_read / num_tokens,
        "corpus_tokens": readers["corpus"].num_read,
        "corpus_passes": readers["corpus"].num_read / corpus.num_tokens,
        "exclusions": {"eval_samples": exclusions.num_samples, "eval_keys": len(exclusions.keys),
                       "eval_values": len(exclusions.values), "overlapping_keys": len(overlap_keys),
                       "overlapping_values": len(overlap_values)},
        "warnings": warnings,
    }


def write_mix(out: Path, settings: dict, corpus: TokenCorpus, stream: np.ndarray, document_starts: np.ndarray,
              kinds: np.ndarray, docs: list, mix: dict) -> dict:
    """Write the corpus folder (staged, then renamed into place); returns its manifest."""
    retrieval_blocks = np.flatnonzero(kinds == "retrieval").tolist()
    with staging_folder(out) as staging:
        dtype = np.dtype(corpus.manifest["dtype"])
        (staging / "shard-00000.bin").write_bytes(stream.astype(dtype).tobytes())
        np.save(staging / DOCUMENT_STARTS, document_starts)
        (staging / "block-kinds.json").write_text(json.dumps(kinds.tolist()))
        with open(staging / "retrieval-docs.jsonl", "w") as file:
            for block, (doc, ids) in zip(retrieval_blocks, docs, strict=True):
                file.write(json.dumps({"block": block, "key": doc.key, "value": doc.value, "num_lines": doc.num_lines,
                                       "needle_line": doc.needle_line, "num_tokens": len(ids) + 1}) + "\n")
        shards = [{"file": "shard-00000.bin", "num_tokens": len(stream)}]
        manifest = {
            "format": FORMAT, "version": FORMAT_VERSION, "settings": settings,
            "tokenizer": corpus.manifest["tokenizer"], "separator_token_id": corpus.manifest["separator_token_id"],
            "dtype": dtype.name, "num_tokens": len(stream), "num_documents": len(document_starts),
            "last_document_truncated": True, "shards": shards, "document_starts": DOCUMENT_STARTS,
            "sources": [
                {"spec": f"corpus:{corpus.path}", "corpus_id": corpus.corpus_id, "num_tokens": mix["corpus_tokens"]},
                {"spec": "synthetic:SK1-like (bench/family_lh/retrieval_docs.py)", "num_documents": len(docs),
                 "num_tokens": mix["retrieval_tokens"]},
                {"spec": "synthetic:copy lists (bench/family_lh/retrieval_docs.py)",
                 "num_documents": mix["num_copy_docs"], "num_tokens": mix["copy_tokens"]},
            ],
            "mix": mix, "provenance": provenance(),
        }
        identity = json.dumps([settings, manifest["tokenizer"], shards], sort_keys=True)
        manifest["corpus_id"] = hashlib.sha256(identity.encode()).hexdigest()[:16]
        write_json(staging / MANIFEST, manifest)
    return manifest


def build(args: argparse.Namespace) -> dict:
    from hyla.convert.teacher import load_tokenizer

    corpus = TokenCorpus(args.corpus)
    settings = settings_of(args, corpus)
    print("build_mix: " + ", ".join(f"{k}={v}" for k, v in settings.items()), flush=True)
    if (args.out / MANIFEST).is_file():
        found = json.loads((args.out / MANIFEST).read_text())
        if found.get("settings") != settings:
            raise SystemExit(f"build_mix: {args.out} holds a mix built with other settings; delete it or choose "
                             f"another --out")
        print(f"build_mix: {args.out} already holds this mix; nothing to do", flush=True)
        return found
    if not (0 <= args.retrieval_share <= 1 and 0 <= args.copy_share <= 1 - args.retrieval_share):
        raise SystemExit(f"build_mix: need 0 <= --retrieval-share <= 1 and 0 <= --copy-share <= 1 - retrieval share, "
                         f"got {args.retrieval_share} and {args.copy_share}")
    started = time.perf_counter()
    spec = args.tokenizer or corpus.manifest["tokenizer"]["spec"]
    tokenizer = load_tokenizer(spec)
    warnings = check_tokenizer(corpus, tokenizer, spec)
    for warning in warnings:
        print(f"build_mix: WARNING: {warning}", flush=True)
    if args.save_tokenizer is not None:
        tokenizer.save_pretrained(args.save_tokenizer)
    exclusions = evaluation_exclusions(tokenizer, settings["eval_lengths"], args.eval_num_samples, args.eval_seed,
                                       args.eval_num_depths, args.eval_tokens_to_generate)
    generator = RetrievalDocGenerator(tokenizer, max_tokens=args.seq_len - 1, min_tokens=args.min_doc_tokens,
                                      seed=args.seed, exclusions=exclusions)
    num_docs = round(args.retrieval_share * args.num_sequences)
    docs = generator.draw_tokenized(num_docs)
    kinds = block_kinds(args.num_sequences, num_docs, round(args.copy_share * args.num_sequences), args.seed)
    separator_id = corpus.manifest["separator_token_id"]
    readers = {"corpus": CorpusReader(corpus),
               "copy": CopyReader(CopyDocGenerator(tokenizer, seed=args.seed, exclusions=exclusions), separator_id)}
    stream, document_starts = build_stream(args.num_sequences, args.seq_len, kinds, docs, readers, separator_id)
    mix = mix_summary(stream, kinds, docs, readers, corpus, exclusions, warnings)
    manifest = write_mix(args.out, settings, corpus, stream, document_starts, kinds, docs, mix)
    natural_tokens = mix["corpus_tokens"]
    print(f"build_mix: {len(stream):,} tokens, {num_docs} retrieval documents "
          f"({mix['retrieval_share_of_tokens']:.1%} of tokens, {mix['retrieval_doc_tokens']['min']}.."
          f"{mix['retrieval_doc_tokens']['max']} tokens each), {mix['num_copy_docs']} copy documents "
          f"({mix['copy_share_of_tokens']:.1%} of tokens), {natural_tokens:,} corpus tokens "
          f"({mix['corpus_passes']:.2f} passes), {exclusions.num_samples} evaluation samples' keys/values excluded; "
          f"{time.perf_counter() - started:.1f} s -> {args.out}", flush=True)
    return manifest


def main(argv: list[str] | None = None) -> int:
    build(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
