"""Text sources: each yields documents (strings) from one source spec.

Source specs (`hyla data prepare --source`):
- a file, a folder (searched recursively) or a glob: `.txt .md .rst .py` files are one document each (a glob or an
  explicitly named file may have any other text suffix); `.jsonl`, `.jsonl.gz` and `.parquet` files give one document
  per record, taken from the `text_field`;
- `stdlib`: the `.py` files of the running Python's standard library (~31 MB, PSF license): the offline default;
- `hf:NAME[:CONFIG][:SPLIT]`: a Hugging Face dataset, streamed (needs the `datasets` package and internet);
- `teacher:SPEC`: text sampled from a teacher (see `hyla.data.generated`);
- `recall:SPEC` or `recall@MIN-MAX:SPEC`: synthetic recall documents (key-value facts and a question about one of
  them) built on the text of the source SPEC (see `hyla.data.recall`); `recall-repeat:...` the same with a haystack of
  one short passage repeated; `recall-long:...` and `recall-repeat-long:...` with values that are long codes;
  `recall-lead:...` (and `recall-repeat-lead`, `recall[-repeat]-lead-long`) with a lead line and answers found only
  by the key;
- an offline text by name, `NAME` or `NAME:PATH` (`hotpotqa`, `aa-lcr`, `perl-doc`, `wordnet`, ...; see
  `hyla.data.offline`); a local folder of one of these names needs a path form (`./hotpotqa`);
- `docs@A-B:SPEC`: documents A to B − 1 (counted from 0) of the source SPEC, e.g. to hold some out.

File lists are sorted, then shuffled with the seed (unless `shuffle_files` is off) so that a token budget takes a
sample spread over the whole source rather than its alphabetical head.
"""

from __future__ import annotations

import glob
import gzip
import itertools
import json
import random
import re
import sysconfig
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hyla.data.generated import GenerationSettings

TEXT_SUFFIXES = (".txt", ".md", ".rst", ".py")
RECORD_SUFFIXES = (".jsonl", ".jsonl.gz", ".parquet")
SOURCE_FORMS = ("a file, folder or glob, 'stdlib', 'hf:NAME[:CONFIG][:SPLIT]', 'teacher:SPEC', 'recall:SPEC', "
                "'recall-repeat:SPEC', 'recall[-repeat][-lead]-long:SPEC', 'recall[-repeat]-lead:SPEC', "
                "'recall[-repeat][-lead][-long]-dense:SPEC', 'recall[...]-words:SPEC', 'docs@A-B:SPEC' or an "
                "offline text name (hotpotqa, aa-lcr, perl-doc, wordnet, ...)")
_DOCS_SPEC = re.compile(r"docs@(\d+)-(\d+):(.+)", re.DOTALL)
# recall, recall-repeat, recall-lead, recall-long, ... (hyla.data.recall); a misspelt variant (recall-again:) gets
# the recall parser's error naming the forms rather than "source not found"
_RECALL_PREFIX = re.compile(r"recall(-[a-z]+)*[@:]")


@dataclass
class Source:
    """One opened source: `documents()` yields its texts; `description` says what it resolved to; `record`: what
    `documents()` found out while yielding, for the corpus manifest's entry (a teacher's `generation_path`)."""

    spec: str
    description: str
    documents: Callable[[], Iterator[str]] = field(repr=False)
    record: dict[str, Any] = field(default_factory=dict)


