"""Synthetic recall documents: another source's text as a haystack, with a few key-value facts inserted in it and a
question about one of them, answered, at the end (`hyla data prepare --source recall:SPEC`).

A converted hybrid must relearn in-context retrieval once its attention layers lose RoPE (docs/results); ordinary
text asks for it rarely. These documents ask for it in every one, in the middle of real text, and in a distillation
the teacher's own prediction of the answer is the signal. Their wording is this module's own and differs from
RULER's NIAH templates (`hyla.evals.niah_samples`: "One of the special magic numbers for KEY is: VALUE." and "What
is the special magic number for KEY mentioned in the provided text?"), and their keys are made-up names, not
RULER's adjective-noun pairs; so NIAH scores after training on them measure transfer, not the memory of a template.

A document: haystack lines (consecutive text of the wrapped source, cut to a length drawn uniformly from
[min_chars, max_chars]), 1-4 facts of one kind ("The access code for Koravin is 48213.") at random line positions,
each about a different key, then "Question: What is the access code for Koravin?\nAnswer: The access code for
Koravin is 48213." Generation is sequential under one seeded RNG, so the same source and seed give the same
documents.

Spec: `recall:SPEC` (haystack lengths 2,000-14,000 characters) or `recall@MIN-MAX:SPEC` (characters), where SPEC is
any other source spec. `recall-repeat:SPEC` / `recall-repeat@MIN-MAX:SPEC`: the haystack is one short passage of the
source (one to a few sentences, 60-300 characters, on one line) repeated line after line to the drawn length, the
facts among the repetitions. A long run of identical lines is where a recurrent layer's state fills with one
pattern and a hybrid tends to continue the pattern instead of answering; these documents ask for the answer there.

`recall-long:SPEC`, `recall-long@MIN-MAX:SPEC`, `recall-repeat-long:SPEC`, `recall-repeat-long@MIN-MAX:SPEC`: the same
documents, but the facts' values are long codes to copy character by character, 16-48 characters (a hybrid trained on
`recall` copies 7-digit numbers yet fails RULER's SK3, whose value is a 36-character UUID), of six kinds: a license
key ("Q7XK2-M9PDW-4HT8R-ZC3NB": 3-6 hyphen-joined groups of one length, 4-8 upper-case letters and digits), a recovery
code ("3fa9-0c17be-5d2a94c0e1-77b": 3-6 groups of lower-case hex, each of its own length, 3-12), a build hash (20-40
lower-case hex characters), a session token (24-40 letters of both cases and digits), a tracking code ("KX7-" and
13-30 upper-case letters and digits) and an account number (4-6 groups of 4 digits). A value outside 16-48 characters
or holding RULER's UUID layout anywhere (8-4-4-4-12 hex, either case) is drawn again, so none is RULER's value. Only
the kinds differ: haystacks, templates and question are those of `recall` and `recall-repeat`, whose documents this
variant leaves unchanged. A value is 16-48 characters (29 on average) where a short one is 3-11 (7); docs/data.md,
"Long values", has the cost per document and the command that measures it.

`recall-lead:SPEC` (and `recall-repeat-lead`, `recall-lead-long`, `recall-repeat-lead-long`, each with an optional
@MIN-MAX): documents in which the answer can only be found by its key. They open with a lead line that names the kind
and says " is " but no key ("Every license key in these notes is written down once; keep each one in mind."), and the
question and answer take one of four wordings in which words stand between the key and " is " ("Answer: The access
code for Koravin, as written above, is 48213."), so that no answer sentence, before its value, is any fact's
sentence or ends like one. A hybrid that continues the sentence most like its answer prefix instead of looking up the
key answers with the rest of the lead line: RULER's prompt opens with such a sentence ("A special magic number is
hidden within the following text."), and a converted hybrid answered " hidden within the following text?" in 20 of
25 4K prompts (docs/log/2026-12-02-smollm2-135m-halo-sitting-e.md). In these documents the teacher's prediction of
the answer, found by the key, is what a distillation asks for. The facts, haystacks and values are those of the
variant without -lead.

`-dense` (last of the options: `recall-lead-dense@MIN-MAX:SPEC`, `recall-repeat-lead-long-dense:SPEC`, ...): one
fact for every 2,000 characters of haystack (at least 4: 16-32 in a haystack of 32K-64K characters), all of one
kind, and every fact asked once at the end, in a random order, one question-answer pair after another. A plain
document asks one question, so a stage trained on 8K-16K-token documents sees one answer of a few tokens in each:
~1,300 long-range answers in 25M tokens. A dense one asks 16-32, whose facts lie anywhere from the question back to
the document's start, each among facts of the same kind with other keys. Without -dense a spec gives the documents it
always gave.

`-words` (last of all: `recall-lead-dense-words@MIN-MAX:SPEC`): each key is two or three words of the document's own
haystack, lower case and hyphen-joined ("harbour-process"), instead of a made-up name ("Koravin"). A made-up name is
a run of rare subword tokens that no haystack word shares, so a layer finds the fact by token identity alone; a key
of the haystack's own words shares its tokens with the text around it, as a key of ordinary words in ordinary text
does (RULER's keys are adjective-noun pairs of its own word lists, never drawn here). Words are 4-12 letters; a
haystack with fewer than WORD_KEY_MIN_VOCABULARY distinct ones (a short repeated passage), or too few for half its
keys to be drawn without repeats (a -dense haystack of hundreds of thousands of characters on a short passage), gets
made-up names.
"""

