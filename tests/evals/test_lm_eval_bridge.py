"""The lm-eval-harness bridge runs offline on a local multiple-choice task and agrees with our own scorer."""

from __future__ import annotations

import json

import pytest

from hyla.evals.loglik import continuation_scores

pytest.importorskip("lm_eval", reason="lm-eval-harness is not installed (pip install lm-eval==0.4.13)")

_QUESTIONS = [
    {"question": "The sky on a clear day is", "choices": ["blue", "green", "loud"], "label": 0},
    {"question": "Two plus two is", "choices": ["four", "five", "seven"], "label": 0},
    {"question": "Water is", "choices": ["dry", "wet", "square"], "label": 1},
    {"question": "The opposite of hot is", "choices": ["warm", "big", "cold"], "label": 2},
]


def _write_local_task(folder) -> None:
    data = folder / "questions.jsonl"
    data.write_text("".join(json.dumps(question) + "\n" for question in _QUESTIONS))
    (folder / "hyla_local_choice.yaml").write_text(
        "task: hyla_local_choice\n"
        "dataset_path: json\n"
        f"dataset_kwargs:\n  data_files:\n    test: {data}\n"
        "test_split: test\n"
        "output_type: multiple_choice\n"
        'doc_to_text: "{{question}}"\n'
        'doc_to_choice: "{{choices}}"\n'
        'doc_to_target: "{{label}}"\n'
        "metric_list:\n  - metric: acc\n    aggregation: mean\n    higher_is_better: true\n"
    )


def test_lm_eval_bridge_matches_our_log_likelihood_scorer(tmp_path, monkeypatch, smollm2_tokenizer, tiny_llama):
    from hyla.evals.lm_eval_bridge import run_lm_eval

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    _write_local_task(tmp_path)
    result = run_lm_eval(tiny_llama, smollm2_tokenizer, ["hyla_local_choice"], include_path=str(tmp_path), batch_size=4,
                         include_default_tasks=False)
    # lm-eval joins question and choice with a space (its default target delimiter).
    pairs = [(q["question"], " " + choice) for q in _QUESTIONS for choice in q["choices"]]
    scores = iter(continuation_scores(tiny_llama, smollm2_tokenizer, pairs, show_progress=False))
    correct = []
    for question in _QUESTIONS:
        log_probabilities = [next(scores)[0] for _ in question["choices"]]
        correct.append(log_probabilities.index(max(log_probabilities)) == question["label"])
    assert result["summary"]["hyla_local_choice/acc"] == pytest.approx(sum(correct) / len(correct))


def test_unknown_lm_eval_task_is_a_user_error(tmp_path, smollm2_tokenizer, tiny_llama):
    from hyla.evals.lm_eval_bridge import run_lm_eval

    with pytest.raises(ValueError, match="does not know"):
        run_lm_eval(tiny_llama, smollm2_tokenizer, ["no_such_task_anywhere"], include_path=str(tmp_path),
                    include_default_tasks=False)


def test_lm_eval_command_writes_results(tmp_path, monkeypatch, capsys, tiny_llama_folder):
    from hyla.cli import main

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    _write_local_task(tmp_path)
    out = tmp_path / "out"
    code = main(["eval", "lm-eval", "--model", str(tiny_llama_folder), "--tasks", "hyla_local_choice",
                 "--include-path", str(tmp_path), "--only-included", "--out", str(out)])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert results["kind"] == "lm-eval" and "hyla_local_choice/acc" in results["summary"]