def open_source(spec: str, *, text_field: str = "text", seed: int = 0, shuffle_files: bool = True,
                generation: GenerationSettings | None = None) -> Source:
    """Resolve a source spec, checking that it exists now (before any tokenizer or model is loaded)."""
    if spec == "stdlib":
        files = _ordered(stdlib_files(), seed, shuffle_files)
        return Source(spec, f"Python {sysconfig.get_python_version()} standard library ({len(files)} files)",
                      lambda: _file_documents(files, text_field))
    if spec.startswith("hf:"):
        return _open_hf_dataset(spec, text_field)
    if _RECALL_PREFIX.match(spec):
        from hyla.data.recall import DENSE_CHARS_PER_FACT, LONG_VALUE_CHARS, parse_recall_spec, recall_documents

        recall = parse_recall_spec(spec)
        inner = open_source(recall.inner, text_field=text_field, seed=seed, shuffle_files=shuffle_files,
                            generation=generation)
        haystack = "of one repeated passage" if recall.repeat else "of haystack"
        low, high = LONG_VALUE_CHARS
        values = f", values of {low}-{high} characters" if recall.long_values else ""
        values += ", a lead line, answers found by the key" if recall.lead else ""
        values += f", a fact every {DENSE_CHARS_PER_FACT} characters, each asked" if recall.dense else ""
        values += ", keys of the haystack's words" if recall.word_keys else ""
        return Source(spec, f"recall documents ({recall.min_chars}-{recall.max_chars} characters {haystack}{values}) "
                      f"on {inner.description}",
                      lambda: (doc.text for doc in recall_documents(inner.documents(), seed=seed,
                                                                    min_chars=recall.min_chars,
                                                                    max_chars=recall.max_chars,
                                                                    repeat=recall.repeat,
                                                                    long_values=recall.long_values,
                                                                    lead=recall.lead, dense=recall.dense,
                                                                    word_keys=recall.word_keys)),
                      record=inner.record)
    if spec.startswith("docs@"):
        return _open_document_range(spec, text_field=text_field, seed=seed, shuffle_files=shuffle_files,
                                    generation=generation)
    from hyla.data.offline import offline_documents, split_offline_spec

    if split_offline_spec(spec) is not None:
        description, documents = offline_documents(spec)
        return Source(spec, description, documents)
    if spec.startswith("teacher:"):
        from hyla.data.generated import teacher_documents
        from hyla.models.loading import load_teacher_config

        settings = generation or GenerationSettings()
        teacher_spec = spec.removeprefix("teacher:")
        if not teacher_spec:
            raise ValueError("source teacher: needs a teacher spec, e.g. teacher:smollm2-135m")
        load_teacher_config(teacher_spec)
        record: dict[str, Any] = {}
        return Source(spec, f"{settings.num_documents} documents sampled from teacher {teacher_spec}",
                      lambda: teacher_documents(teacher_spec, settings, record=record), record=record)
    files = _ordered(expand_paths(spec), seed, shuffle_files)
    return Source(spec, f"{len(files)} files from {spec}", lambda: _file_documents(files, text_field))


def _open_document_range(spec: str, **options) -> Source:
    match = _DOCS_SPEC.fullmatch(spec)
    if match is None or not int(match.group(1)) < int(match.group(2)):
        raise ValueError(f"source {spec}: expected docs@A-B:SPEC with A < B (documents A to B - 1 of SPEC)")
    start, stop, inner_spec = int(match.group(1)), int(match.group(2)), match.group(3)
    inner = open_source(inner_spec, **options)
    return Source(spec, f"documents {start}-{stop - 1} of {inner.description}",
                  lambda: itertools.islice(inner.documents(), start, stop), record=inner.record)


def expand_paths(spec: str) -> list[Path]:
    """The files a path spec names: the file itself, a folder's text/record files, or a glob's matches."""
    path = Path(spec).expanduser()
    if any(char in spec for char in "*?["):
        files = sorted(Path(match) for match in glob.glob(str(path), recursive=True) if Path(match).is_file())
        if not files:
            raise FileNotFoundError(f"source glob {spec} matches no files")
        return files
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(item for item in path.rglob("*") if item.is_file() and _is_known_suffix(item))
        if not files:
            suffixes = " ".join(TEXT_SUFFIXES + RECORD_SUFFIXES)
            raise ValueError(f"source folder {spec} holds no {suffixes} files")
        return files
    raise FileNotFoundError(f"source not found: {spec} (expected {SOURCE_FORMS})")


def stdlib_files() -> list[Path]:
    """The standard library's `.py` files, sorted; third-party packages installed beside it are left out."""
    root = Path(sysconfig.get_paths()["stdlib"])
    skipped = {"site-packages", "dist-packages", "__pycache__"}
    files = [path for path in root.rglob("*.py") if skipped.isdisjoint(path.relative_to(root).parts)]
    if not files:
        raise FileNotFoundError(f"no standard library .py files under {root}")
    return sorted(files)


