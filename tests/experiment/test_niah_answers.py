"""NIAH answers sorted by kind, each example classified by hand from what a reader sees in it."""

import pytest

from hyla.experiment.niah_answers import answer_cells, answer_kind, copied_characters

NUMBER, UUID = "8346069", "e59bb261-a71b-4691-b710-140d2c9248e8"


@pytest.mark.parametrize(("prediction", "expected", "kind"), [
    (" 8346069.\nThe answer is", NUMBER, "needle_shaped"),
    (" 8340000", NUMBER, "needle_shaped"),  # a miscopy still has the needle's shape
    (': "8346069"', NUMBER, "needle_shaped"),  # leading punctuation skipped
    (" the number 16.", NUMBER, "other"),  # a number, but not where the answer begins
    (" 834.", NUMBER, "other"),  # too short to be a 7-digit value's miscopy
    (" the special magic number for merciful-synonym mentioned in the provided text.", NUMBER, "restates"),
    (': "The special magic number for legal-disposition is: "', NUMBER, "restates"),
    (" pathetic-councilor.\nThe special magic number for", NUMBER, "key"),  # the question's key, not its value
    (" x-rated-choosing.\nThe grass is green.", NUMBER, "key"),  # sitting P's SK1 misses at 64K
    (" needed.\nThe grass is green.", NUMBER, "other"),  # one word: not a key's shape
    (" Pathetic-Councilor.", NUMBER, "other"),  # RULER's keys are lower case
    (" pathetic-", NUMBER, "other"),  # a hyphen with no second word
    (" hidden within the following text. The special magic uuid for", UUID, "echo"),
    (": e59bb261-a71b-4691-b710-140d2c9248e8. April", UUID, "needle_shaped"),
    (" e59bb261a71b", UUID, "other"),  # no hyphen after 8 hex digits: not a UUID's start
    (" 12345678", UUID, "other"),  # a number where a UUID is asked for
])
def test_each_answer_gets_the_kind_a_reader_gives_it(prediction, expected, kind):
    assert answer_kind(prediction, expected) == kind


def test_copied_characters_count_from_the_answers_start_to_its_first_wrong_one():
    assert copied_characters(" 8346069.", NUMBER) == 7
    assert copied_characters(": 8341069", NUMBER) == 3
    assert copied_characters(" e59bb261-a71c", UUID) == 12  # 8 hex digits, the hyphen, "a71"
    assert copied_characters(" the number", NUMBER) == 0


def test_cells_sum_each_task_and_length():
    records = [
        {"task": "SK2", "length": 4096, "outputs": [NUMBER], "pred": " 8346069.", "score": 1.0},
        {"task": "SK2", "length": 4096, "outputs": [NUMBER], "pred": " the special magic number for x", "score": 0.0},
        {"task": "SK3", "length": 4096, "outputs": [UUID], "pred": " e59bb261-0000", "score": 0.0},
    ]
    cells = answer_cells(records)
    assert list(cells) == [("SK2", 4096), ("SK3", 4096)]
    sk2 = cells[("SK2", 4096)].row()
    assert (sk2["prompts"], sk2["right"], sk2["needle_shaped"], sk2["restates"]) == (2, 1, 1, 1)
    assert sk2["mean_copied"] == 3.5  # 7 and 0 characters
    sk3 = cells[("SK3", 4096)].row()
    assert (sk3["needle_shaped"], sk3["copied"], sk3["right"]) == (1, 9, 0)


def test_the_report_tables_each_models_misses_by_kind(tmp_path):
    """Three SK2 misses of main (a miscopy, a restatement, other text) and one right answer; a model with no miss
    gets no row."""
    from test_report import write_result

    from hyla.experiment import report

    records = [
        {"task": "SK2", "length": 4096, "depth_percent": 0, "index": 0, "outputs": [NUMBER], "pred": " 8346069.",
         "score": 1.0},
        {"task": "SK2", "length": 4096, "depth_percent": 10, "index": 1, "outputs": [NUMBER], "pred": " 8341111.",
         "score": 0.0},
        {"task": "SK2", "length": 16384, "depth_percent": 0, "index": 0, "outputs": [NUMBER],
         "pred": " the special magic number for x mentioned in the provided text.", "score": 0.0},
        {"task": "SK2", "length": 16384, "depth_percent": 10, "index": 1, "outputs": [NUMBER], "pred": " no.",
         "score": 0.0},
        {"task": "SK2", "length": 16384, "depth_percent": 20, "index": 2, "outputs": [NUMBER],
         "pred": " hard-iridescence.\nThe grass is green.", "score": 0.0},
    ]
    write_result(tmp_path, "niah-main-SK2-short", {"kind": "niah", "records": records,
                                                   "tasks": {"SK2": {"by_length": {"4096": 0.5, "16384": 0.0}}}})
    write_result(tmp_path, "niah-other-SK2-short", {"kind": "niah", "records": records[:1],
                                                    "tasks": {"SK2": {"by_length": {"4096": 1.0}}}})
    evals = report.collect_evals(tmp_path)
    assert evals["niah_misses"] == {"main": {"SK2": {"misses": 4, "needle_shaped": 1, "key": 1, "restates": 1,
                                                     "echo": 0, "other": 1}}}
    empty = {"plan": {}, "status": None, "conversions": {}, "alignment": {}, "selection": {}, "trainings": {}}
    text = report.markdown({**evals, **empty})
    assert "| model | task | misses | needle-shaped | key | restates | echo | other |" in text
    assert "| main | SK2 | 4 | 1 | 1 | 1 | 0 | 1 |" in text
    # A summary written before the key kind existed: its key answers are inside "other", so no count is invented.
    old = {"main": {"SK2": {"misses": 3, "needle_shaped": 1, "restates": 1, "echo": 0, "other": 1}}}
    assert "| main | SK2 | 3 | 1 | - | 1 | 0 | 1 |" in report.markdown({**evals, **empty, "niah_misses": old})
