"""Recall documents for choosing `a`: the loss on the answer tokens of long-range synthetic recall documents, a second
criterion of the scaling stage (`scaling.criterion=recall`) beside the held-out document loss.

Why: the document loss is dominated by local prediction and barely measures long-range retrieval. In four sittings
in a row it chose a = 10000 while RULER NIAH at 32K-64K retrieved better under a = 5000 (on 25-sample cells, SK2
right only under 5000 on 8 prompts, only under 10000 on 1: docs/log/2026-12-03-smollm2-135m-halo-sitting-g.md).
Choosing on RULER would tune on the test set; these documents are `hyla.data.recall`'s own (made-up keys, its own
fact and question wordings, its own values, never RULER's templates, keys or haystacks), so the choice measures
retrieval without seeing the evaluation's prompts.

Where the text comes from: `scaling.recall_source`, a `recall[-repeat][-lead][-long]:SPEC` source spec, SPEC read
by the text-source machinery the data stage uses (`hyla.data.sources`: offline texts in `$HYLA_TEXT_DIR`, folders,
`docs@A-B:`...), e.g. `recall-lead-long:docs@26-30:aa-lcr` on the held-out AA-LCR bundles. The documents are built
here, in the scaling stage, rather than prepared by the data stage: each is sized in the teacher's tokens to a
target length, and scoring needs the token positions of the asked value, which a prepared corpus does not keep.
Building them takes a few tokenizer passes per document, no model.

A document: `make_document` on consecutive text of the source (or, for `-repeat`, one passage repeated), its haystack
cut (at a space or line break) so that the whole document is (1 - SIZE_SLACK) x L to L tokens for each L of
`scaling.recall_lengths`; each document draws its facts from a random generator seeded by its index, so the same
source and tokenizer give the same documents, and every candidate is scored on them. Tokens are the tokenizer's
without special tokens, as a prepared corpus holds them. The answer tokens are those whose characters (the fast
tokenizer's offset mapping) overlap the asked value in the final answer; a token that also holds the space before the
value or the period after it is one of them. Scores, teacher-forced (one forward pass per document and candidate, no
generation): the mean cross-entropy over a document's answer tokens, averaged over documents (each document one
retrieval whatever its value's token count); the share of answer tokens whose greedy prediction is right; the share of
documents whose every answer token is (an exact copy under teacher forcing).
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch

from hyla.data.recall import REPEAT_CHARS, _passage, make_document, parse_recall_spec

RECALL_SEED = 0
# A document is accepted at (1 - SIZE_SLACK) x L to L tokens.
SIZE_SLACK = 0.05
MAX_SIZING_TRIES = 8
# Characters per token of a first haystack guess (English under a ~50K BPE); later tries use the measured ratio.
FIRST_CHARS_PER_TOKEN = 4


@dataclass
class RecallSequence:
    ids: torch.Tensor  # [T] token ids of the whole document
    answer: slice  # positions in `ids` of the asked value's tokens
    length: int  # the target length L it was sized to
    value: str


def answer_token_span(tokenizer, text: str, start: int, stop: int) -> tuple[list[int], slice]:
    """The token ids of `text` (no special tokens) and the positions of the tokens overlapping its characters
    [start, stop). ValueError for a slow tokenizer (no offset mapping) or offsets that do not cover the span."""
    if not getattr(tokenizer, "is_fast", False):
        raise ValueError("scaling.recall_source needs a fast tokenizer (its offset mapping finds the answer's tokens)")
    encoding = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = encoding["input_ids"], encoding["offset_mapping"]
    inside = [i for i, (low, high) in enumerate(offsets) if low < stop and high > start]
    if not inside or inside != list(range(inside[0], inside[-1] + 1)) or offsets[inside[0]][0] > start or \
            offsets[inside[-1]][1] < stop:
        raise ValueError(f"the tokenizer's offsets do not cover characters {start}-{stop} of a recall document "
                         f"with consecutive tokens")
    return ids, slice(inside[0], inside[-1] + 1)


def tokenized_document(tokenizer, text: str, value: str, length: int) -> RecallSequence:
    """`text`, which ends with the answer `value` and a period, as a RecallSequence."""
    if not text.endswith(value + "."):
        raise ValueError(f"a recall document does not end with its answer {value!r}")
    start = len(text) - len(value) - 1
    ids, answer = answer_token_span(tokenizer, text, start, start + len(value))
    return RecallSequence(torch.tensor(ids, dtype=torch.long), answer, length, value)


class _Text:
    """Consecutive text of a source's documents (joined by line breaks), read as needed."""

    def __init__(self, documents):
        self.documents, self.pending, self.exhausted = documents, "", False

    def peek(self, chars: int) -> str:
        while len(self.pending) < chars and not self.exhausted:
            text = next(self.documents, None)
            if text is None:
                self.exhausted = True
            elif text.strip():
                self.pending += text if not self.pending else "\n" + text
        return self.pending

    def take(self, chars: int) -> None:
        self.pending = self.pending[chars:].lstrip()


