"""NIAH prompts kept on disk: a later evaluation with the same tokenizer reads the prompts an earlier one built,
identical to building them, and anything else builds its own."""

from __future__ import annotations

import json

import numpy as np
import pytest

import hyla.evals.niah_cache as niah_cache
from hyla.evals import niah
from hyla.evals.niah_cache import cached_samples, tokenizer_fingerprint
from hyla.models.loading import load_tokenizer


@pytest.fixture(scope="module")
def two_folders_one_tokenizer(smollm2_tokenizer, tmp_path_factory):
    """The SmolLM2 tokenizer saved twice and loaded from each folder: a teacher's and its hybrid's."""
    folders = [tmp_path_factory.mktemp(name) for name in ("teacher", "hybrid")]
    for folder in folders:
        smollm2_tokenizer.save_pretrained(folder)
    return [load_tokenizer(str(folder)) for folder in folders]


def _no_building(*args, **kwargs):
    raise AssertionError("built the samples again")


def test_a_second_evaluation_reads_the_prompts_the_first_built(two_folders_one_tokenizer, tmp_path, monkeypatch):
    teacher, hybrid = two_folders_one_tokenizer
    assert tokenizer_fingerprint(teacher) == tokenizer_fingerprint(hybrid) is not None
    built = niah.build_samples(hybrid, "SK2", 2048, 3, 42)
    assert cached_samples(tmp_path, teacher, "SK2", 2048, 3, 42)[0].to_dict() == built[0].to_dict()
    monkeypatch.setattr(niah_cache, "build_samples", _no_building)
    read = cached_samples(tmp_path, hybrid, "SK2", 2048, 3, 42)
    assert [sample.to_dict() for sample in read] == [sample.to_dict() for sample in built]
    for sample, fresh in zip(read, built):
        # the ids go to the tokenizer that reads them, so the evaluation does not encode the prompt again
        np.testing.assert_array_equal(sample.prompt_ids.of(hybrid), fresh.prompt_ids.of(hybrid))
    assert read[0].prompt_ids.of(teacher) is None


def test_evaluations_score_the_same_with_and_without_the_cache(smollm2_tokenizer, needle_oracle, tmp_path,
                                                              monkeypatch):
    options = dict(tasks=["SK1", "SK3"], lengths=[1024], num_samples=2, max_new_tokens=48)
    plain = niah.evaluate_niah(needle_oracle, smollm2_tokenizer, **options)
    first = niah.evaluate_niah(needle_oracle, smollm2_tokenizer, **options, samples_cache=tmp_path)
    monkeypatch.setattr(niah_cache, "build_samples", _no_building)
    second = niah.evaluate_niah(needle_oracle, smollm2_tokenizer, **options, samples_cache=tmp_path)
    assert plain["records"] == first["records"] == second["records"] and plain["summary"]["accuracy"] == 1.0


def test_a_cell_of_more_samples_serves_fewer_and_fewer_serve_none(smollm2_tokenizer, tmp_path, monkeypatch):
    # Sample i depends on its index alone: the first 2 of 4 are the 2 asked for on their own.
    built = niah.build_samples(smollm2_tokenizer, "SK2", 1024, 4, 42)
    assert [s.to_dict() for s in built[:2]] == [s.to_dict() for s in niah.build_samples(smollm2_tokenizer, "SK2",
                                                                                          1024, 2, 42)]
    cached_samples(tmp_path, smollm2_tokenizer, "SK2", 1024, 4, 42)
    with monkeypatch.context() as patch:
        patch.setattr(niah_cache, "build_samples", _no_building)
        fewer = cached_samples(tmp_path, smollm2_tokenizer, "SK2", 1024, 2, 42)
    assert [s.to_dict() for s in fewer] == [s.to_dict() for s in built[:2]]
    more = cached_samples(tmp_path, smollm2_tokenizer, "SK2", 1024, 5, 42)  # built, and the file replaced
    assert len(more) == 5 and [s.to_dict() for s in more[:4]] == [s.to_dict() for s in built]
    monkeypatch.setattr(niah_cache, "build_samples", _no_building)
    assert len(cached_samples(tmp_path, smollm2_tokenizer, "SK2", 1024, 5, 42)) == 5


def test_other_cells_tokenizers_and_broken_files_build_their_own(smollm2_tokenizer, make_word_tokenizer, tmp_path):
    cached_samples(tmp_path, smollm2_tokenizer, "SK1", 1024, 2, 42)
    (only,) = tmp_path.glob("*.npz")
    for other in [("SK1", 1024, 2, 7), ("SK1", 2048, 2, 42), ("SK2", 1024, 2, 42)]:
        cached_samples(tmp_path, smollm2_tokenizer, other[0], other[1], other[2], other[3])
    assert len(list(tmp_path.glob("*.npz"))) == 4
    assert tokenizer_fingerprint(make_word_tokenizer()) != tokenizer_fingerprint(smollm2_tokenizer)
    only.write_bytes(b"not a cache file")
    again = cached_samples(tmp_path, smollm2_tokenizer, "SK1", 1024, 2, 42)
    assert [s.to_dict() for s in again] == [s.to_dict() for s in niah.build_samples(smollm2_tokenizer, "SK1", 1024,
                                                                                    2, 42)]
    assert len(json.loads(np.load(only)["meta"].tobytes().decode())) == 2  # rewritten whole


def test_niah_samples_builds_what_an_evaluation_then_reads(two_folders_one_tokenizer, smollm2_tokenizer,
                                                          needle_oracle, tmp_path, monkeypatch, capsys):
    """`hyla eval niah-samples` (no model: the tokenizer a teacher and its hybrid share) fills the cache an
    evaluation of either reads: the evaluation builds nothing and scores what it scores without the cache."""
    from hyla.cli import main

    teacher_folder = tmp_path / "teacher"
    smollm2_tokenizer.save_pretrained(teacher_folder)
    cache = tmp_path / "cache"
    argv = ["eval", "niah-samples", "--tokenizer", str(teacher_folder), "--samples-cache", str(cache),
            "--tasks", "SK1,SK3", "--lengths", "1K", "--num-samples", "2"]
    assert main(argv) == 0
    assert "SK3 1024: 2 samples built" in capsys.readouterr().out
    assert main(argv) == 0
    assert "SK3 1024: 2 samples read" in capsys.readouterr().out
    options = dict(tasks=["SK1", "SK3"], lengths=[1024], num_samples=2, max_new_tokens=48)
    plain = niah.evaluate_niah(needle_oracle, smollm2_tokenizer, **options)
    monkeypatch.setattr(niah_cache, "build_samples", _no_building)
    cached = niah.evaluate_niah(needle_oracle, two_folders_one_tokenizer[1], **options, samples_cache=cache)
    assert plain["records"] == cached["records"]


def test_niah_samples_refuses_an_unknown_task_before_loading_anything(tmp_path, capsys):
    from hyla.cli import main

    code = main(["eval", "niah-samples", "--tokenizer", str(tmp_path / "none"), "--samples-cache",
                 str(tmp_path / "cache"), "--tasks", "SK9"])
    assert code == 2 and "unknown NIAH task 'SK9'" in capsys.readouterr().err
    assert not (tmp_path / "cache").exists()