from __future__ import annotations

import functools
import random
import re
import string
from collections.abc import Callable, Iterator
from dataclasses import dataclass

DEFAULT_CHARS = (2000, 14000)
MAX_FACTS = 4
DENSE_CHARS_PER_FACT = 2000  # -dense: one fact for every this many characters of haystack (at least MAX_FACTS)
REPEAT_CHARS = (60, 300)  # the repeated passage of a recall-repeat haystack
_SPEC = re.compile(r"recall(-repeat)?(-lead)?(-long)?(-dense)?(-words)?(?:@(\d+)-(\d+))?:(.+)", re.DOTALL)
WORD_KEY_MIN_VOCABULARY = 8  # -words: distinct haystack words needed (8 give 392 keys of 2-3 words), else made-up names
_WORD = re.compile(r"\b[A-Za-z]{4,12}\b")

_SYLLABLES = ("ka", "ro", "vin", "ta", "mi", "sel", "do", "ra", "lu", "ne", "bor", "ish", "an", "te", "quo", "ul",
              "fen", "ga", "zir", "po", "mar", "eth", "si", "wen", "ol", "dra", "ku", "ny", "bel", "cor")
_FACT_TEMPLATES = ("The {kind} for {key} is {value}.", "Remember that {key} has the {kind} {value}.",
                   "Note: the {kind} of {key} is {value}.", "For the record, {key} uses the {kind} {value}.")
_QUESTION = "Question: What is the {kind} for {key}?\nAnswer: The {kind} for {key} is {value}."
# -lead: the line before the haystack (the kind and " is ", no key), and the question-answer pairs whose answer puts
# words between the key and " is " (so that it never ends like a fact template before the value).
_LEADS = ("Every {kind} in these notes is written down once; keep each one in mind.",
          "The text below is ordinary, except that a {kind} is given here and there for a name.",
          "Read carefully: each {kind} is stated only once in what follows.",
          "Somewhere among the following lines, a {kind} is noted for one or more names.")
_LEAD_QUESTIONS = (
    "Question: What is the {kind} for {key} stated in the text above?\n"
    "Answer: The {kind} for {key}, as written above, is {value}.",
    "Question: Which {kind} does the text give for {key}?\nAnswer: For {key}, the {kind} given in the text is {value}.",
    "Question: Look back through the notes. What {kind} belongs to {key}?\n"
    "Answer: The {kind} belonging to {key}, as the notes say, is {value}.",
    "Question: In the text above, what is {key}'s {kind}?\nAnswer: {key}'s {kind}, according to the text, is {value}.")


def _digits(rng: random.Random, low: int, high: int) -> str:
    return str(rng.randint(10 ** (low - 1), 10**high - 1))


def _serial(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_uppercase, k=2)) + "-" + _digits(rng, 4, 5)


def _ticket(rng: random.Random) -> str:
    return "".join(rng.choices("0123456789abcdef", k=8))


def _password(rng: random.Random) -> str:
    return _name(rng).lower() + _digits(rng, 2, 2)


_KINDS = (("access code", lambda rng: _digits(rng, 4, 8)), ("room number", lambda rng: _digits(rng, 3, 4)),
          ("serial number", _serial), ("ticket id", _ticket), ("password", _password))


def _name(rng: random.Random) -> str:
    return "".join(rng.choices(_SYLLABLES, k=rng.randint(2, 3))).capitalize()


def haystack_words(haystack: str) -> list[str]:
    """The distinct words (4-12 letters, lower case) of `haystack`, in order of first appearance."""
    return list(dict.fromkeys(word.lower() for word in _WORD.findall(haystack)))


def _word_key(rng: random.Random, words: list[str]) -> str:
    return "-".join(rng.sample(words, rng.randint(2, 3)))


