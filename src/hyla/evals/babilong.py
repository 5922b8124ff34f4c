"""BABILong-style reasoning in a haystack: bAbI qa1–qa5 facts scattered through long background text.

Facts come from templates (the bAbI vocabulary: four people, six rooms, three objects), keep their order, and are
inserted at random sentence boundaries of RULER's essay text sized with the model's tokenizer so that the whole
prompt has at most `length` tokens (length 0: the facts alone). Scoring follows BABILong's `compare_answers`: the
first line of the output, without the words of the question, must contain the gold label and no other label of
the task.
"""

from __future__ import annotations

import random
import re
from collections import defaultdict
from dataclasses import asdict, dataclass
from typing import Any

from hyla.evals.generation import Generation, as_generation, generate_greedy
from hyla.evals.haystack import count_tokens, essay_word_prefix, fit_num_units, load_essay_words, split_sentences
from hyla.progress import progress

BABILONG_MAX_NEW_TOKENS = 16
PEOPLE = ("Mary", "John", "Daniel", "Sandra")
LOCATIONS = ("bathroom", "bedroom", "garden", "hallway", "kitchen", "office")
OBJECTS = ("apple", "football", "milk")
GIVERS = ("Mary", "Jeff", "Fred", "Bill")
MOVE_VERBS = ("moved to", "went to", "journeyed to", "travelled to", "went back to")
TAKE_VERBS = ("picked up", "got", "grabbed", "took")
OPPOSITE_DIRECTION = {"north": "south", "south": "north", "east": "west", "west": "east"}

INSTRUCTIONS = {
    "qa1": "The text hides facts about where people went. Answer with the person's latest location, one word.",
    "qa2": (
        "The text hides facts about people moving and carrying objects. Answer with the object's location, one word."
    ),
    "qa3": "The text hides facts about people moving and carrying objects. Answer with a location, one word.",
    "qa4": "The text hides facts about how rooms are placed. Answer with one word.",
    "qa5": "The text hides facts about people giving objects to each other. Answer with one word.",
}
PROMPT_TEMPLATE = "{instruction}\n\n<context>\n{context}\n</context>\n\nQuestion: {question}\nAnswer:"
TASK_LABELS = {
    "qa1": LOCATIONS,
    "qa2": LOCATIONS,
    "qa3": LOCATIONS,
    "qa4": LOCATIONS,
    "qa5": tuple(name.lower() for name in GIVERS) + OBJECTS,
}


@dataclass
class BabilongSample:
    task: str
    target_length: int
    index: int
    input: str
    facts: list[str]
    question: str
    answer: str
    num_prompt_tokens: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _move(rng: random.Random, person: str, location: str) -> str:
    return f"{person} {rng.choice(MOVE_VERBS)} the {location}."


def _distractor_moves(rng: random.Random, people: list[str], count: int) -> list[str]:
    return [_move(rng, rng.choice(people), rng.choice(LOCATIONS)) for _ in range(count)]


def _interleave(rng: random.Random, story: list[str], distractors: list[str]) -> list[str]:
    """Insert distractor facts at random places; the story keeps its order."""
    merged = list(story)
    for fact in distractors:
        merged.insert(rng.randint(0, len(merged)), fact)
    return merged


def _qa1(rng: random.Random) -> tuple[list[str], str, str]:
    person, *others = rng.sample(PEOPLE, len(PEOPLE))
    path = [rng.choice(LOCATIONS) for _ in range(rng.randint(1, 3))]
    facts = _interleave(rng, [_move(rng, person, place) for place in path], _distractor_moves(rng, others, 4))
    return facts, f"Where is {person}?", path[-1]


def _qa2(rng: random.Random) -> tuple[list[str], str, str]:
    person, *others = rng.sample(PEOPLE, len(PEOPLE))
    item = rng.choice(OBJECTS)
    first, last = rng.sample(LOCATIONS, 2)
    take = f"{person} {rng.choice(TAKE_VERBS)} the {item} there."
    story = [_move(rng, person, first), take, _move(rng, person, last)]
    return _interleave(rng, story, _distractor_moves(rng, others, 4)), f"Where is the {item}?", last


