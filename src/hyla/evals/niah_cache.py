"""NIAH prompts kept on disk between evaluations, so that a hybrid's evaluation reads the prompts its teacher's
built instead of building them again (sitting D: ~28 s of each 32K+64K job's 120 s, `hyla eval niah` at 25 samples a
cell, 8 jobs side by side).

A cell's samples are one file, named by the hash of everything they are made from: the task, length, seed, depths
and generation budget; the tokenizer (its backend's full definition); the generator's code (this package's
`niah_samples`, `haystack` and `tokens` modules) and its data (RULER's essays, the key vocabulary). Sample i depends
on its index, not on the count asked for (`build_samples`), so a file of 25 serves a request for 4 (the recipe plan's
per-candidate NIAH reads the evaluations' cells); a request for more builds them all and replaces the file. Only tokenizers
that encode through their plain backend are cached (`hyla.evals.tokens.plain_backend`): their samples carry the
prompts' token ids, given back to the tokenizer that reads them. An unreadable file is built again.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import weakref
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from hyla.evals.niah_samples import NiahSample, build_samples
from hyla.evals.tokens import PromptIds, plain_backend

# Bump when a cached file's layout changes. 2: the samples' fields as UTF-8 bytes, the ids as int32, compressed
# (format 1's 10 SK2 prompts at 64K took 17 MB: the fields as a 4-byte-a-character string, the ids as int64).
_FORMAT = 2


@functools.lru_cache(maxsize=1)
def generator_fingerprint() -> str:
    """The hash of the sample generator's code and data."""
    from hyla.evals import haystack, niah_samples, tokens

    digest = hashlib.sha256(f"format {_FORMAT}".encode())
    for module in (niah_samples, haystack, tokens):
        digest.update(Path(module.__file__).read_bytes())
    digest.update(haystack.load_essay_text().encode())
    for words in haystack.adjective_noun_lists():
        digest.update("\n".join(words).encode())
    return digest.hexdigest()


def tokenizer_fingerprint(tokenizer: Any) -> str | None:
    """The hash of what a tokenizer encodes by (None: not a plain-backend tokenizer, whose samples are not cached)."""
    backend = plain_backend(tokenizer)
    if backend is None:
        return None
    return hashlib.sha256(f"{backend.to_str()}\n{bool(tokenizer.split_special_tokens)}".encode()).hexdigest()


def samples_key(tokenizer_hash: str, task: str, length: int, seed: int, num_depths: int,
                tokens_to_generate: int, haystack_offset: int = 0) -> str:
    fields = {"tokenizer": tokenizer_hash, "generator": generator_fingerprint(), "task": task, "length": length,
              "seed": seed, "num_depths": num_depths, "tokens_to_generate": tokens_to_generate}
    if haystack_offset:  # RULER's prompts (offset 0) are keyed without it
        fields["haystack_offset"] = haystack_offset
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()[:32]


def cached_samples(cache_dir: str | Path | None, tokenizer: Any, task: str, length: int, num_samples: int,
                   seed: int = 42, *, num_depths: int = 11, tokens_to_generate: int = 128,
                   haystack_offset: int = 0) -> list[NiahSample]:
    """`build_samples(...)`, read from `cache_dir` where an earlier evaluation left them (None: no cache), else built
    and left there."""
    tokenizer_hash = tokenizer_fingerprint(tokenizer) if cache_dir is not None else None
    if tokenizer_hash is None:
        return build_samples(tokenizer, task, length, num_samples, seed, num_depths=num_depths,
                             tokens_to_generate=tokens_to_generate, haystack_offset=haystack_offset)
    path = Path(cache_dir) / (f"{task}-{length}-" + samples_key(tokenizer_hash, task, length, seed, num_depths,
                                                                tokens_to_generate, haystack_offset) + ".npz")
    samples = _read(path, tokenizer)
    if samples is not None and len(samples) >= num_samples:
        samples = samples[:num_samples]
    else:
        samples = build_samples(tokenizer, task, length, num_samples, seed, num_depths=num_depths,
                                tokens_to_generate=tokens_to_generate, haystack_offset=haystack_offset)
        if all(sample.prompt_ids is not None for sample in samples):
            _write(path, samples)
    return samples


def _write(path: Path, samples: list[NiahSample]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written beside and renamed: a reader never sees half a file, and two writers of one key leave one.
    partial = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    arrays = {f"ids_{index}": np.asarray(sample.prompt_ids.ids, dtype=np.int32)
              for index, sample in enumerate(samples)}
    meta = np.frombuffer(json.dumps([sample.to_dict() for sample in samples]).encode(), dtype=np.uint8)
    with open(partial, "wb") as handle:
        np.savez_compressed(handle, meta=meta, **arrays)
    os.replace(partial, path)


def _read(path: Path, tokenizer: Any) -> list[NiahSample] | None:
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            fields = json.loads(data["meta"].tobytes().decode())
            ids = [np.asarray(data[f"ids_{index}"], dtype=np.int64) for index in range(len(fields))]
    except (OSError, ValueError, KeyError, UnicodeDecodeError, zipfile.BadZipFile, json.JSONDecodeError):
        return None
    owner = weakref.ref(tokenizer)
    return [NiahSample(**sample, prompt_ids=PromptIds(row, owner)) for sample, row in zip(fields, ids)]