LONG_VALUE_CHARS = (16, 48)
_UPPER_ALNUM = string.ascii_uppercase + string.digits
_HEX = "0123456789abcdef"
# RULER's SK3/MK3 value (str(uuid.UUID(...)) in hyla.evals.niah_samples), searched anywhere in a value, either case.
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)


def _groups(rng: random.Random, alphabet: str, lengths: list[int]) -> str:
    return "-".join("".join(rng.choices(alphabet, k=length)) for length in lengths)


def _license_key(rng: random.Random) -> str:
    return _groups(rng, _UPPER_ALNUM, [rng.randint(4, 8)] * rng.randint(3, 6))


def _recovery_code(rng: random.Random) -> str:
    return _groups(rng, _HEX, [rng.randint(3, 12) for _ in range(rng.randint(3, 6))])


def _build_hash(rng: random.Random) -> str:
    return "".join(rng.choices(_HEX, k=rng.randint(20, 40)))


def _session_token(rng: random.Random) -> str:
    return "".join(rng.choices(string.ascii_letters + string.digits, k=rng.randint(24, 40)))


def _tracking_code(rng: random.Random) -> str:
    prefix = "".join(rng.choices(string.ascii_uppercase, k=2)) + rng.choice(string.digits)
    return prefix + "-" + "".join(rng.choices(_UPPER_ALNUM, k=rng.randint(13, 30)))


def _account_number(rng: random.Random) -> str:
    return _groups(rng, string.digits, [4] * rng.randint(4, 6))


def long_value(rng: random.Random, make: Callable[[random.Random], str]) -> str:
    """A value of `make`, drawn again until it is 16-48 characters long and holds no UUID-shaped part."""
    while True:
        value = make(rng)
        if LONG_VALUE_CHARS[0] <= len(value) <= LONG_VALUE_CHARS[1] and not _UUID.search(value):
            return value


LONG_KINDS = tuple((kind, functools.partial(long_value, make=make)) for kind, make in (
    ("license key", _license_key), ("recovery code", _recovery_code), ("build hash", _build_hash),
    ("session token", _session_token), ("tracking code", _tracking_code), ("account number", _account_number)))


@dataclass(frozen=True)
class RecallSpec:
    inner: str
    min_chars: int = DEFAULT_CHARS[0]
    max_chars: int = DEFAULT_CHARS[1]
    repeat: bool = False  # the haystack: one short passage repeated (recall-repeat), else consecutive text
    long_values: bool = False  # the values: long codes (LONG_KINDS, the -long variants), else short ones
    lead: bool = False  # a lead line and an answer found only by the key (the -lead variants)
    dense: bool = False  # a fact every DENSE_CHARS_PER_FACT characters, every one asked at the end (-dense)
    word_keys: bool = False  # keys of the haystack's own words (-words), else made-up names


def parse_recall_spec(spec: str) -> RecallSpec:
    """`recall[-repeat][-lead][-long][-dense][-words]:SPEC` or the same with `@MIN-MAX` before the colon ->
    RecallSpec; ValueError with the expected form otherwise."""
    match = _SPEC.fullmatch(spec)
    if match is None or not match.group(8).strip():
        raise ValueError(f"source {spec}: expected recall[-repeat][-lead][-long][-dense][-words]:SPEC or "
                         "recall[-repeat][-lead][-long][-dense][-words]@MIN-MAX:SPEC (haystack characters; the "
                         "options in this order)")
    repeat, lead, long_values, dense, words, low, high, inner = match.groups()
    flags = dict(repeat=bool(repeat), long_values=bool(long_values), lead=bool(lead), dense=bool(dense),
                 word_keys=bool(words))
    if low is None:
        return RecallSpec(inner, **flags)
    if not 0 < int(low) <= int(high):
        raise ValueError(f"source {spec}: need 0 < MIN <= MAX characters, got {low}-{high}")
    return RecallSpec(inner, int(low), int(high), **flags)


@dataclass
class RecallDoc:
    text: str
    kind: str
    keys: list[str]
    values: list[str]
    asked: int  # index into keys/values of the fact the (first) question asks for
    order: tuple[int, ...] = ()  # the facts asked, in the questions' order ((asked,) unless dense)