def _haystack(text: _Text, chars: int, passage: str | None) -> tuple[str, int]:
    """About `chars` characters of haystack and how many characters of `text` it uses: `passage` repeated one per line,
    or the next text; either cut back to its last space or line break (not to a line break, as
    `hyla.data.recall.recall_documents` cuts: a line can be longer than the size's tolerance)."""
    if passage is not None:
        repeated = "\n".join([passage] * (chars // (len(passage) + 1) + 1))
        return repeated[:_cut(repeated, chars)].strip() or passage, 0
    pending = text.peek(chars)
    cut = _cut(pending, chars)
    return pending[:cut].strip(), cut


def _cut(text: str, chars: int) -> int:
    """Where `text` ends when cut to about `chars` characters: its end, or its last space or line break before
    `chars` (if past half of it)."""
    if len(text) <= chars:
        return len(text)
    cut = max(text.rfind(" ", 0, chars), text.rfind("\n", 0, chars))
    return cut if cut > chars // 2 else chars


def _sized_document(tokenizer, text: _Text, length: int, index: int, recall) -> RecallSequence | None:
    """A document of (1 - SIZE_SLACK) x `length` to `length` tokens on the next text, or None when the text ran out
    first (ValueError when even a short haystack does not fit). Every try draws the same facts (the generator is
    seeded by `index`); only the haystack's size changes. With `-words` keys the facts change with the size too
    (the keys are drawn from the haystack's words); the tries stay bounded."""
    passage = None
    if recall.repeat:
        need = random.Random(f"hyla-scaling-recall-passage-{index}").randint(*REPEAT_CHARS)
        passage, used = _passage(text.peek(2 * need), need)
        text.take(used)
        if not passage:
            return None
    chars, best, best_used, shortest = FIRST_CHARS_PER_TOKEN * length, None, 0, None
    target = int(length * (1 - SIZE_SLACK / 2))
    for _ in range(MAX_SIZING_TRIES):
        haystack, used = _haystack(text, chars, passage)
        if not haystack.strip():
            return None
        doc = make_document(haystack, random.Random(f"hyla-scaling-recall-{RECALL_SEED}-{index}"),
                            long_values=recall.long_values, lead=recall.lead, word_keys=recall.word_keys)
        sequence = tokenized_document(tokenizer, doc.text, doc.values[doc.asked], length)
        count = len(sequence.ids)
        shortest = count if shortest is None else min(shortest, count)
        if count <= length and (best is None or count > len(best.ids)):
            best, best_used = sequence, used
        if (1 - SIZE_SLACK) * length <= count <= length:
            break
        if count < length and passage is None and text.exhausted and chars >= len(text.pending):
            break  # no more text to grow the haystack with
        # the haystack's characters per token, measured; the facts and question are a fixed part of `count`
        chars = max(1, len(haystack) + int((target - count) * len(doc.text) / count))
    if best is None:
        raise ValueError(f"scaling.recall_lengths: no recall document fits in {length} tokens (the shortest made had "
                         f"{shortest}); use longer lengths")
    if len(best.ids) < (1 - SIZE_SLACK) * length and passage is None and text.exhausted:
        return None
    text.take(best_used)
    return best


def recall_sequences(tokenizer, spec: str, *, lengths: list[int], num_docs: int) -> list[RecallSequence]:
    """`num_docs` recall documents of each length in `lengths` (tokens), on the text of the recall source `spec`
    (`recall[-repeat][-lead][-long]:SPEC`), in that order. ValueError when the source's text runs out."""
    from hyla.data.sources import open_source

    recall = parse_recall_spec(spec)
    text = _Text(open_source(recall.inner, seed=RECALL_SEED).documents())
    sequences = []
    for length in lengths:
        for _ in range(num_docs):
            sequence = _sized_document(tokenizer, text, length, len(sequences), recall)
            if sequence is None:
                raise ValueError(f"scaling.recall_source {spec}: the text ran out after {len(sequences)} documents "
                                 f"(wanted {num_docs} of each of {lengths} tokens); lower scaling.recall_docs or "
                                 f"use a larger source")
            sequences.append(sequence)
    return sequences


def answer_scores(sequences: list[RecallSequence], scores: list[tuple[torch.Tensor, torch.Tensor]]) -> dict:
    """The answer scores of `sequences` from their per-token (losses, greedy hits) (`position_scores`): overall and
    per target length, {"loss", "token_accuracy", "exact", "num_docs"}."""
    per_document = []
    for sequence, (losses, hits) in zip(sequences, scores, strict=True):
        # the loss at position t is that of predicting token t + 1
        at = slice(sequence.answer.start - 1, sequence.answer.stop - 1)
        per_document.append((sequence.length, losses[at].mean().item(), hits[at].sum().item(),
                             hits[at].numel(), bool(hits[at].all())))
    lengths = sorted({length for length, *_ in per_document})
    return {**_summary(per_document),
            "by_length": {str(length): _summary([d for d in per_document if d[0] == length]) for length in lengths}}


def _summary(documents: list[tuple]) -> dict:
    return {"loss": sum(d[1] for d in documents) / len(documents),
            "token_accuracy": sum(d[2] for d in documents) / sum(d[3] for d in documents),
            "exact": sum(d[4] for d in documents) / len(documents), "num_docs": len(documents)}
