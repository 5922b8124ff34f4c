"""Tokenize text sources into a corpus folder that `hyla.data.loader` memory-maps.

A corpus folder holds:
- `shard-00000.bin`, ...: the token stream, raw little-endian uint16 (vocabulary ≤ 65,536) or uint32; every document
  is followed by the separator token (the tokenizer's EOS unless set), documents are never reordered or padded;
- `document-starts.npy`: int64 offset of each document's first token in the stream;
- `manifest.json`: settings, tokenizer identity, counts, shard list, provenance (command, versions, git SHA).

The folder is built under `OUT.tmp-PID` and renamed into place at the end, so `OUT` either holds a complete corpus
or does not exist. Preparing again with the same settings is a no-op; with other settings it is an error.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hyla.data.generated import GenerationSettings
from hyla.data.sources import Source, interleave, open_source
from hyla.outputs import git_sha, process_alive

FORMAT = "hyla.token-corpus"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
DOCUMENT_STARTS = "document-starts.npy"
# 64 Mi tokens = 128 MiB per uint16 shard: few files for a 1B-token corpus, small enough to copy around.
DEFAULT_SHARD_TOKENS = 1 << 26
# Tokenizer calls take this many documents (or characters) at a time: large enough for the Rust batch path.
_BATCH_DOCUMENTS = 256
_BATCH_CHARACTERS = 4_000_000


@dataclass(frozen=True)
class PrepareSettings:
    """Everything that determines a corpus; two runs with equal settings produce the same folder."""

    tokenizer: str
    sources: tuple[str, ...]
    max_tokens: int | None = None
    text_field: str = "text"
    seed: int = 0
    shuffle_files: bool = True
    separator: str | None = None  # a token of the vocabulary; None: the tokenizer's EOS
    shard_tokens: int = DEFAULT_SHARD_TOKENS
    generation: GenerationSettings = field(default_factory=GenerationSettings)
    weights: tuple[float, ...] | None = None  # one per source: shares of the text; None: a document from each in turn

    def __post_init__(self) -> None:
        if not self.sources:
            raise ValueError("no --source given")
        if self.max_tokens is not None and self.max_tokens < 1:
            raise ValueError(f"--max-tokens must be positive, got {self.max_tokens}")
        if self.shard_tokens < 1:
            raise ValueError(f"--shard-tokens must be positive, got {self.shard_tokens}")
        if self.weights is not None:
            if len(self.weights) != len(self.sources):
                raise ValueError(f"--weights gives {len(self.weights)} numbers for {len(self.sources)} sources; "
                                 f"give one per --source, in order")
            if not all(math.isfinite(weight) and weight > 0 for weight in self.weights):
                raise ValueError(f"--weights must be positive numbers, got {list(self.weights)}")

    def to_dict(self) -> dict[str, Any]:
        settings = asdict(self)
        settings["sources"] = list(self.sources)
        # Generation settings matter only to teacher sources; leaving them out otherwise keeps reruns no-ops.
        if not any(source.startswith("teacher:") for source in self.sources):
            del settings["generation"]
        if self.weights is None:  # corpora made before weights existed stay reruns, not conflicts
            del settings["weights"]
        else:
            settings["weights"] = list(self.weights)
        return settings


@dataclass
class PreparedCorpus:
    path: Path
    manifest: dict[str, Any]
    already_prepared: bool  # True when the folder held this corpus already and nothing was done


def prepare_corpus(out_dir: str | Path, settings: PrepareSettings, *, show_progress: bool = True,
                   log: Callable[[str], None] = lambda line: None) -> PreparedCorpus:
    """Tokenize `settings.sources` into `out_dir` (see the module docstring for the layout)."""
    from hyla.models.loading import load_tokenizer

    out_dir = Path(out_dir).expanduser()
    existing = read_existing_manifest(out_dir, settings)
    if existing is not None:
        return PreparedCorpus(out_dir, existing, already_prepared=True)
    sources = [open_source(spec, text_field=settings.text_field, seed=settings.seed,
                           shuffle_files=settings.shuffle_files, generation=settings.generation)
               for spec in settings.sources]
    for source in sources:
        log(f"source {source.spec}: {source.description}")
    tokenizer = load_tokenizer(settings.tokenizer)
    separator_id = separator_token_id(tokenizer, settings.separator)
    dtype = token_dtype(len(tokenizer))
    log(f"tokenizer {settings.tokenizer}: {len(tokenizer)} tokens -> {np.dtype(dtype).name}; separator "
        f"{tokenizer.convert_ids_to_tokens(separator_id)!r} (id {separator_id})")
    with staging_folder(out_dir) as staging:
        writer = ShardWriter(staging, dtype, settings.shard_tokens)
        counts = write_documents(writer, interleave(sources, settings.weights), tokenizer, separator_id,
                                 settings.max_tokens, num_sources=len(sources), show_progress=show_progress)
        if writer.num_tokens == 0:
            raise ValueError(f"empty corpus: the sources yielded no text ({', '.join(settings.sources)})")
        manifest = build_manifest(settings, sources, tokenizer, separator_id, writer, counts)
        write_json(staging / MANIFEST, manifest)
    return PreparedCorpus(out_dir, manifest, already_prepared=False)


class ShardWriter:
    """Appends tokens to `shard-NNNNN.bin` files of at most `shard_tokens` tokens; records document starts."""

    def __init__(self, folder: Path, dtype: type, shard_tokens: int):
        self.folder, self.dtype, self.shard_tokens = folder, dtype, shard_tokens
        self.shards: list[dict[str, Any]] = []
        self.document_starts: list[int] = []
        self.num_tokens = 0
        self._file = None

    def write_document(self, tokens: np.ndarray) -> None:
        self.document_starts.append(self.num_tokens)
        while len(tokens):
            if self._file is None or self.shards[-1]["num_tokens"] == self.shard_tokens:
                self._open_next_shard()
            room = self.shard_tokens - self.shards[-1]["num_tokens"]
            chunk, tokens = tokens[:room], tokens[room:]
            self._file.write(chunk.astype(self.dtype, copy=False).tobytes())
            self.shards[-1]["num_tokens"] += len(chunk)
            self.num_tokens += len(chunk)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
        np.save(self.folder / DOCUMENT_STARTS, np.asarray(self.document_starts, dtype=np.int64))

    def _open_next_shard(self) -> None:
        if self._file is not None:
            self._file.close()
        name = f"shard-{len(self.shards):05d}.bin"
        self._file = open(self.folder / name, "wb")
        self.shards.append({"file": name, "num_tokens": 0})


def write_documents(writer: ShardWriter, documents: Iterator[tuple[int, str]], tokenizer, separator_id: int,
                    max_tokens: int | None, *, num_sources: int, show_progress: bool) -> dict[str, Any]:
    """Tokenize and write documents, stopping at `max_tokens` (the last document is cut there)."""
    from hyla.progress import progress

    per_source = [{"num_documents": 0, "num_tokens": 0} for _ in range(num_sources)]
    budget = max_tokens if max_tokens is not None else float("inf")
    truncated = False
    bar = progress(total=max_tokens, unit="tok", unit_scale=True, desc="tokenizing", disable=not show_progress)
    try:
        for source_index, tokens in _tokenized(documents, tokenizer, separator_id, writer.dtype):
            room = int(min(budget - writer.num_tokens, len(tokens)))
            truncated = room < len(tokens)
            writer.write_document(tokens[:room])
            per_source[source_index]["num_documents"] += 1
            per_source[source_index]["num_tokens"] += room
            bar.update(room)
            if writer.num_tokens >= budget:
                break
    finally:
        bar.close()
        writer.close()
    return {"per_source": per_source, "last_document_truncated": truncated}


def _tokenized(documents: Iterator[tuple[int, str]], tokenizer, separator_id: int,
               dtype: type) -> Iterator[tuple[int, np.ndarray]]:
    # Batched calls let the Rust tokenizer use every core; the separator closes each document.
    for batch in _batches(documents):
        token_lists = tokenizer([text for _, text in batch], add_special_tokens=False, verbose=False)["input_ids"]
        for (source_index, _), ids in zip(batch, token_lists, strict=True):
            yield source_index, np.asarray(ids + [separator_id], dtype=dtype)


def build_manifest(settings: PrepareSettings, sources: list[Source], tokenizer, separator_id: int,
                   writer: ShardWriter, counts: dict[str, Any]) -> dict[str, Any]:
    manifest = {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "settings": settings.to_dict(),
        "tokenizer": tokenizer_identity(tokenizer, settings.tokenizer),
        "separator_token_id": separator_id,
        "dtype": np.dtype(writer.dtype).name,
        "num_tokens": writer.num_tokens,
        "num_documents": len(writer.document_starts),
        "last_document_truncated": counts["last_document_truncated"],
        "shards": writer.shards,
        "document_starts": DOCUMENT_STARTS,
        "sources": [dict(spec=source.spec, description=source.description, **source.record, **count)
                    for source, count in zip(sources, counts["per_source"], strict=True)],
        "provenance": provenance(),
    }
    identity = json.dumps([manifest["settings"], manifest["tokenizer"], writer.shards], sort_keys=True)
    manifest["corpus_id"] = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return manifest


def read_existing_manifest(out_dir: Path, settings: PrepareSettings) -> dict[str, Any] | None:
    """The manifest of a complete corpus prepared with `settings` in `out_dir`; None if `out_dir` is free."""
    if not out_dir.exists():
        return None
    if not out_dir.is_dir():
        raise ValueError(f"{out_dir} exists and is not a folder; choose another --out")
    if not (out_dir / MANIFEST).is_file():
        if any(out_dir.iterdir()):
            raise ValueError(f"{out_dir} exists and is not a prepared corpus; choose another --out")
        return None
    manifest = json.loads((out_dir / MANIFEST).read_text())
    if manifest.get("format") != FORMAT:
        raise ValueError(f"{out_dir} holds something other than a hyla corpus; choose another --out")
    wanted, found = settings.to_dict(), manifest.get("settings", {})
    differences = [f"{key} {found.get(key)!r} there, {value!r} now" for key, value in wanted.items()
                   if found.get(key) != value]
    if differences:
        raise ValueError(f"{out_dir} holds a corpus prepared with other settings ({'; '.join(differences)}); "
                         f"choose another --out or delete it")
    check_shards(out_dir, manifest)
    return manifest


def check_shards(folder: Path, manifest: dict[str, Any]) -> None:
    """Raise if a shard is missing or has another size than the manifest says (a folder damaged after the fact)."""
    itemsize = np.dtype(manifest["dtype"]).itemsize
    for shard in manifest["shards"]:
        path = folder / shard["file"]
        if not path.is_file() or path.stat().st_size != shard["num_tokens"] * itemsize:
            raise ValueError(f"{folder} is damaged: {shard['file']} is missing or has the wrong size; delete it")


@contextlib.contextmanager
def staging_folder(out_dir: Path) -> Iterator[Path]:
    """A fresh `OUT.tmp-PID` folder, renamed to `out_dir` on success and removed on any error or interrupt."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(out_dir)
    staging = out_dir.with_name(f"{out_dir.name}.tmp-{os.getpid()}")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        yield staging
        try:
            os.rename(staging, out_dir)
        except OSError:
            raise ValueError(f"{out_dir} was filled by another run meanwhile; run again to use or check it") from None
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def remove_stale_staging(out_dir: Path) -> None:
    """Remove staging folders left by killed runs (their process is gone)."""
    for staging in out_dir.parent.glob(f"{out_dir.name}.tmp-*"):
        pid = staging.name.rsplit("-", 1)[-1]
        if pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(staging, ignore_errors=True)