def dense_fact_count(haystack_chars: int) -> int:
    """-dense: how many facts a haystack of this many characters holds."""
    return max(MAX_FACTS, haystack_chars // DENSE_CHARS_PER_FACT)


def make_document(haystack: str, rng: random.Random, *, long_values: bool = False, lead: bool = False,
                  dense: bool = False, word_keys: bool = False) -> RecallDoc:
    """Insert 1-4 facts of one kind into `haystack` (at line boundaries) and append the question and its answer;
    `long_values`: a kind of LONG_KINDS; `lead`: a lead line first and one of the lead variants' questions; `dense`:
    `dense_fact_count` facts instead, each asked once at the end, in a random order, one question-answer pair after
    another. `word_keys`: keys of two or three of the haystack's own words (`haystack_words`) where it has at least
    WORD_KEY_MIN_VOCABULARY of them, else made-up names."""
    kind, value_of = rng.choice(LONG_KINDS if long_values else _KINDS)
    count = dense_fact_count(len(haystack)) if dense else rng.randint(1, MAX_FACTS)
    words = haystack_words(haystack) if word_keys else []
    # Word keys only where far more of them exist than the document asks for (n words give n(n-1) + n(n-1)(n-2)).
    enough = len(words) >= WORD_KEY_MIN_VOCABULARY and 2 * count <= len(words) * (len(words) - 1) ** 2
    new_key = functools.partial(_word_key, words=words) if enough else _name
    keys: list[str] = []
    while len(keys) < count:
        key = new_key(rng)
        if key not in keys:
            keys.append(key)
    values = [value_of(rng) for _ in keys]
    lines = haystack.split("\n")
    for key, value in zip(keys, values):
        fact = rng.choice(_FACT_TEMPLATES).format(kind=kind, key=key, value=value)
        lines.insert(rng.randint(0, len(lines)), fact)
    order = tuple(rng.sample(range(count), count)) if dense else (rng.randrange(count),)
    if lead:
        lines.insert(0, rng.choice(_LEADS).format(kind=kind))
    questions = [(rng.choice(_LEAD_QUESTIONS) if lead else _QUESTION).format(kind=kind, key=keys[i], value=values[i])
                 for i in order]
    return RecallDoc("\n".join(lines).rstrip() + "\n\n" + "\n\n".join(questions), kind, keys, values, order[0], order)


def _sentence_end(text: str, start: int, stop: int, *, last: bool) -> int:
    """The index just past a sentence end (". " or ".\\n") in text[start:stop], the last or first one; -1 if none."""
    ends = [i + 1 for i in (text.rfind(m, start, stop) if last else text.find(m, start, stop) for m in (". ", ".\n"))
            if i >= 0]
    return (max(ends) if last else min(ends)) if ends else -1


def _passage(text: str, length: int) -> tuple[str, int]:
    """About `length` characters of the start of `text`, whole sentences where it can (the last sentence end in the
    last two thirds, else the first one before twice the length, else the last space), on one line; and how many
    characters of `text` it used."""
    cut = _sentence_end(text, length // 3, length, last=True)
    if cut < 0:
        cut = _sentence_end(text, length, 2 * length, last=False)
    if cut < 0:
        cut = text.rfind(" ", length // 3, length)
        cut = cut if cut > 0 else length
    return " ".join(text[:cut].split()), cut


def recall_documents(texts: Iterator[str], *, seed: int, min_chars: int = DEFAULT_CHARS[0],
                     max_chars: int = DEFAULT_CHARS[1], repeat: bool = False,
                     long_values: bool = False, lead: bool = False, dense: bool = False,
                     word_keys: bool = False) -> Iterator[RecallDoc]:
    """Recall documents whose haystacks are consecutive pieces of `texts`, each of a length drawn uniformly from
    [min_chars, max_chars] (cut back to the last line break when there is one); the rest of the text is dropped.
    `repeat`: each haystack is instead a passage of 60-300 characters of `texts` (consecutive passages for
    consecutive documents) repeated one per line to the drawn length. `long_values`: the facts' values are long codes
    (LONG_KINDS). `lead`: a lead line and an answer found only by the key; `dense`: a fact every
    DENSE_CHARS_PER_FACT characters, each asked at the end; `word_keys`: keys of the haystack's words
    (`make_document`)."""
    rng = random.Random(f"hyla-recall-{seed}")
    pending = ""
    target = rng.randint(min_chars, max_chars)
    need = rng.randint(*REPEAT_CHARS) if repeat else target  # characters of text the next haystack takes
    for text in texts:
        pending += text if not pending else "\n" + text
        while len(pending) >= need:
            if repeat:
                passage, used = _passage(pending, need)
                pending = pending[used:].lstrip()
                haystack = "\n".join([passage] * max(1, target // (len(passage) + 1))) if passage else ""
            else:
                cut = pending.rfind("\n", 0, target)
                cut = cut if cut > target // 2 else target
                haystack, pending = pending[:cut].strip("\n"), pending[cut:].lstrip("\n")
            if haystack.strip():
                yield make_document(haystack, rng, long_values=long_values, lead=lead, dense=dense,
                                    word_keys=word_keys)
            target = rng.randint(min_chars, max_chars)
            need = rng.randint(*REPEAT_CHARS) if repeat else target
