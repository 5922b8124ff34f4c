"""Text sources: files, folders, globs, records, the standard library, HF datasets (faked), interleaving."""

from __future__ import annotations

import gzip
import json
import sys
import types

import pytest

from hyla.data.sources import Source, expand_paths, interleave, open_source, stdlib_files


def _texts(spec: str, **options) -> list[str]:
    return list(open_source(spec, **options).documents())


def test_folder_takes_known_suffixes_recursively_in_a_seeded_order(text_folder):
    files = expand_paths(str(text_folder))
    assert files == sorted(files) and len(files) == 6
    assert {path.suffix for path in files} == {".txt", ".md", ".py"}
    sorted_texts = _texts(str(text_folder), shuffle_files=False)
    assert sorted_texts == [path.read_text() for path in files]
    shuffled = _texts(str(text_folder), seed=3)
    assert shuffled == _texts(str(text_folder), seed=3) and sorted(shuffled) == sorted(sorted_texts)
    assert any(_texts(str(text_folder), seed=seed) != sorted_texts for seed in range(3))


def test_glob_and_single_file(text_folder):
    assert len(expand_paths(str(text_folder / "**" / "*.md"))) == 2
    named = text_folder / "ignored.bin"
    assert expand_paths(str(named)) == [named]


def test_missing_or_empty_sources_are_clear_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="source not found"):
        open_source(str(tmp_path / "nothing"))
    with pytest.raises(FileNotFoundError, match="matches no files"):
        open_source(str(tmp_path / "*.txt"))
    with pytest.raises(ValueError, match="holds no"):
        open_source(str(tmp_path))
    with pytest.raises(FileNotFoundError, match="teacher not found"):
        open_source(f"teacher:{tmp_path / 'no-teacher'}")
    with pytest.raises(ValueError, match="needs a teacher spec"):
        open_source("teacher:")


def test_jsonl_gzip_and_parquet_records_take_the_text_field(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    records = [{"text": "first record", "id": 1}, {"text": "second record", "id": 2}]
    (tmp_path / "a.jsonl").write_text("\n".join(json.dumps(record) for record in records) + "\n\n")
    with gzip.open(tmp_path / "b.jsonl.gz", "wt") as file:
        file.write(json.dumps({"body": "zipped"}) + "\n")
    pq.write_table(pa.table({"body": ["from parquet", None]}), tmp_path / "c.parquet")
    assert _texts(str(tmp_path / "a.jsonl")) == ["first record", "second record"]
    assert _texts(str(tmp_path / "b.jsonl.gz"), text_field="body") == ["zipped"]
    assert _texts(str(tmp_path / "c.parquet"), text_field="body") == ["from parquet"]
    with pytest.raises(ValueError, match=r"a.jsonl:1 has no field 'content' \(found: text, id\)"):
        _texts(str(tmp_path / "a.jsonl"), text_field="content")
    with pytest.raises(ValueError, match=r"no column 'text' \(columns: body\)"):
        _texts(str(tmp_path / "c.parquet"))


def test_stdlib_is_the_standard_library_without_installed_packages():
    files = stdlib_files()
    names = {path.name for path in files}
    assert {"argparse.py", "os.py"} <= names
    assert not any("site-packages" in path.parts for path in files)
    assert files == sorted(files)
    source = open_source("stdlib")
    assert "standard library" in source.description
    assert next(source.documents()) == next(open_source("stdlib").documents())


def test_interleave_takes_one_document_from_each_source_in_turn_and_skips_blank_ones():
    first = Source("a", "", lambda: iter(["a1", "   ", "a2", "a3"]))
    second = Source("b", "", lambda: iter(["b1"]))
    assert list(interleave([first, second])) == [(0, "a1"), (1, "b1"), (0, "a2"), (0, "a3")]


def test_weighted_interleave_gives_each_source_its_share_of_the_characters():
    # Documents of very different lengths: turn-taking would give "long" 10/11 of the text; weights 1:3 give ~1/4.
    long = Source("long", "", lambda: iter(["L" * 1000] * 200))
    short = Source("short", "", lambda: iter(["s" * 10] * 100_000))
    taken = list(interleave([long, short], weights=(1.0, 3.0)))
    prefix = taken[:4000]
    chars = [sum(len(text) for index, text in prefix if index == source) for source in (0, 1)]
    assert abs(chars[0] / sum(chars) - 0.25) < 0.02
    # Deterministic, and a source that runs out leaves the rest to the others (all documents come out once).
    assert taken == list(interleave([long, short], weights=(1.0, 3.0)))
    assert sum(index == 0 for index, _ in taken) == 200 and sum(index == 1 for index, _ in taken) == 100_000


def test_weights_must_be_one_positive_number_per_source():
    sources = [Source("a", "", lambda: iter(["a"])), Source("b", "", lambda: iter(["b"]))]
    with pytest.raises(ValueError, match="one positive number per source"):
        list(interleave(sources, weights=(1.0,)))
    with pytest.raises(ValueError, match="one positive number per source"):
        list(interleave(sources, weights=(1.0, 0.0)))


def test_hf_source_without_datasets_says_how_to_install(monkeypatch):
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(ValueError, match="pip install datasets"):
        open_source("hf:HuggingFaceFW/fineweb-edu")


def test_hf_source_streams_the_named_split(monkeypatch):
    calls = []

    def load_dataset(name, config, split, streaming):
        calls.append((name, config, split, streaming))
        if name == "offline/fails":
            raise ConnectionError("no network\nmore detail")
        return iter([{"text": "streamed one"}, {"text": "streamed two"}])

    monkeypatch.setitem(sys.modules, "datasets", types.SimpleNamespace(load_dataset=load_dataset))
    source = open_source("hf:HuggingFaceFW/fineweb-edu:sample-10BT:validation")
    assert list(source.documents()) == ["streamed one", "streamed two"]
    assert calls == [("HuggingFaceFW/fineweb-edu", "sample-10BT", "validation", True)]
    with pytest.raises(ValueError, match=r"could not open HF dataset offline/fails: no network \(needs"):
        open_source("hf:offline/fails")