def separator_token_id(tokenizer, separator: str | None) -> int:
    if separator is None:
        if tokenizer.eos_token_id is None:
            raise ValueError("the tokenizer has no EOS token; pass --separator TOKEN")
        return int(tokenizer.eos_token_id)
    if separator not in tokenizer.get_vocab():
        raise ValueError(f"separator {separator!r} is not a token of the tokenizer")
    return int(tokenizer.convert_tokens_to_ids(separator))


def token_dtype(vocab_size: int) -> type:
    """uint16 holds ids 0..65535, so any vocabulary of at most 2**16 tokens; larger ones take uint32."""
    return np.uint16 if vocab_size <= 1 << 16 else np.uint32


def tokenizer_identity(tokenizer, spec: str) -> dict[str, Any]:
    """Spec, size, special ids and a hash of the full tokenizer definition (vocabulary, merges, normalizers)."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    definition = backend.to_str() if backend is not None else json.dumps(sorted(tokenizer.get_vocab().items()))
    return {
        "spec": spec,
        "class": type(tokenizer).__name__,
        "vocab_size": len(tokenizer),
        "eos_token_id": tokenizer.eos_token_id,
        "bos_token_id": tokenizer.bos_token_id,
        "sha256": hashlib.sha256(definition.encode()).hexdigest(),
    }


def provenance() -> dict[str, Any]:
    import transformers

    import hyla

    return {
        "command": sys.argv,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        # The package's own version: also right when hyla runs from a source tree without being installed.
        "hyla": hyla.__version__,
        "git_sha": git_sha(),
        "python": sys.version.split()[0],
        "numpy": np.__version__,
        "transformers": transformers.__version__,
    }


def write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def _batches(documents: Iterable[tuple[int, str]]) -> Iterator[list[tuple[int, str]]]:
    batch, num_characters = [], 0
    for document in documents:
        batch.append(document)
        num_characters += len(document[1])
        if len(batch) >= _BATCH_DOCUMENTS or num_characters >= _BATCH_CHARACTERS:
            yield batch
            batch, num_characters = [], 0
    if batch:
        yield batch
