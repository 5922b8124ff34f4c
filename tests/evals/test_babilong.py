"""BABILong-style QA: stories are answerable from their facts, facts hide in sized background, exact-label scoring."""

from __future__ import annotations

import re

import pytest

from hyla.evals.babilong import TASK_LABELS, build_babilong_samples, evaluate_babilong, score_babilong

_MOVE = re.compile(r"(\w+) (?:moved to|went to|journeyed to|travelled to|went back to) the (\w+)\.")
_TAKE = re.compile(r"(\w+) (?:picked up|got|grabbed|took) the (\w+) there\.")
_RELATION = re.compile(r"The (\w+) is (north|south|east|west) of the (\w+)\.")
_GIVE = re.compile(r"(\w+) gave the (\w+) to (\w+)\.")
_OPPOSITE = {"north": "south", "south": "north", "east": "west", "west": "east"}
_FACT = re.compile("|".join(pattern.pattern for pattern in (_MOVE, _TAKE, _RELATION, _GIVE)))


def _object_histories(context: str) -> tuple[dict[str, str], dict[str, list[str]]]:
    """Replay the moves and pick-ups: where each person is, and every place each object has been."""
    person_at, holder, history = {}, {}, {}
    for event in _FACT.finditer(context):
        if move := _MOVE.fullmatch(event.group(0)):
            person_at[move[1]] = move[2]
            for item, person in holder.items():
                if person == move[1]:
                    history[item].append(move[2])
        elif take := _TAKE.fullmatch(event.group(0)):
            holder[take[2]] = take[1]
            history[take[2]] = [person_at[take[1]]]
    return person_at, history


def solve(prompt: str) -> str:
    """An independent reader: answers the question of a prompt from the facts in its context."""
    context, question = prompt.split("</context>")[0], prompt.split("Question: ")[1].split("\n")[0]
    person_at, history = _object_histories(context)
    if match := re.fullmatch(r"Where is (\w+)\?", question):
        return person_at[match[1]]
    if match := re.fullmatch(r"Where is the (\w+)\?", question):
        return history[match[1]][-1]
    if match := re.fullmatch(r"Where was the (\w+) before the (\w+)\?", question):
        places = history[match[1]]
        return places[len(places) - 1 - places[::-1].index(match[2]) - 1]
    relations = [(a, d, b) for a, d, b in _RELATION.findall(context)]
    relations += [(b, _OPPOSITE[d], a) for a, d, b in relations]
    if match := re.fullmatch(r"What is (\w+) of the (\w+)\?", question):
        return next(a for a, d, b in relations if d == match[1] and b == match[2])
    if match := re.fullmatch(r"What is the (\w+) (\w+) of\?", question):
        return next(b for a, d, b in relations if a == match[1] and d == match[2])
    gives = _GIVE.findall(context)
    if match := re.fullmatch(r"Who gave the (\w+)\?", question):
        return [g for g, item, r in gives if item == match[1]][-1].lower()
    if match := re.fullmatch(r"Who received the (\w+)\?", question):
        return [r for g, item, r in gives if item == match[1]][-1].lower()
    match = re.fullmatch(r"What did (\w+) give to (\w+)\?", question)
    return [item for g, item, r in gives if (g, r) == (match[1], match[2])][-1]


@pytest.mark.parametrize("task", ["qa1", "qa2", "qa3", "qa4", "qa5"])
def test_answer_follows_from_the_facts_in_the_prompt(smollm2_tokenizer, task):
    for sample in build_babilong_samples(smollm2_tokenizer, task, 0, 30, seed=2) + build_babilong_samples(
        smollm2_tokenizer, task, 1024, 3, seed=2
    ):
        assert solve(sample.input) == sample.answer
        assert sample.answer in TASK_LABELS[task]
        # Every fact appears in the prompt, in story order (a fact may repeat, so search after the previous one).
        position = 0
        for fact in sample.facts:
            start = sample.input.index(fact, position)
            # Each fact stands as a whole sentence, after the end of the previous one.
            assert sample.input[start - 2 : start] in (">\n", ". ", "? ", "! ", '" ', "' ", ") ")
            position = start + len(fact)


@pytest.mark.parametrize("length", [1024, 4096])
def test_prompt_fills_the_target_length(smollm2_tokenizer, length):
    for sample in build_babilong_samples(smollm2_tokenizer, "qa2", length, 2, seed=3):
        assert 0.98 * length <= sample.num_prompt_tokens <= length
        assert sample.input.startswith("The text hides facts") and sample.input.endswith("\nAnswer:")


def test_exact_label_scoring():
    labels = TASK_LABELS["qa1"]
    assert score_babilong(" kitchen.\nQuestion: ...", "kitchen", "Where is Mary?", labels) == 1.0
    assert score_babilong(" Mary is in the kitchen", "kitchen", "Where is Mary?", labels) == 1.0
    assert score_babilong(" kitchen or garden", "kitchen", "Where is Mary?", labels) == 0.0
    assert score_babilong(" kitchens", "kitchen", "Where is Mary?", labels) == 0.0
    assert score_babilong("\nkitchen", "kitchen", "Where is Mary?", labels) == 1.0
    # Words of the question do not count against the answer.
    assert score_babilong(" the garden, before the kitchen", "garden", "Where was the milk before the kitchen?",
                          labels) == 1.0


def test_oracle_scores_one_and_silent_model_zero(smollm2_tokenizer, make_answering_stub):
    options = dict(tasks=["qa1", "qa3", "qa4", "qa5"], lengths=[0, 512], num_samples=3, batch_size=3)
    oracle = make_answering_stub(lambda prompt: " " + solve(prompt))
    result = evaluate_babilong(oracle, smollm2_tokenizer, **options)
    assert result["summary"]["accuracy"] == 1.0
    silent = evaluate_babilong(make_answering_stub(lambda prompt: ""), smollm2_tokenizer, **options)
    assert silent["summary"]["accuracy"] == 0.0
    assert set(silent["tasks"]["qa1"]["by_length"]) == {0, 512}
