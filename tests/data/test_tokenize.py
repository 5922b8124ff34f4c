"""Corpus preparation: shard contents, budgets, shards, idempotent reruns, nothing half-written on errors."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from hyla.data.loader import TokenCorpus
from hyla.data.sources import open_source
from hyla.data.tokenize import PrepareSettings, prepare_corpus, token_dtype
from hyla.models.loading import load_tokenizer


def _settings(tokenizer_dir, *sources, **options) -> PrepareSettings:
    return PrepareSettings(tokenizer=str(tokenizer_dir), sources=tuple(str(source) for source in sources), **options)


def _expected_stream(tokenizer, texts: list[str], separator_id: int) -> list[int]:
    stream = []
    for text in texts:
        stream += tokenizer(text, add_special_tokens=False)["input_ids"] + [separator_id]
    return stream


def test_corpus_holds_each_document_then_the_separator(tmp_path, tokenizer_dir, text_folder):
    result = prepare_corpus(tmp_path / "corpus", _settings(tokenizer_dir, text_folder, seed=5), show_progress=False)
    tokenizer = load_tokenizer(str(tokenizer_dir))
    texts = list(open_source(str(text_folder), seed=5).documents())
    expected = _expected_stream(tokenizer, texts, tokenizer.eos_token_id)
    corpus = TokenCorpus(result.path)
    assert corpus.read(0, corpus.num_tokens).tolist() == expected
    assert corpus.shards[0].dtype == np.uint16 and result.manifest["dtype"] == "uint16"
    lengths = [len(tokenizer(text, add_special_tokens=False)["input_ids"]) + 1 for text in texts]
    assert corpus.document_starts.tolist() == np.cumsum([0] + lengths[:-1]).tolist()
    manifest = result.manifest
    assert manifest["num_documents"] == 6 and manifest["num_tokens"] == len(expected)
    assert manifest["sources"][0]["num_tokens"] == len(expected) and not manifest["last_document_truncated"]
    assert manifest["tokenizer"]["vocab_size"] == len(tokenizer) and manifest["provenance"]["command"]
    assert sorted(os.listdir(result.path)) == ["document-starts.npy", "manifest.json", "shard-00000.bin"]


def test_max_tokens_cuts_exactly_and_shards_split_the_stream(tmp_path, tokenizer_dir, text_folder):
    whole = prepare_corpus(tmp_path / "whole", _settings(tokenizer_dir, text_folder), show_progress=False)
    settings = _settings(tokenizer_dir, text_folder, max_tokens=700, shard_tokens=256)
    result = prepare_corpus(tmp_path / "cut", settings, show_progress=False)
    assert result.manifest["num_tokens"] == 700 and result.manifest["last_document_truncated"]
    assert [shard["num_tokens"] for shard in result.manifest["shards"]] == [256, 256, 188]
    cut, full = TokenCorpus(result.path), TokenCorpus(whole.path)
    assert cut.read(0, 700).tolist() == full.read(0, 700).tolist()
    assert cut.read(250, 520).tolist() == full.read(250, 520).tolist()


def test_rerun_with_same_settings_is_a_no_op_and_other_settings_an_error(tmp_path, tokenizer_dir, text_folder):
    out = tmp_path / "corpus"
    settings = _settings(tokenizer_dir, text_folder, max_tokens=500)
    first = prepare_corpus(out, settings, show_progress=False)
    modified = (out / "shard-00000.bin").stat().st_mtime_ns
    again = prepare_corpus(out, settings, show_progress=False)
    assert again.already_prepared and again.manifest == first.manifest
    assert (out / "shard-00000.bin").stat().st_mtime_ns == modified
    with pytest.raises(ValueError, match="other settings.*max_tokens 500 there, 600 now"):
        prepare_corpus(out, _settings(tokenizer_dir, text_folder, max_tokens=600), show_progress=False)
    assert json.loads((out / "manifest.json").read_text()) == first.manifest


def _leftovers(tmp_path) -> list[str]:
    return sorted(name for name in os.listdir(tmp_path) if name.startswith("corpus"))


def test_empty_corpus_writes_nothing(tmp_path, tokenizer_dir):
    blank = tmp_path / "blank"
    blank.mkdir()
    (blank / "a.txt").write_text("   \n\n")
    with pytest.raises(ValueError, match="empty corpus"):
        prepare_corpus(tmp_path / "corpus", _settings(tokenizer_dir, blank), show_progress=False)
    assert _leftovers(tmp_path) == []


def test_error_while_writing_removes_the_staging_folder(tmp_path, tokenizer_dir):
    records = tmp_path / "records.jsonl"
    lines = [json.dumps({"text": f"document {index} " * 50}) for index in range(300)] + ['{"title": "no text"}']
    records.write_text("\n".join(lines))
    with pytest.raises(ValueError, match="has no field 'text'"):
        prepare_corpus(tmp_path / "corpus", _settings(tokenizer_dir, records), show_progress=False)
    assert _leftovers(tmp_path) == []


def test_bad_source_fails_before_anything_is_written(tmp_path, tokenizer_dir):
    with pytest.raises(FileNotFoundError, match="source not found"):
        prepare_corpus(tmp_path / "corpus", _settings(tokenizer_dir, tmp_path / "missing"), show_progress=False)
    assert _leftovers(tmp_path) == []


def test_stale_staging_folders_of_dead_runs_are_removed(tmp_path, tokenizer_dir, text_folder):
    # Process ids are below 2**22 on Linux, so this one belongs to no running process.
    stale = tmp_path / f"corpus.tmp-{2**22 + 7}"
    stale.mkdir()
    (stale / "shard-00000.bin").write_bytes(b"\x00" * 10)
    prepare_corpus(tmp_path / "corpus", _settings(tokenizer_dir, text_folder), show_progress=False)
    assert _leftovers(tmp_path) == ["corpus"]


def test_a_folder_that_is_not_a_corpus_is_left_alone(tmp_path, tokenizer_dir, text_folder):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "notes.txt").write_text("mine")
    with pytest.raises(ValueError, match="not a prepared corpus"):
        prepare_corpus(tmp_path / "corpus", _settings(tokenizer_dir, text_folder), show_progress=False)
    assert os.listdir(tmp_path / "corpus") == ["notes.txt"]


def test_separator_can_be_another_token(tmp_path, tokenizer_dir, text_folder):
    settings = _settings(tokenizer_dir, text_folder, separator="<sep>")
    result = prepare_corpus(tmp_path / "corpus", settings, show_progress=False)
    corpus = TokenCorpus(result.path)
    separator_id = load_tokenizer(str(tokenizer_dir)).convert_tokens_to_ids("<sep>")
    ends = np.append(corpus.document_starts[1:], corpus.num_tokens) - 1
    assert result.manifest["separator_token_id"] == separator_id
    assert (corpus.read(0, corpus.num_tokens)[ends] == separator_id).all()
    with pytest.raises(ValueError, match="not a token"):
        prepare_corpus(tmp_path / "other", _settings(tokenizer_dir, text_folder, separator="<none>"))


def test_vocabularies_beyond_uint16_use_uint32():
    assert token_dtype(49152) == np.uint16 and token_dtype(65536) == np.uint16
    assert token_dtype(65537) == np.uint32 and token_dtype(151936) == np.uint32


def test_settings_are_checked():
    with pytest.raises(ValueError, match="no --source"):
        PrepareSettings(tokenizer="x", sources=())
    with pytest.raises(ValueError, match="--max-tokens must be positive"):
        PrepareSettings(tokenizer="x", sources=("stdlib",), max_tokens=0)
    with pytest.raises(ValueError, match="gives 1 numbers for 2 sources"):
        PrepareSettings(tokenizer="x", sources=("stdlib", "stdlib"), weights=(1.0,))
    with pytest.raises(ValueError, match="--weights must be positive"):
        PrepareSettings(tokenizer="x", sources=("stdlib", "stdlib"), weights=(1.0, float("nan")))


def test_weights_are_part_of_the_settings_and_absent_without_them(tmp_path, tokenizer_dir, text_folder):
    assert "weights" not in _settings(tokenizer_dir, text_folder).to_dict()  # older corpora stay reruns
    words = "quick brown fox lazy dog stitch time saves nine numbers symbols braces".split()
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
        for i in range(40):
            text = " ".join(words[(i + j) % len(words)] for j in range(60))
            (tmp_path / name / f"{i:02d}.txt").write_text(text + "\n")
    settings = PrepareSettings(tokenizer=str(tokenizer_dir), sources=(str(tmp_path / "a"), str(tmp_path / "b")),
                               weights=(1.0, 3.0), max_tokens=3000)
    result = prepare_corpus(tmp_path / "corpus", settings, show_progress=False)
    assert result.manifest["settings"]["weights"] == [1.0, 3.0]
    counts = [source["num_tokens"] for source in result.manifest["sources"]]
    assert sum(counts) == 3000 and abs(counts[1] / 3000 - 0.75) < 0.05, counts
    assert prepare_corpus(tmp_path / "corpus", settings, show_progress=False).already_prepared
    with pytest.raises(ValueError, match="other settings.*weights"):
        prepare_corpus(tmp_path / "corpus", PrepareSettings(tokenizer=str(tokenizer_dir), max_tokens=3000,
                       sources=settings.sources, weights=(1.0, 2.0)), show_progress=False)


def test_a_run_that_finds_its_folder_taken_at_the_end_keeps_the_other_runs_work(tmp_path, tokenizer_dir,
                                                                                text_folder, monkeypatch):
    from hyla.data import tokenize

    out = tmp_path / "corpus"
    real_write_json = tokenize.write_json

    def write_json_then_race(path, data):
        real_write_json(path, data)
        out.mkdir()
        (out / "manifest.json").write_text("{}")

    monkeypatch.setattr(tokenize, "write_json", write_json_then_race)
    with pytest.raises(ValueError, match="filled by another run"):
        prepare_corpus(out, _settings(tokenizer_dir, text_folder), show_progress=False)
    assert _leftovers(tmp_path) == ["corpus"] and os.listdir(out) == ["manifest.json"]