def _qa3(rng: random.Random) -> tuple[list[str], str, str]:
    person, *others = rng.sample(PEOPLE, len(PEOPLE))
    item = rng.choice(OBJECTS)
    first, second, third = rng.sample(LOCATIONS, 3)
    story = [
        _move(rng, person, first),
        f"{person} {rng.choice(TAKE_VERBS)} the {item} there.",
        _move(rng, person, second),
        _move(rng, person, third),
    ]
    facts = _interleave(rng, story, _distractor_moves(rng, others, 3))
    return facts, f"Where was the {item} before the {third}?", second


def _qa4(rng: random.Random) -> tuple[list[str], str, str]:
    first, second, third = rng.sample(LOCATIONS, 3)
    direction, other_direction = rng.sample(list(OPPOSITE_DIRECTION), 2)
    facts = [f"The {first} is {direction} of the {second}.", f"The {third} is {other_direction} of the {first}."]
    rng.shuffle(facts)
    if rng.random() < 0.5:
        return facts, f"What is {direction} of the {second}?", first
    return facts, f"What is the {second} {OPPOSITE_DIRECTION[direction]} of?", first


def _qa5(rng: random.Random) -> tuple[list[str], str, str]:
    items = rng.sample(OBJECTS, len(OBJECTS))
    gives = [tuple(rng.sample(GIVERS, 2)) for _ in items]
    facts = [f"{giver} gave the {item} to {receiver}." for (giver, receiver), item in zip(gives, items)]
    (giver, receiver), item = gives[0], items[0]
    question, answer = rng.choice(
        [
            (f"Who gave the {item}?", giver.lower()),
            (f"Who received the {item}?", receiver.lower()),
            (f"What did {giver} give to {receiver}?", item),
        ]
    )
    if answer == item and sum(pair == (giver, receiver) for pair in gives) > 1:
        # Two gifts between the same pair would make "what did X give to Y" ambiguous.
        question, answer = f"Who received the {item}?", receiver.lower()
    return _interleave(rng, facts, []), question, answer


_STORY_GENERATORS = {"qa1": _qa1, "qa2": _qa2, "qa3": _qa3, "qa4": _qa4, "qa5": _qa5}


def _context(facts: list[str], num_words: int, rng: random.Random) -> str:
    sentences = split_sentences(essay_word_prefix(num_words, offset=rng.randrange(len(load_essay_words()))))
    # The background starts and ends mid-sentence (a random word offset, a word budget): facts go between the
    # fragments, so that no fact is glued to a broken sentence.
    first, last = (1, len(sentences) - 1) if len(sentences) >= 2 else (0, len(sentences))
    positions = sorted(rng.randint(first, last) for _ in facts)
    pieces, start = [], 0
    for position, fact in zip(positions, facts):
        pieces += sentences[start:position] + [fact]
        start = position
    return " ".join(pieces + sentences[start:])


def render_babilong_prompt(task: str, num_words: int, sample_seed: str) -> tuple[str, list[str], str, str]:
    """(prompt, facts, question, answer) with `num_words` words of background; deterministic in `sample_seed`."""
    rng = random.Random(sample_seed)
    facts, question, answer = _STORY_GENERATORS[task](rng)
    context = _context(facts, num_words, rng) if num_words else " ".join(facts)
    prompt = PROMPT_TEMPLATE.format(instruction=INSTRUCTIONS[task], context=context, question=question)
    return prompt, facts, question, answer