def interleave(sources: list[Source], weights: tuple[float, ...] | None = None) -> Iterator[tuple[int, str]]:
    """Documents of all sources as (index, text).

    Without weights, one document from each in turn (so a token budget samples every source). With weights (one per
    source, > 0), the next document comes from the source furthest below its share of the characters given so far,
    so each source's share of the text approaches weight / sum(weights) whatever its document lengths; a source that
    runs out leaves the others to share what remains in the same proportions. Deterministic either way."""
    if weights is None:
        active = [(index, source.documents()) for index, source in enumerate(sources)]
        while active:
            for entry in list(active):
                index, documents = entry
                text = next(documents, None)
                if text is None:
                    active.remove(entry)
                elif text.strip():
                    yield index, text
        return
    if len(weights) != len(sources) or not all(weight > 0 for weight in weights):
        raise ValueError(f"weights must be one positive number per source, got {list(weights)} for {len(sources)}")
    iterators = {index: source.documents() for index, source in enumerate(sources)}
    characters = dict.fromkeys(iterators, 0)
    while iterators:
        index = min(iterators, key=lambda i: (characters[i] / weights[i], i))
        text = next(iterators[index], None)
        if text is None:
            del iterators[index]
        elif text.strip():
            characters[index] += len(text)
            yield index, text


def _ordered(files: list[Path], seed: int, shuffle: bool) -> list[Path]:
    files = sorted(files)
    if shuffle:
        random.Random(seed).shuffle(files)
    return files


def _is_known_suffix(path: Path) -> bool:
    return path.name.endswith(TEXT_SUFFIXES + RECORD_SUFFIXES)


def _file_documents(files: list[Path], text_field: str) -> Iterator[str]:
    for path in files:
        if path.name.endswith((".jsonl", ".jsonl.gz")):
            yield from _jsonl_documents(path, text_field)
        elif path.suffix == ".parquet":
            yield from _parquet_documents(path, text_field)
        else:
            # Replacement characters keep a stray Latin-1 file (the stdlib has a few) from stopping a long run.
            yield path.read_text(encoding="utf-8", errors="replace")


def _jsonl_documents(path: Path, text_field: str) -> Iterator[str]:
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt", encoding="utf-8") as lines:
        for line_number, line in enumerate(lines, start=1):
            if line.strip():
                yield _record_text(json.loads(line), text_field, f"{path}:{line_number}")


def _parquet_documents(path: Path, text_field: str) -> Iterator[str]:
    try:
        import pyarrow.parquet as parquet
    except ImportError:
        raise ValueError(f"reading {path} needs pyarrow; install with: pip install pyarrow") from None
    table = parquet.ParquetFile(path)
    if text_field not in table.schema_arrow.names:
        raise ValueError(f"{path} has no column {text_field!r} (columns: {', '.join(table.schema_arrow.names)}); "
                         f"pass --text-field")
    for batch in table.iter_batches(columns=[text_field], batch_size=1024):
        yield from (text for text in batch.column(0).to_pylist() if text)


def _record_text(record: Any, text_field: str, where: str) -> str:
    if not isinstance(record, dict) or text_field not in record:
        fields = ", ".join(record) if isinstance(record, dict) else type(record).__name__
        raise ValueError(f"{where} has no field {text_field!r} (found: {fields}); pass --text-field")
    text = record[text_field]
    if text is not None and not isinstance(text, str):
        raise ValueError(f"{where}: field {text_field!r} holds {type(text).__name__}, not text")
    return text or ""


def _open_hf_dataset(spec: str, text_field: str) -> Source:
    name, config, split = (spec.removeprefix("hf:").split(":") + [None, None])[:3]
    if not name:
        raise ValueError(f"source {spec}: expected hf:NAME[:CONFIG][:SPLIT]")
    try:
        import datasets
    except ImportError:
        raise ValueError(f"source {spec} needs the datasets package; install with: pip install datasets") from None
    try:
        dataset = datasets.load_dataset(name, config or None, split=split or "train", streaming=True)
    except Exception as err:  # noqa: BLE001 - the hub and datasets raise many kinds; the user needs one line
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ValueError(f"could not open HF dataset {name}: {reason} (needs internet or a local HF cache)") from None
    description = f"HF dataset {name} (config {config or 'default'}, split {split or 'train'}, streamed)"
    return Source(spec, description,
                  lambda: (_record_text(record, text_field, f"{spec} record") for record in dataset))
