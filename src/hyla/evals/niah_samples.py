"""RULER's eight needle-in-a-haystack tasks: definitions, prompt templates and sample generation.

The reference is RULER's own generator, `long_context_eval/data/synthetic/niah.py` with `synthetic.yaml` and
`data/synthetic/constants.py` in `nvidia-long-context-eval==26.3`. What differs, and why:
- the needle depth is chosen per sample from an evenly spaced grid (RULER draws it at random from 40 evenly spaced
  percentages) so that accuracy can be reported per depth; the other needles of a sample take random grid depths;
- sentences are split by a regex (RULER's nltk splitter needs data that cannot be downloaded offline);
- the haystack size is found by interpolation search on the token count rather than RULER's fixed increments, so
  prompts land closer to the target length.
A diagnostic outside RULER: `haystack_offset` starts the essays that many words later (they wrap around), the same
needles at the same depths with other text around them: whether misses follow the text or the position.
As in RULER, a sample's `length` counts the prompt tokens plus the generation budget (`tokens_to_generate`).
"""

from __future__ import annotations

import random
import uuid
from dataclasses import asdict, dataclass, field, replace

import numpy as np

from hyla.evals.haystack import adjective_noun_lists, essay_word_prefix, fit_num_units, split_sentences
from hyla.evals.tokens import PromptIds, plain_backend, prompt_tokens

NEEDLE_TEMPLATE = "One of the special magic {type_needle_v} for {key} is: {value}."
REPEAT_HAYSTACK_LINE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
TASK_TEMPLATE = (
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {type_needle_v} afterwards.\n{context}\n"
    "What are all the special magic {type_needle_v} for {query} mentioned in the provided text?"
)
ANSWER_PREFIX = " The special magic {type_needle_v} for {query} mentioned in the provided text are"
# RULER's needle depths for essay haystacks: 40 evenly spaced percentages.
RULER_DEPTH_GRID = tuple(int(depth) for depth in np.round(np.linspace(0, 100, num=40, endpoint=True)))
RULER_TOKENS_TO_GENERATE = 128

# Rough tokens per haystack unit (an essay word, a repeated line, a distractor needle) to seed the size search.
_TOKENS_PER_UNIT = {"essay": 1.3, "repeat": 22.0, "needle": 30.0}
# How far below the target length a sample may land before another random draw is tried, and how many draws.
_LENGTH_TOLERANCE = 0.01
_MAX_DRAWS = 8


@dataclass(frozen=True)
class NiahTask:
    """One RULER NIAH configuration (the `args` of an entry of RULER's `synthetic.yaml`)."""

    name: str
    ruler_name: str
    type_haystack: str
    type_needle_k: str
    type_needle_v: str
    num_needle_k: int = 1
    num_needle_v: int = 1
    num_needle_q: int = 1


TASKS: dict[str, NiahTask] = {
    task.name: task
    for task in (
        NiahTask("SK1", "niah_single_1", "repeat", "words", "numbers"),
        NiahTask("SK2", "niah_single_2", "essay", "words", "numbers"),
        NiahTask("SK3", "niah_single_3", "essay", "words", "uuids"),
        NiahTask("MK1", "niah_multikey_1", "essay", "words", "numbers", num_needle_k=4),
        NiahTask("MK2", "niah_multikey_2", "needle", "words", "numbers"),
        NiahTask("MK3", "niah_multikey_3", "needle", "uuids", "uuids"),
        NiahTask("MV", "niah_multivalue", "essay", "words", "numbers", num_needle_v=4),
        # RULER raises num_needle_k to num_needle_q: four keys, all asked.
        NiahTask("MQ", "niah_multiquery", "essay", "words", "numbers", num_needle_k=4, num_needle_q=4),
    )
}
TASK_BY_RULER_NAME = {task.ruler_name: task for task in TASKS.values()}


@dataclass
class NiahSample:
    """One prompt with its gold values. `depth_percent` is where the first gold needle sits in the haystack.
    prompt_ids: the prompt's token ids, kept from sizing it where the tokenizer encodes through its plain backend
    (`hyla.evals.tokens`), for the evaluation with that tokenizer not to encode it again; None: not kept."""

    task: str
    target_length: int
    depth_percent: int
    index: int
    input: str
    outputs: list[str]
    num_prompt_tokens: int
    tokens_to_generate: int
    prompt_ids: PromptIds | None = field(default=None, repr=False, compare=False)

    @property
    def length(self) -> int:
        """RULER's `length`: prompt tokens plus the generation budget."""
        return self.num_prompt_tokens + self.tokens_to_generate

    def ruler_record(self) -> dict:
        """The sample as a line of a RULER data file (`index`, `input`, `outputs`, `length`), plus our metadata."""
        return {
            "index": self.index,
            "input": self.input,
            "outputs": self.outputs,
            "length": self.length,
            "others": {"task": self.task, "target_length": self.target_length, "depth_percent": self.depth_percent},
        }

    def to_dict(self) -> dict:
        """The sample's fields but its token ids."""
        data = asdict(replace(self, prompt_ids=None))
        del data["prompt_ids"]
        return data


