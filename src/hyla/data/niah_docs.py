"""RULER-SK1-like training documents: a needle in a "The grass is green." haystack, the question, and the answer.

A 33M model trained from scratch on 10-25M tokens of ordinary text is not expected to answer RULER's NIAH prompts
at all, so the seed-003 experiment (configs/experiments/seed-003.json, through `hyla data niah-mix`) mixes in
documents of exactly the evaluation's format, up to the training length, and then asks whether the learned retrieval
survives 16x that length (with and without EME). Copy lists (below) add dense in-context copying, the mechanism this
SK1 needs.

The strings (needle, haystack line, question and answer prefix) are hyla's RULER templates, imported, so training
and evaluation share the format byte for byte; the sampling (keys, values, sizes, depths) is this file's own. A
document is `prompt + " VALUE."`: what a model that answers correctly would write after the evaluation prompt.

Keys are RULER's adjective-noun words, values 7-digit numbers, both drawn from this generator's own seed; every key
and value of the evaluation samples the run will score (rebuilt with `hyla.evals.niah.build_samples`, the same call
the evaluation makes) is excluded, so no evaluation needle is ever seen in training.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field

from hyla.evals.haystack import adjective_noun_lists, count_tokens
from hyla.evals.niah_samples import NEEDLE_TEMPLATE, REPEAT_HAYSTACK_LINE, TASKS, build_samples, prompt_template

TASK = TASKS["SK1"]
_QUERY = re.compile(r"What is the special magic number for (\S+) mentioned in the provided text\?")


@dataclass
class RetrievalDoc:
    text: str
    key: str
    value: str
    num_lines: int
    needle_line: int


@dataclass
class Exclusions:
    """Keys and values of the evaluation samples, which training documents must not use."""

    keys: set[str] = field(default_factory=set)
    values: set[str] = field(default_factory=set)
    num_samples: int = 0


def render_doc(key: str, value: str, num_lines: int, needle_line: int) -> str:
    """The evaluation prompt for this needle (as `hyla.evals.niah_samples` renders SK1), then the answer."""
    lines = [REPEAT_HAYSTACK_LINE] * num_lines
    lines.insert(needle_line, NEEDLE_TEMPLATE.format(type_needle_v=TASK.type_needle_v, key=key, value=value))
    prompt = prompt_template(TASK).format(context="\n".join(lines), query=key)
    return f"{prompt} {value}."


def evaluation_exclusions(tokenizer, lengths: list[int], num_samples: int, seed: int, num_depths: int,
                          tokens_to_generate: int) -> Exclusions:
    """The keys and values of the SK1 samples `hyla eval niah` will build for these settings."""
    exclusions = Exclusions()
    for length in lengths:
        samples = build_samples(tokenizer, TASK.name, length, num_samples, seed, num_depths=num_depths,
                                tokens_to_generate=tokens_to_generate)
        for sample in samples:
            match = _QUERY.search(sample.input)
            if match is None:
                raise ValueError(f"cannot find the query key in an SK1 sample of length {length}")
            exclusions.keys.add(match.group(1))
            exclusions.values.update(sample.outputs)
            exclusions.num_samples += 1
    return exclusions


class NeedleDraws:
    """Random keys (RULER's adjective-noun words) and values (7-digit numbers), never an excluded one."""

    def __init__(self, seed: str, exclusions: Exclusions):
        self.rng = random.Random(seed)
        self.exclusions = exclusions
        self.adjectives, self.nouns = adjective_noun_lists()

    def key(self) -> str:
        while True:
            key = f"{self.rng.choice(self.adjectives)}-{self.rng.choice(self.nouns)}"
            if key not in self.exclusions.keys:
                return key

    def value(self) -> str:
        while True:
            value = str(self.rng.randint(10**6, 10**7 - 1))
            if value not in self.exclusions.values:
                return value


class RetrievalDocGenerator:
    """Documents of `min_tokens`..`max_tokens` tokens (uniform), the needle at a uniform line of the haystack.
    `min_tokens` None: the smallest document with two haystack lines."""

    def __init__(self, tokenizer, *, max_tokens: int, seed: int, exclusions: Exclusions,
                 min_tokens: int | None = None):
        self.tokenizer = tokenizer
        self.draws = NeedleDraws(f"family-lh/train-sk1/{seed}", exclusions)
        self.rng = self.draws.rng
        self.line_tokens = count_tokens(tokenizer, REPEAT_HAYSTACK_LINE + "\n")
        # The document without haystack lines, for a typical key: the size of the fixed part.
        self.base_tokens = count_tokens(tokenizer, render_doc("plain-hat", "1234567", 0, 0))
        smallest = self.base_tokens + 2 * self.line_tokens
        min_tokens = smallest if min_tokens is None else min_tokens
        if min_tokens < smallest or max_tokens < min_tokens:
            raise ValueError(f"document sizes {min_tokens}..{max_tokens} tokens: need {smallest} <= min <= max")
        self.min_tokens, self.max_tokens = min_tokens, max_tokens

    def draw(self) -> RetrievalDoc:
        key, value = self.draws.key(), self.draws.value()
        target = self.rng.randint(self.min_tokens, self.max_tokens)
        num_lines = max(1, (target - self.base_tokens) // self.line_tokens)
        needle_line = self.rng.randint(0, num_lines)
        return RetrievalDoc(render_doc(key, value, num_lines, needle_line), key, value, num_lines, needle_line)

    def draw_tokenized(self, count: int) -> list[tuple[RetrievalDoc, list[int]]]:
        """`count` documents with their token ids (no special tokens), each at most `max_tokens` long."""
        docs = [self.draw() for _ in range(count)]
        if not docs:
            return []
        ids = self.tokenizer([doc.text for doc in docs], add_special_tokens=False)["input_ids"]
        for index, doc in enumerate(docs):
            # Keys tokenize to a few tokens more or less than the typical one: drop whole lines to fit.
            while len(ids[index]) > self.max_tokens:
                excess = len(ids[index]) - self.max_tokens
                num_lines = max(0, doc.num_lines - -(-excess // self.line_tokens))
                doc = RetrievalDoc(render_doc(doc.key, doc.value, num_lines, min(doc.needle_line, num_lines)),
                                   doc.key, doc.value, num_lines, min(doc.needle_line, num_lines))
                ids[index] = self.tokenizer(doc.text, add_special_tokens=False)["input_ids"]
            docs[index] = doc
        return list(zip(docs, ids))


class CopyDocGenerator:
    """Copy documents: a random list of RULER key words and 7-digit numbers, then the same list again.

    Every token of the repetition can be predicted only by finding its earlier copy: the in-context copying that
    SK1 retrieval needs, which small models form only after many tokens of ordinary text. The lists never contain
    an evaluation key or value."""

    def __init__(self, tokenizer, *, seed: int, exclusions: Exclusions, min_items: int = 8, max_items: int = 40):
        self.tokenizer = tokenizer
        self.draws = NeedleDraws(f"family-lh/train-copy/{seed}", exclusions)
        self.min_items, self.max_items = min_items, max_items

    def draw_text(self) -> str:
        rng = self.draws.rng
        count = rng.randint(self.min_items, self.max_items)
        items = ", ".join(self.draws.key() if rng.random() < 0.5 else self.draws.value() for _ in range(count))
        return f"List: {items}.\nThe same list again: {items}."

    def draw_tokenized(self, count: int) -> list[list[int]]:
        return self.tokenizer([self.draw_text() for _ in range(count)], add_special_tokens=False)["input_ids"]
