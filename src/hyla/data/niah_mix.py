"""A prepared corpus with synthetic RULER-SK1-like retrieval documents and copy lists mixed in
(`hyla data niah-mix`): training data for models that must learn in-context retrieval from scratch.

The output is a `hyla data prepare` corpus folder (same format, so `hyla train --data MIX` reads it) laid out in
blocks of exactly `seq_len` tokens, one block per training sequence of `hyla train --seq-len` (the loader's
sequence i is the window at i * seq_len). A retrieval block starts with one retrieval document (at most seq_len
tokens with its separator) and is filled up with corpus text; a copy block holds copy lists back to back; the
other blocks are corpus text only. So every retrieval document is seen whole, starting at position 0 as the
evaluation prompts do. Corpus text is read in order from the start of the corpus (wrapping around if the mix needs
more than it has). The evaluation's keys and values (the samples `hyla eval niah` builds for the given settings)
are never drawn (`hyla.data.niah_docs`).

Besides the corpus files, the folder holds `retrieval-docs.jsonl` (block, key, value, lines, needle line, tokens of
every retrieval document) and `block-kinds.json` (each block's kind: retrieval, copy or corpus); `save_tokenizer`
also writes the tokenizer as a HF tokenizer folder. Rebuilding with the same settings does nothing; other settings
into an existing folder are an error.
"""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from hyla.data.loader import TokenCorpus
from hyla.data.niah_docs import CopyDocGenerator, RetrievalDocGenerator, evaluation_exclusions
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


@dataclass(frozen=True)
class NiahMixSettings:
    corpus: Path  # a prepared corpus (hyla data prepare)
    out: Path  # the mixed corpus folder to create
    seq_len: int  # training sequence length (hyla train --seq-len)
    num_sequences: int  # training sequences: steps x batch size
    eval_lengths: tuple[int, ...]  # the lengths hyla eval niah will use
    eval_num_samples: int
    eval_num_depths: int
    retrieval_share: float = 0.5  # fraction of sequences that start with a retrieval document
    copy_share: float = 0.0  # fraction of sequences filled with copy documents (a list, then the same list again)
    min_doc_tokens: int | None = None  # smallest retrieval document (None: two haystack lines); largest seq_len - 1
    seed: int = 0
    eval_seed: int = 42
    eval_tokens_to_generate: int = 128
    tokenizer: str | None = None  # tokenizer spec or folder (None: the corpus's); it must be the corpus's
    save_tokenizer: Path | None = None  # also save the tokenizer here (HF folder)


def settings_of(options: NiahMixSettings, corpus: TokenCorpus) -> dict:
    return {
        "corpus": str(corpus.path.resolve()), "corpus_id": corpus.corpus_id, "seq_len": options.seq_len,
        "num_sequences": options.num_sequences, "retrieval_share": options.retrieval_share,
        "copy_share": options.copy_share,
        "min_doc_tokens": options.min_doc_tokens, "seed": options.seed,
        "eval_lengths": [int(x) for x in options.eval_lengths], "eval_num_samples": options.eval_num_samples,
        "eval_num_depths": options.eval_num_depths, "eval_seed": options.eval_seed,
        "eval_tokens_to_generate": options.eval_tokens_to_generate,
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
                {"spec": "synthetic:SK1-like (hyla.data.niah_docs)", "num_documents": len(docs),
                 "num_tokens": mix["retrieval_tokens"]},
                {"spec": "synthetic:copy lists (hyla.data.niah_docs)",
                 "num_documents": mix["num_copy_docs"], "num_tokens": mix["copy_tokens"]},
            ],
            "mix": mix, "provenance": provenance(),
        }
        identity = json.dumps([settings, manifest["tokenizer"], shards], sort_keys=True)
        manifest["corpus_id"] = hashlib.sha256(identity.encode()).hexdigest()[:16]
        write_json(staging / MANIFEST, manifest)
    return manifest


def build_niah_mix(options: NiahMixSettings, log=print) -> dict:
    """Build the mix (or find it built); returns its manifest."""
    from hyla.models.loading import load_tokenizer

    corpus = TokenCorpus(options.corpus)
    settings = settings_of(options, corpus)
    log("niah-mix: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
    out = Path(options.out)
    if (out / MANIFEST).is_file():
        found = json.loads((out / MANIFEST).read_text())
        if found.get("settings") != settings:
            raise ValueError(f"{out} holds a mix built with other settings; delete it or choose another --out")
        log(f"niah-mix: {out} already holds this mix; nothing to do")
        return found
    if not (0 <= options.retrieval_share <= 1 and 0 <= options.copy_share <= 1 - options.retrieval_share):
        raise ValueError(f"need 0 <= retrieval share <= 1 and 0 <= copy share <= 1 - retrieval share, "
                         f"got {options.retrieval_share} and {options.copy_share}")
    started = time.perf_counter()
    spec = options.tokenizer or corpus.manifest["tokenizer"]["spec"]
    tokenizer = load_tokenizer(spec)
    warnings = check_tokenizer(corpus, tokenizer, spec)
    for warning in warnings:
        log(f"niah-mix: WARNING: {warning}")
    if options.save_tokenizer is not None:
        tokenizer.save_pretrained(options.save_tokenizer)
    exclusions = evaluation_exclusions(tokenizer, settings["eval_lengths"], options.eval_num_samples, options.eval_seed,
                                       options.eval_num_depths, options.eval_tokens_to_generate)
    generator = RetrievalDocGenerator(tokenizer, max_tokens=options.seq_len - 1, min_tokens=options.min_doc_tokens,
                                      seed=options.seed, exclusions=exclusions)
    num_docs = round(options.retrieval_share * options.num_sequences)
    docs = generator.draw_tokenized(num_docs)
    num_copy = round(options.copy_share * options.num_sequences)
    kinds = block_kinds(options.num_sequences, num_docs, num_copy, options.seed)
    separator_id = corpus.manifest["separator_token_id"]
    readers = {"corpus": CorpusReader(corpus),
               "copy": CopyReader(CopyDocGenerator(tokenizer, seed=options.seed, exclusions=exclusions), separator_id)}
    stream, document_starts = build_stream(options.num_sequences, options.seq_len, kinds, docs, readers, separator_id)
    mix = mix_summary(stream, kinds, docs, readers, corpus, exclusions, warnings)
    manifest = write_mix(out, settings, corpus, stream, document_starts, kinds, docs, mix)
    natural_tokens = mix["corpus_tokens"]
    log(f"niah-mix: {len(stream):,} tokens, {num_docs} retrieval documents "
          f"({mix['retrieval_share_of_tokens']:.1%} of tokens, {mix['retrieval_doc_tokens']['min']}.."
          f"{mix['retrieval_doc_tokens']['max']} tokens each), {mix['num_copy_docs']} copy documents "
          f"({mix['copy_share_of_tokens']:.1%} of tokens), {natural_tokens:,} corpus tokens "
          f"({mix['corpus_passes']:.2f} passes), {exclusions.num_samples} evaluation samples' keys/values excluded; "
          f"{time.perf_counter() - started:.1f} s -> {out}")
    return manifest
