"""`haystack_offset`, a NIAH diagnostic outside RULER's prompts: the essays start that many words later, the needles,
their depths and the answers unchanged; RULER's prompts (offset 0) keep their samples-cache key; bad uses are one
error line before anything loads."""

from __future__ import annotations

import pytest

from hyla.evals import niah
from hyla.evals.haystack import load_essay_words
from hyla.evals.niah_cache import cached_samples, samples_key
from hyla.evals.niah_samples import TASKS, render_prompt


def _context(prompt: str) -> str:
    """The haystack between the task's instruction line and the question."""
    return prompt.split("\n", 1)[1].rsplit("\n", 1)[0]


def test_the_offset_moves_the_text_and_keeps_the_needles():
    task = TASKS["SK2"]
    plain, answers = render_prompt(task, 40, 600, "7/SK2/4096/3")
    moved, moved_answers = render_prompt(task, 40, 600, "7/SK2/4096/3", haystack_offset=5000)
    assert moved_answers == answers and moved != plain
    words = load_essay_words()
    # the haystack's first words are the essays' words from the offset on (RULER's: from the start)
    assert _context(plain).startswith(" ".join(words[:8]))
    assert _context(moved).startswith(" ".join(words[5000:5008]))
    needle = next(line for line in plain.split(". ") if "One of the special magic numbers" in line)
    assert needle in moved  # the same needle sentence, at the same fraction of the sentences
    for prompt in (plain, moved):
        sentences = _context(prompt).split(". ")
        where = next(i for i, s in enumerate(sentences) if "One of the special magic numbers" in s)
        assert abs(where / len(sentences) - 0.40) < 0.05
    # an offset past the essays' end wraps around
    assert render_prompt(task, 40, 600, "s", haystack_offset=len(words) + 5000)[0] == \
        render_prompt(task, 40, 600, "s", haystack_offset=5000)[0]


def test_samples_with_an_offset_pair_with_rulers(smollm2_tokenizer):
    plain = niah.build_samples(smollm2_tokenizer, "SK2", 1024, 3, 42)
    moved = niah.build_samples(smollm2_tokenizer, "SK2", 1024, 3, 42, haystack_offset=3000)
    assert [(s.depth_percent, s.outputs) for s in moved] == [(s.depth_percent, s.outputs) for s in plain]
    assert all(a.input != b.input for a, b in zip(plain, moved))
    assert all(s.length <= 1024 for s in moved)
    # a haystack of repeated lines has no essay text to move
    assert [s.input for s in niah.build_samples(smollm2_tokenizer, "SK1", 1024, 2, 42, haystack_offset=3000)] == \
        [s.input for s in niah.build_samples(smollm2_tokenizer, "SK1", 1024, 2, 42)]
    with pytest.raises(ValueError, match="haystack_offset must be >= 0"):
        niah.build_samples(smollm2_tokenizer, "SK2", 1024, 1, 42, haystack_offset=-1)


def test_the_offset_is_in_the_cache_key_and_rulers_key_is_unchanged(smollm2_tokenizer, tmp_path):
    key = ("tok", "SK2", 1024, 42, 11, 128)
    assert samples_key(*key) == samples_key(*key, 0) != samples_key(*key, 3000)
    cached_samples(tmp_path, smollm2_tokenizer, "SK2", 1024, 2, 42)
    moved = cached_samples(tmp_path, smollm2_tokenizer, "SK2", 1024, 2, 42, haystack_offset=3000)
    assert len(list(tmp_path.glob("*.npz"))) == 2
    assert [s.input for s in cached_samples(tmp_path, smollm2_tokenizer, "SK2", 1024, 2, 42,
                                            haystack_offset=3000)] == [s.input for s in moved]


@pytest.mark.parametrize("extra,message", [
    (["--haystack-offset", "-5", "--tasks", "SK2"], "--haystack-offset must be >= 0 words, got -5"),
    (["--haystack-offset", "100", "--tasks", "SK1,MK2"], "none of SK1, MK2 has one"),
])
def test_bad_offsets_are_one_error_before_anything_loads(tmp_path, capsys, extra, message):
    from hyla.cli import main

    for verb in (["eval", "niah", "--model", str(tmp_path / "none"), "--out", str(tmp_path / "out")],
                 ["eval", "niah-samples", "--tokenizer", str(tmp_path / "none"), "--samples-cache",
                  str(tmp_path / "cache")]):
        assert main(verb + extra) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and "\n" not in err
    assert not (tmp_path / "out").exists() and not (tmp_path / "cache").exists()