def build_babilong_samples(tokenizer, task: str, length: int, num_samples: int, seed: int = 42) -> list[BabilongSample]:
    """`num_samples` prompts of `task` (qa1…qa5) with at most `length` tokens (0: facts without background)."""
    if task not in _STORY_GENERATORS:
        raise ValueError(f"unknown BABILong task {task!r}; choose from {', '.join(_STORY_GENERATORS)}")
    samples = []
    for index in range(num_samples):
        sample_seed = f"{seed}/{task}/{length}/{index}"
        num_words = 0
        if length > 0:
            num_words = fit_num_units(
                lambda n: count_tokens(tokenizer, render_babilong_prompt(task, n, sample_seed)[0]),
                max_tokens=length,
                tokens_per_unit=1.3,
            )
        prompt, facts, question, answer = render_babilong_prompt(task, num_words, sample_seed)
        samples.append(
            BabilongSample(task, length, index, prompt, facts, question, answer, count_tokens(tokenizer, prompt))
        )
    return samples


def _words(text: str) -> list[str]:
    return re.findall(r"[a-z]+", text.lower())


def score_babilong(prediction: str, answer: str, question: str, labels: tuple[str, ...]) -> float:
    """1.0 when the output's first line (question words removed) names the gold label and no other label."""
    first_line = prediction.strip().split("\n")[0]
    question_words = set(_words(question))
    output_words = {word for word in _words(first_line) if word not in question_words}
    named = output_words & set(labels)
    return float(answer in named and len(named) == 1)


def evaluate_babilong(
    model,
    tokenizer,
    tasks: list[str] | tuple[str, ...] = tuple(_STORY_GENERATORS),
    lengths: list[int] | tuple[int, ...] = (0, 1024, 4096),
    num_samples: int = 20,
    batch_size: int = 1,
    *,
    max_new_tokens: int = BABILONG_MAX_NEW_TOKENS,
    seed: int = 42,
    generation: str | Generation | None = None,
) -> dict[str, Any]:
    """Accuracy per task and length; returns `{"summary", "tasks", "records", "generation"}` (`generation`: the
    path ("auto", "engine", "hf") or a Generation; the result's: the path taken and its time)."""
    records = []
    generation = as_generation(model, generation)
    for task, length in progress([(t, n) for t in tasks for n in lengths], desc="babilong", unit="task×length"):
        samples = build_babilong_samples(tokenizer, task, length, num_samples, seed)
        predictions = generate_greedy(
            model, tokenizer, [s.input for s in samples], max_new_tokens=max_new_tokens, batch_size=batch_size,
            generation=generation,
        )
        for sample, prediction in zip(samples, predictions):
            score = score_babilong(prediction, sample.answer, sample.question, TASK_LABELS[task])
            records.append({"task": task, "length": length, "index": sample.index, "question": sample.question,
                            "answer": sample.answer, "pred": prediction, "score": score})
    return {**_aggregate(records), "records": records, "generation": generation.describe()}


def _aggregate(records: list[dict[str, Any]]) -> dict[str, Any]:
    cells: dict[tuple[str, int], list[float]] = defaultdict(list)
    for record in records:
        cells[(record["task"], record["length"])].append(record["score"])
    tasks: dict[str, dict[int, float]] = defaultdict(dict)
    for (task, length), scores in cells.items():
        tasks[task][length] = sum(scores) / len(scores)
    summary = {"accuracy": sum(r["score"] for r in records) / len(records)}
    for task, by_length in tasks.items():
        summary.update({f"{task}/{length}": value for length, value in by_length.items()})
    return {"summary": summary, "tasks": {task: {"by_length": by_length} for task, by_length in tasks.items()}}


def plot_babilong(tasks: dict[str, Any], path) -> None:
    """Heatmap of accuracy: task (rows) × length (columns)."""
    import numpy as np

    from hyla.evals.report import new_figure, save_figure

    names = list(tasks)
    lengths = sorted({int(length) for result in tasks.values() for length in result["by_length"]})
    grid = np.array([[tasks[name]["by_length"].get(length, np.nan) for length in lengths] for name in names])
    figure, axes = new_figure(1.5 + 0.9 * len(lengths), 1.0 + 0.5 * len(names))
    image = axes.imshow(grid, vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto")
    axes.set_xticks(range(len(lengths)), [str(length) for length in lengths])
    axes.set_yticks(range(len(names)), names)
    axes.set_xlabel("context length (tokens)")
    figure.colorbar(image, ax=axes, label="accuracy")
    save_figure(figure, path)