def get_task(name: str) -> NiahTask:
    """A task by our short name (SK1…MQ) or RULER's name (niah_single_1…)."""
    task = TASKS.get(name.upper()) or TASK_BY_RULER_NAME.get(name)
    if task is None:
        raise ValueError(f"unknown NIAH task {name!r}; choose from {', '.join(TASKS)}")
    return task


def prompt_template(task: NiahTask) -> str:
    """Task template plus answer prefix, singularized as RULER does when exactly one value is asked for."""
    template = TASK_TEMPLATE + ANSWER_PREFIX
    type_needle_v = task.type_needle_v
    if task.num_needle_q * task.num_needle_v == 1:
        # RULER's exact replacements, in its order.
        for plural, singular in (("Some", "A"), ("are all", "is"), ("are", "is"), ("answers", "answer")):
            template = template.replace(plural, singular)
        type_needle_v = type_needle_v[:-1]
    return template.replace("{type_needle_v}", type_needle_v)


def depth_grid(num_depths: int) -> list[int]:
    """`num_depths` needle depths (percent of the haystack) spread evenly from 0 to 100."""
    if num_depths < 1:
        raise ValueError(f"num_depths must be at least 1, got {num_depths}")
    return [int(depth) for depth in np.round(np.linspace(0, 100, num=num_depths, endpoint=True))]


def _random_value(kind: str, rng: random.Random) -> str:
    if kind == "numbers":
        return str(rng.randint(10**6, 10**7 - 1))
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    if kind == "words":
        adjectives, nouns = adjective_noun_lists()
        return f"{rng.choice(adjectives)}-{rng.choice(nouns)}"
    raise ValueError(f"unknown needle type {kind!r}")


def _needle(task: NiahTask, key: str, value: str) -> str:
    return NEEDLE_TEMPLATE.format(type_needle_v=task.type_needle_v, key=key, value=value)


@dataclass
class _NeedleDraw:
    needles: list[str]  # the gold-first order: gold needles of the asked keys, then the others
    query: str
    answers: list[str]


def _draw_needles(task: NiahTask, rng: random.Random) -> _NeedleDraw:
    keys = [_random_value(task.type_needle_k, rng) for _ in range(task.num_needle_k)]
    values = [[_random_value(task.type_needle_v, rng) for _ in range(task.num_needle_v)] for _ in keys]
    asked = rng.sample(range(task.num_needle_k), task.num_needle_q)
    gold = [_needle(task, keys[i], value) for i in asked for value in values[i]]
    others = [_needle(task, keys[i], value) for i in range(len(keys)) if i not in asked for value in values[i]]
    # The first gold needle goes to the chosen depth; the order of the rest is random, as in RULER's shuffle.
    rest = gold[1:] + others
    rng.shuffle(rest)
    queries = [keys[i] for i in asked]
    query = ", ".join(queries[:-1]) + ", and " + queries[-1] if len(queries) > 1 else queries[0]
    return _NeedleDraw([gold[0], *rest], query, [value for i in asked for value in values[i]])


def _essay_context(needles: list[str], depths: list[int], num_words: int, offset: int = 0) -> str:
    sentences = split_sentences(essay_word_prefix(num_words, offset))
    positions = [int(len(sentences) * depth / 100) for depth in depths]
    pieces, start = [], 0
    for position, needle in sorted(zip(positions, needles), key=lambda pair: pair[0]):
        pieces.append(" ".join(sentences[start:position]))
        pieces.append(needle)
        start = position
    pieces.append(" ".join(sentences[start:]))
    return " ".join(piece for piece in pieces if piece)


def _line_context(task: NiahTask, needles: list[str], depth: int, num_lines: int, rng: random.Random) -> str:
    if task.type_haystack == "repeat":
        lines = [REPEAT_HAYSTACK_LINE] * num_lines
    else:
        lines = [
            _needle(task, _random_value(task.type_needle_k, rng), _random_value(task.type_needle_v, rng))
            for _ in range(num_lines)
        ]
    positions = [round(num_lines * depth / 100)] + [rng.randint(0, num_lines) for _ in needles[1:]]
    # Insert from the back so that earlier positions stay valid.
    for position, needle in sorted(zip(positions, needles), key=lambda pair: pair[0], reverse=True):
        lines.insert(position, needle)
    return "\n".join(lines)


