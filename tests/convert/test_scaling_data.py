"""Choosing the logit-scaling constant on long documents: the held-out windows, their document spans, and
`scaling.data` (a corpus of long documents) end to end."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_convert_pipeline import convert_args, manifest

from hyla.cli import main
from hyla.convert.data import heldout_sequences, long_documents, longest_document_spans
from hyla.data.loader import TokenCorpus
from hyla.data.tokenize import PrepareSettings, prepare_corpus
from hyla.models.loading import load_tokenizer

WORDS = "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu".split()


def _text(seed: int, words: int) -> str:
    rng = np.random.default_rng(seed)
    return " ".join(WORDS[i] for i in rng.integers(0, len(WORDS), words)) + "\n"


@pytest.fixture()
def corpus_of(tiny_teacher, tmp_path):
    """Prepare a corpus of documents with the given numbers of words (one file each, kept in order)."""

    def make(name: str, word_counts: list[int]):
        folder = tmp_path / f"{name}-text"
        folder.mkdir()
        texts = [_text(i, count) for i, count in enumerate(word_counts)]
        for i, text in enumerate(texts):
            (folder / f"doc{i:02d}.txt").write_text(text)
        settings = PrepareSettings(tokenizer=str(tiny_teacher), sources=(str(folder),), shuffle_files=False)
        prepare_corpus(tmp_path / name, settings, show_progress=False)
        return TokenCorpus(tmp_path / name), texts

    return make


def _document_starts_from_separators(corpus: TokenCorpus) -> list[int]:
    """Where documents start, found from the separator tokens in the stream (not from document-starts.npy)."""
    stream = corpus.read(0, corpus.num_tokens)
    separator = corpus.manifest["separator_token_id"]
    return [0] + [int(i) + 1 for i in np.flatnonzero(stream == separator)[:-1]]


def test_long_documents_are_the_first_long_enough_documents(tiny_teacher, corpus_of):
    corpus, texts = corpus_of("mixed", [20, 400, 30, 10, 500, 600])
    tokenizer = load_tokenizer(str(tiny_teacher))
    lengths = [len(tokenizer(text, add_special_tokens=False)["input_ids"]) + 1 for text in texts]
    length = 256
    long_enough = [i for i, n in enumerate(lengths) if n >= length]
    assert long_enough == [1, 4, 5]  # the fixture is what the test thinks it is
    windows, spans = long_documents(corpus, length=length, num_docs=2)
    for window, index in zip(windows, long_enough[:2]):
        expected = tokenizer(texts[index], add_special_tokens=False)["input_ids"][:length]
        assert window.tolist() == expected
    assert spans == [length, length]
    with pytest.raises(ValueError, match=r"no document of 4096 tokens or more \(its longest has"):
        long_documents(corpus, length=4096, num_docs=2)


def test_held_out_windows_report_their_longest_document(corpus_of):
    corpus, _ = corpus_of("spans", [20, 400, 30, 10, 500, 600, 15, 15])
    starts = _document_starts_from_separators(corpus) + [corpus.num_tokens]
    length = 128
    windows, spans = heldout_sequences(corpus, length=length, num_docs=6)
    assert windows.shape == (6, length)
    for i, span in enumerate(spans):
        low, high = i * length, (i + 1) * length
        cuts = sorted({low, high} | {s for s in starts if low < s < high})
        assert span == max(b - a for a, b in zip(cuts, cuts[1:])), i
    assert longest_document_spans(corpus, [0], corpus.num_tokens) == [max(np.diff(starts))]


@pytest.mark.slow
def test_scaling_data_chooses_a_on_long_documents_and_is_checked_first(tiny_teacher, corpus_of, tmp_path, capsys):
    long, _ = corpus_of("long", [600, 20, 700])
    out = tmp_path / "run"
    assert main(convert_args(tiny_teacher, out, "--set", f"scaling.data={long.path}")) == 0
    results = manifest(out, "scaling")["results"]
    assert results["source"] == str(long.path) and results["longest_document_tokens"] == [256]
    assert set(results["loss_by_a"]) == {"None", "20", "500"}

    short, _ = corpus_of("short", [20, 30, 40])
    capsys.readouterr()
    bad = tmp_path / "bad"
    assert main(convert_args(tiny_teacher, bad, "--set", f"scaling.data={short.path}")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no document of 256 tokens or more" in err[0]
    assert not any(bad.glob("*/manifest.json"))  # refused before any stage ran
    assert main(convert_args(tiny_teacher, tmp_path / "none", "--set", f"scaling.data={tmp_path / 'nothing'}")) == 2
    assert "not a prepared corpus" in capsys.readouterr().err


def test_the_default_scaling_settings_keep_their_hash():
    from hyla.convert.presets import ScalingPlan

    assert "data" not in ScalingPlan().settings()
    assert ScalingPlan(data="/x").settings()["data"] == "/x"
    assert json.dumps(ScalingPlan().settings(), sort_keys=True) == json.dumps(
        {"candidates": [None, 5.0, 20.0, 50.0, 100.0, 200.0, 500.0, 1000.0], "length": 4096, "num_docs": 8},
        sort_keys=True)
