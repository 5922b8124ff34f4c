"""The lm-eval-harness bridge runs offline on local tasks: multiple choice agrees with our own scorer; generation of a
HypeNet goes through hyla's inference engine, gives HFLM's own text, and the result file names its path."""

from __future__ import annotations

import json

import pytest

from hyla.evals.loglik import continuation_scores
from offline_models import teacher_tokenizer

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
    assert results["generation_path"] == "hf"


# A string no continuation contains: lm-eval's stop strings never cut the text.
_NEVER = "\x00never"
_PROMPTS = ["The quick brown", "def add(a, b):\n", "One of the special magic numbers is"]


def _tiny_hypenet(tokenizer):
    """A float64 HypeNet (Lightning, attention): the engine and transformers' generate pick the same greedy and sampled
    tokens (tests/inference/test_generate.py)."""
    import torch

    from hyla import HypeNetConfig, HypeNetForCausalLM

    torch.manual_seed(0)
    config = HypeNetConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                           layer_types=["lightning", "attention"], eos_token_id=tokenizer.eos_token_id,
                           pad_token_id=tokenizer.pad_token_id, bos_token_id=None)
    return HypeNetForCausalLM(config).double().eval()


def _requests(until, prompts=tuple(_PROMPTS), **gen_kwargs):
    from lm_eval.api.instance import Instance

    arguments = {"until": list(until), "max_gen_toks": 12, **gen_kwargs}
    return [Instance("generate_until", {}, (prompt, dict(arguments)), index) for index, prompt in enumerate(prompts)]


# Sampled: one prompt. Both paths draw the same tokens under one seed only where they draw for the same rows in the
# same order: transformers' generate stops at a stop string, which the engine generates past, and the engine draws
# for a batch's rows in the order of their lengths.
@pytest.mark.parametrize(("gen_kwargs", "prompts"), [({"do_sample": False}, _PROMPTS),
                                                    ({"do_sample": True, "temperature": 0.8}, _PROMPTS[:1])],
                         ids=["greedy", "sampled"])
def test_a_hypenet_generates_lm_eval_requests_on_the_engine_with_hflms_text(engine_calls, gen_kwargs, prompts):
    import torch
    from lm_eval.models.huggingface import HFLM

    from hyla.evals.lm_eval_bridge import lm_eval_model

    tokenizer = teacher_tokenizer()
    model = _tiny_hypenet(tokenizer)
    hflm = HFLM(pretrained=model, tokenizer=tokenizer, batch_size=len(prompts), device="cpu")
    torch.manual_seed(0)
    uncut = hflm.generate_until(_requests([_NEVER], prompts, **gen_kwargs), disable_tqdm=True)
    stop = uncut[0][2:4]
    expected = [text.split(stop)[0] for text in uncut]
    assert len(expected[0]) < len(uncut[0])
    torch.manual_seed(0)
    assert hflm.generate_until(_requests([stop], prompts, **gen_kwargs), disable_tqdm=True) == expected
    # On CPU, transformers' generate runs HFLM's request: the engine never ran.
    assert engine_calls == []
    bridged = lm_eval_model(model, tokenizer, batch_size=len(prompts))
    torch.manual_seed(0)
    assert bridged.generate_until(_requests([stop], prompts, **gen_kwargs), disable_tqdm=True) == expected
    assert len(engine_calls) == 1 and engine_calls[0][0] == len(prompts)
    described = bridged.generation.describe()
    assert described["path"] == "engine" and described["calls"] == 1 and described["new_positions"] == 12


def test_a_stop_string_that_is_one_special_token_ends_generation_on_the_engine(monkeypatch):
    from hyla.evals.generation import Generation
    from hyla.evals.lm_eval_bridge import lm_eval_model, special_stop_ids

    tokenizer = teacher_tokenizer()
    # "<eos>" and "<pad>" vanish from decoded text; the others stay in it for lm-eval to cut at.
    assert special_stop_ids(tokenizer, ["\n", "<eos>", "Question:", "<pad>"]) == [0, 1]
    stops_at = []
    original = Generation.batch

    def spy(self, *args, **kwargs):
        stops_at.append(kwargs["eos_token_id"])
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Generation, "batch", spy)
    bridged = lm_eval_model(_tiny_hypenet(tokenizer), tokenizer, batch_size=len(_PROMPTS))
    bridged.generate_until(_requests(["\n", "<pad>"]), disable_tqdm=True)
    # The model's end-of-sequence token (also lm-eval's, added to every request's stop strings), then "<pad>".
    assert stops_at == [[0, 1]]


def test_generation_settings_the_engine_cannot_serve_are_a_user_error(engine_calls):
    from hyla.evals.lm_eval_bridge import lm_eval_model

    tokenizer = teacher_tokenizer()
    bridged = lm_eval_model(_tiny_hypenet(tokenizer), tokenizer, batch_size=len(_PROMPTS))
    with pytest.raises(ValueError, match="--generation hf"):
        bridged.generate_until(_requests(["\n"], num_beams=2), disable_tqdm=True)
    assert engine_calls == []


def test_a_teacher_generates_through_hflms_own_generate(engine_calls, tiny_llama, smollm2_tokenizer):
    from lm_eval.models.huggingface import HFLM

    from hyla.evals.lm_eval_bridge import lm_eval_model

    bridged = lm_eval_model(tiny_llama, smollm2_tokenizer, batch_size=len(_PROMPTS))
    hflm = HFLM(pretrained=tiny_llama, tokenizer=smollm2_tokenizer, batch_size=len(_PROMPTS), device="cpu")
    texts = bridged.generate_until(_requests(["\n"]), disable_tqdm=True)
    assert texts == hflm.generate_until(_requests(["\n"]), disable_tqdm=True)
    described = bridged.generation.describe()
    assert described["path"] == "hf" and described["calls"] == 1 and engine_calls == []


def test_lm_eval_command_names_the_engine_path_for_a_hypenet(tmp_path, monkeypatch, capsys, engine_calls,
                                                             until_task):
    from hyla.cli import main

    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "datasets-cache"))
    tokenizer = teacher_tokenizer()
    folder = tmp_path / "tiny-hypenet"
    _tiny_hypenet(tokenizer).float().save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    until_task(tmp_path, "hyla_local_until", _PROMPTS, max_gen_toks=8)
    out = tmp_path / "out"
    code = main(["eval", "lm-eval", "--model", str(folder), "--tasks", "hyla_local_until", "--include-path",
                 str(tmp_path), "--only-included", "--batch-size", "3", "--out", str(out)])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert results["generation_path"] == "engine" and "hyla_local_until/exact_match" in results["summary"]
    assert results["generation"]["calls"] == len(engine_calls) >= 1