def render_prompt(task: NiahTask, depth: int, num_units: int, sample_seed: str,
                  haystack_offset: int = 0) -> tuple[str, list[str]]:
    """The prompt with `num_units` haystack units (essay words or lines) and its gold values; deterministic.
    haystack_offset: essay haystacks start that many words into the essays (other haystacks ignore it)."""
    rng = random.Random(sample_seed)
    draw = _draw_needles(task, rng)
    if task.type_haystack == "essay":
        other_depths = rng.sample([d for d in RULER_DEPTH_GRID if d != depth], len(draw.needles) - 1)
        context = _essay_context(draw.needles, [depth, *other_depths], num_units, haystack_offset)
    else:
        context = _line_context(task, draw.needles, depth, num_units, rng)
    return prompt_template(task).format(context=context, query=draw.query), draw.answers


def build_sample(
    tokenizer, task: NiahTask, length: int, depth: int, index: int, seed: int, tokens_to_generate: int,
    guess: list[int] | None = None, haystack_offset: int = 0,
) -> NiahSample:
    """One sample whose prompt plus `tokens_to_generate` is as close to `length` tokens as fits.

    A haystack of whole lines (MK2, MK3) can only grow by one line, ~57 tokens for uuid needles (2.8% of 2K); when
    the fitted prompt falls short by more than `_LENGTH_TOLERANCE`, fresh random draws are tried and the closest
    kept. Only token counts of random keys and values differ between draws, so the task stays the same.
    guess: a one-element list holding the haystack size the previous sample of this task and length fitted (None
    or empty: none), updated with this sample's; it only shortens the search (`fit_num_units`).
    """
    max_prompt_tokens = length - tokens_to_generate
    backend = plain_backend(tokenizer)
    best: tuple[int, str, list[str], object] | None = None
    for attempt in range(_MAX_DRAWS):
        sample_seed = f"{seed}/{task.name}/{length}/{index}" + (f"/{attempt}" if attempt else "")
        # haystack size -> (prompt tokens, the backend's encoding): the chosen size is not tokenized twice
        counts: dict[int, tuple[int, object]] = {}

        def num_tokens_for(n: int) -> int:
            if n not in counts:
                counts[n] = prompt_tokens(tokenizer, render_prompt(task, depth, n, sample_seed, haystack_offset)[0],
                                          backend)
            return counts[n][0]

        num_units = fit_num_units(
            num_tokens_for,
            max_tokens=max_prompt_tokens,
            tokens_per_unit=_TOKENS_PER_UNIT[task.type_haystack],
            guess=guess[0] if guess else None,
        )
        if guess is not None:
            guess[:] = [num_units]
        prompt, answers = render_prompt(task, depth, num_units, sample_seed, haystack_offset)
        num_prompt_tokens = num_tokens_for(num_units)
        if best is None or num_prompt_tokens > best[0]:
            best = (num_prompt_tokens, prompt, answers, counts[num_units][1])
        if num_prompt_tokens + tokens_to_generate >= (1 - _LENGTH_TOLERANCE) * length:
            break
    num_prompt_tokens, prompt, answers, encoding = best
    return NiahSample(
        task=task.name,
        target_length=length,
        depth_percent=depth,
        index=index,
        input=prompt,
        outputs=answers,
        num_prompt_tokens=num_prompt_tokens,
        tokens_to_generate=tokens_to_generate,
        prompt_ids=None if encoding is None else PromptIds.from_encoding(tokenizer, backend, encoding),
    )


def build_samples(
    tokenizer,
    task: str,
    length: int,
    num_samples: int,
    seed: int = 42,
    *,
    num_depths: int = 11,
    tokens_to_generate: int = RULER_TOKENS_TO_GENERATE,
    haystack_offset: int = 0,
) -> list[NiahSample]:
    """`num_samples` prompts of `task` sized to `length` tokens of `tokenizer`, cycling over `num_depths` depths.

    The haystack is sized so that prompt tokens + `tokens_to_generate` ≤ `length` (RULER's definition of length).
    haystack_offset: essay haystacks start that many words later (a diagnostic; 0 is RULER's).
    """
    if haystack_offset < 0:
        raise ValueError(f"haystack_offset must be >= 0 words, got {haystack_offset}")
    niah_task = get_task(task)
    if length <= tokens_to_generate:
        raise ValueError(f"length {length} must exceed the generation budget {tokens_to_generate}")
    depths = depth_grid(num_depths)
    guess: list[int] = []  # each sample's search starts from the previous sample's haystack size
    return [
        build_sample(tokenizer, niah_task, length, depths[index % len(depths)], index, seed, tokens_to_generate,
                     guess, haystack_offset)
        for index in range(num_samples)
    ]
