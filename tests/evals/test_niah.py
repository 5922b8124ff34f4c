"""NIAH: task definitions and templates against RULER, prompt lengths, depths, scoring, oracle and silent models."""

from __future__ import annotations

import json
import re

import pytest
import yaml

from hyla.evals import niah
from hyla.evals.haystack import ruler_package_dir
from hyla.evals.niah_samples import ANSWER_PREFIX, REPEAT_HAYSTACK_LINE, TASK_TEMPLATE, TASKS, build_samples

NUMBER = r"\d{7}"
UUID = r"[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}"
# wonderwords' adjectives and nouns, as in RULER, may hold capitals, hyphens and spaces ("ad hoc", "dump truck").
WORD_KEY = r"[A-Za-z][A-Za-z' -]*-[A-Za-z' -]*[A-Za-z]"


def test_task_table_matches_ruler_synthetic_yaml():
    ruler_tasks = yaml.safe_load((ruler_package_dir() / "synthetic.yaml").read_text())
    for task in TASKS.values():
        args = ruler_tasks[task.ruler_name]["args"]
        # RULER's niah.py raises num_needle_k to num_needle_q before generating.
        expected_num_keys = max(args["num_needle_k"], args["num_needle_q"])
        assert (task.type_haystack, task.type_needle_k, task.type_needle_v) == (
            args["type_haystack"], args["type_needle_k"], args["type_needle_v"]
        )
        assert (task.num_needle_k, task.num_needle_v, task.num_needle_q) == (
            expected_num_keys, args["num_needle_v"], args["num_needle_q"]
        )


def test_templates_match_ruler_constants():
    from long_context_eval.data.synthetic.constants import TASKS as RULER_TASKS

    assert TASK_TEMPLATE == RULER_TASKS["niah"]["template"]
    assert ANSWER_PREFIX == RULER_TASKS["niah"]["answer_prefix"]
    assert RULER_TASKS["niah"]["tokens_to_generate"] == niah.RULER_TOKENS_TO_GENERATE


def _expected_prompt_pattern(value_type: str, singular: bool) -> re.Pattern:
    # docs/method.md, "Evaluation" / RULER's template, singularized when exactly one value is asked for.
    kind = value_type[:-1] if singular else value_type
    if singular:
        head = f"A special magic {kind} is hidden within the following text."
        question = f"What is the special magic {kind} for (?P<query>.+) mentioned in the provided text?"
        answer = f" The special magic {kind} for (?P=query) mentioned in the provided text is"
    else:
        head = f"Some special magic {kind} are hidden within the following text."
        question = f"What are all the special magic {kind} for (?P<query>.+) mentioned in the provided text?"
        answer = f" The special magic {kind} for (?P=query) mentioned in the provided text are"
    memorize = f" Make sure to memorize it. I will quiz you about the {kind} afterwards.\n"
    text = re.escape(head + memorize) + "(?P<context>.*)\n" + re.escape(question).replace(
        re.escape("(?P<query>.+)"), "(?P<query>.+)"
    ) + re.escape(answer).replace(re.escape("(?P=query)"), "(?P=query)")
    return re.compile(text, re.DOTALL)


def _needles(context: str, value_type: str) -> list[tuple[str, str]]:
    return re.findall(rf"One of the special magic {value_type} for (.+?) is: (\S+)\.", context)


# (task, key pattern, value pattern, number of needles, number of asked keys)
_TASK_SHAPES = [
    ("SK1", WORD_KEY, NUMBER, 1, 1),
    ("SK2", WORD_KEY, NUMBER, 1, 1),
    ("SK3", WORD_KEY, UUID, 1, 1),
    ("MK1", WORD_KEY, NUMBER, 4, 1),
    ("MK2", WORD_KEY, NUMBER, None, 1),
    ("MK3", UUID, UUID, None, 1),
    ("MV", WORD_KEY, NUMBER, 4, 1),
    ("MQ", WORD_KEY, NUMBER, 4, 4),
]


@pytest.mark.parametrize("task_name, key_pattern, value_pattern, num_needles, num_asked", _TASK_SHAPES)
def test_prompt_follows_ruler_template(
    smollm2_tokenizer, task_name, key_pattern, value_pattern, num_needles, num_asked
):
    task = TASKS[task_name]
    sample = build_samples(smollm2_tokenizer, task_name, 2048, 1, seed=3)[0]
    singular = task.num_needle_q * task.num_needle_v == 1
    match = _expected_prompt_pattern(task.type_needle_v, singular).fullmatch(sample.input)
    assert match, sample.input[:300] + " … " + sample.input[-300:]
    context, query = match["context"], match["query"]
    asked_keys = re.split(r", and |, ", query)
    assert len(asked_keys) == num_asked
    needles = _needles(context, task.type_needle_v)
    if num_needles is not None:
        assert len(needles) == num_needles
    for key, value in needles:
        assert re.fullmatch(key_pattern, key) and re.fullmatch(value_pattern, value)
    gold = [value for key, value in needles if key in asked_keys]
    assert sorted(sample.outputs) == sorted(gold)
    assert len(gold) == task.num_needle_q * task.num_needle_v
    _check_haystack(task.type_haystack, context, len(needles))


def _check_haystack(type_haystack: str, context: str, num_needles: int) -> None:
    if type_haystack == "repeat":
        lines = context.split("\n")
        assert sum(line == REPEAT_HAYSTACK_LINE for line in lines) == len(lines) - num_needles > 10
    elif type_haystack == "needle":
        # The haystack is made of needles: every line is one.
        assert all(line.startswith("One of the special magic") for line in context.split("\n"))
        assert num_needles > 10
    else:
        assert "\n" not in context and len(context.split()) > 1000


@pytest.mark.parametrize("task_name", list(TASKS))
def test_prompt_length_within_two_percent_of_target(smollm2_tokenizer, task_name):
    for length in (2048, 8192):
        for sample in build_samples(smollm2_tokenizer, task_name, length, 2, seed=5):
            assert 0.98 * length <= sample.length <= length, (length, sample.length)
            assert sample.num_prompt_tokens == len(smollm2_tokenizer(sample.input, add_special_tokens=False).input_ids)


@pytest.mark.slow
@pytest.mark.parametrize("task_name", list(TASKS))
def test_prompt_length_within_two_percent_up_to_64k(smollm2_tokenizer, task_name):
    for length in (4096, 16384, 32768, 65536):
        sample = build_samples(smollm2_tokenizer, task_name, length, 1, seed=7)[0]
        assert 0.98 * length <= sample.length <= length, (length, sample.length)


@pytest.mark.parametrize("task_name", ["SK1", "SK2", "MK2"])
def test_needle_sits_at_requested_depth(smollm2_tokenizer, task_name):
    from hyla.evals.haystack import split_sentences

    samples = build_samples(smollm2_tokenizer, task_name, 2048, 5, seed=11, num_depths=5)
    assert [sample.depth_percent for sample in samples] == [0, 25, 50, 75, 100]
    for sample in samples:
        context = sample.input.split("\n", 1)[1].rsplit("\nWhat", 1)[0]
        # Depth counts haystack units as RULER does: sentences of an essay, lines otherwise.
        units = split_sentences(context) if TASKS[task_name].type_haystack == "essay" else context.split("\n")
        needle_index = next(i for i, unit in enumerate(units) if sample.outputs[0] in unit)
        assert abs(needle_index - (len(units) - 1) * sample.depth_percent / 100) <= 1


@pytest.mark.parametrize("task_name", sorted(TASKS))
def test_each_sample_is_the_one_the_search_without_a_guess_fits(smollm2_tokenizer, task_name):
    # build_samples seeds each sample's haystack search with the previous sample's size; built one by one without
    # it (the search from zero), the prompts must be the same.
    from hyla.evals.niah_samples import RULER_TOKENS_TO_GENERATE, build_sample, depth_grid, get_task

    length = 16384 if task_name == "SK2" else 2048
    samples = build_samples(smollm2_tokenizer, task_name, length, 4, seed=9, num_depths=3)
    depths = depth_grid(3)
    alone = [build_sample(smollm2_tokenizer, get_task(task_name), length, depths[i % 3], i, 9,
                          RULER_TOKENS_TO_GENERATE) for i in range(4)]
    assert [s.input for s in samples] == [s.input for s in alone]


def test_haystack_search_from_a_guess_finds_what_the_search_from_zero_finds():
    from hyla.evals.haystack import fit_num_units

    def tokens(n):  # monotone, nearly linear, with a step every 7 units, like a tokenizer's counts
        return 40 + (13 * n) // 10 + n // 7

    for max_tokens in (40, 41, 100, 997, 5000):
        expected = fit_num_units(tokens, max_tokens=max_tokens, tokens_per_unit=1.3)
        assert tokens(expected) <= max_tokens < tokens(expected + 1)
        for guess in (1, expected // 2 + 1, expected, expected + 1, expected + 3, 2 * expected + 5, 10_000):
            assert fit_num_units(tokens, max_tokens=max_tokens, tokens_per_unit=1.3, guess=guess) == expected
        capped = min(expected, 50)
        for guess in (1, 25, 50):
            assert fit_num_units(tokens, max_tokens=max_tokens, tokens_per_unit=1.3, max_units=50,
                                 guess=guess) == capped
    with pytest.raises(ValueError, match="without any haystack"):
        fit_num_units(tokens, max_tokens=39, tokens_per_unit=1.3, guess=5)


def test_samples_are_reproducible_and_seed_dependent(smollm2_tokenizer):
    first = build_samples(smollm2_tokenizer, "MK1", 1024, 2, seed=1)
    again = build_samples(smollm2_tokenizer, "MK1", 1024, 2, seed=1)
    other = build_samples(smollm2_tokenizer, "MK1", 1024, 2, seed=2)
    assert [s.input for s in first] == [s.input for s in again]
    assert first[0].input != other[0].input and first[0].input != first[1].input


def test_score_equals_ruler_string_match_all():
    from long_context_eval.eval.synthetic.constants import string_match_all_per_sample

    cases = [
        ("The answer is 1234567.", ["1234567"]),
        ("nothing here", ["1234567"]),
        ("ABCDEF01-aaaa 7654321", ["abcdef01-aaaa", "7654321", "1111111"]),
        ("", ["1"]),
        (" 1, 2\x03, 3 ", ["1", "2", "3", "4"]),
    ]
    for prediction, gold in cases:
        ruler_score = string_match_all_per_sample([niah.postprocess_prediction(prediction)], [gold])[0] / 100
        assert niah.score(prediction, gold) == pytest.approx(ruler_score)
    assert niah.score("1234567 and 7654321", ["1234567", "7654321", "0000000", "1111111"]) == 0.5


def test_oracle_scores_one_and_silent_model_zero(smollm2_tokenizer, needle_oracle, silent_model):
    options = dict(tasks=list(TASKS), lengths=[1024], num_samples=2, batch_size=2, num_depths=2)
    perfect = niah.evaluate_niah(needle_oracle, smollm2_tokenizer, **options)
    assert perfect["summary"]["accuracy"] == 1.0
    assert all(result["accuracy"] == 1.0 for result in perfect["tasks"].values())
    silent = niah.evaluate_niah(silent_model, smollm2_tokenizer, **options)
    assert silent["summary"]["accuracy"] == 0.0
    assert set(silent["overall"]["by_depth"]) == {0, 100}


def test_from_jsonl_scores_like_our_scorer(tmp_path, smollm2_tokenizer, needle_oracle):
    samples = [s for task in ("SK2", "MV") for s in build_samples(smollm2_tokenizer, task, 1024, 3, seed=4)]
    # Predictions that find some values but not all, so scores other than 0 and 1 occur.
    predictions = [" ".join(sample.outputs[: index % 3]) for index, sample in enumerate(samples)]
    path = tmp_path / "niah_multivalue.jsonl"
    path.write_text("".join(json.dumps({**s.ruler_record(), "pred": p}) + "\n" for s, p in zip(samples, predictions)))
    from_file = niah.evaluate_ruler_jsonl(path)
    expected = [niah.score(prediction, sample.outputs) for sample, prediction in zip(samples, predictions)]
    assert [record["score"] for record in from_file["records"]] == expected
    assert {r["score"] for r in from_file["records"]} >= {0.0, 0.25, 1.0}

    # Without predictions the file's prompts are run through the model, exactly as our own samples are.
    path.write_text("".join(json.dumps(sample.ruler_record()) + "\n" for sample in samples))
    generated = niah.evaluate_ruler_jsonl(path, needle_oracle, smollm2_tokenizer, batch_size=2)
    ours = niah.evaluate_samples(needle_oracle, smollm2_tokenizer, samples, batch_size=2)
    assert [r["score"] for r in generated["records"]] == [r["score"] for r in ours]
    assert generated["overall"]["by_length_depth"] == niah.aggregate_scores(ours)["overall"]["by_length_depth"]


def test_from_jsonl_reads_a_ruler_prediction_file(tmp_path):
    # A line as RULER's call_api.py writes it; the task comes from the file name, the length is rounded up.
    # The value sits at character 145 of 253 (57%): the depth reads as 60%.
    row = {"index": 0, "input": "x " * 50 + "One of the special magic numbers for a-b is: 1234567." + " y" * 50,
           "outputs": ["1234567"],
           "pred": " 1234567", "others": {"id": 0}, "truncation": -1, "length": 4000}
    path = tmp_path / "niah_single_2.jsonl"
    path.write_text(json.dumps(row) + "\n" + json.dumps({**row, "index": 1, "pred": "no"}) + "\n")
    result = niah.evaluate_ruler_jsonl(path)
    assert result["summary"] == {"accuracy": 0.5, "SK2/accuracy": 0.5, "SK2/4096": 0.5}
    assert result["overall"]["by_depth"] == {60: 0.5}
    # Scores 1 and 0: sample standard deviation √0.5, over √2.
    assert result["overall"]["accuracy_stderr"] == pytest.approx(0.5)


def test_evaluate_niah_runs_a_real_hf_model(smollm2_tokenizer, tiny_llama):
    result = niah.evaluate_niah(tiny_llama, smollm2_tokenizer, ["SK1"], [512], 2, batch_size=2, max_new_tokens=4)
    assert len(result["records"]) == 2 and 0.0 <= result["summary"]["accuracy"] <= 1.0
    assert all(isinstance(record["pred"], str) for record in result["records"])


def test_heatmap_is_written(tmp_path):
    path = tmp_path / "heatmap.png"
    niah.plot_heatmap({"2048": {"0": 1.0, "50": 0.5}, "4096": {"0": 0.0}}, "test", path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_ruler_evaluate_script_gives_our_scores(tmp_path, smollm2_tokenizer):
    """RULER's own evaluate.py, run on prediction files we write, reports the accuracies our scorer reports."""
    import csv
    import os
    import subprocess
    import sys

    pytest.importorskip("nltk", reason="RULER's evaluate.py imports nltk")
    pytest.importorskip("pandas", reason="RULER's evaluate.py imports pandas")
    data_dir = tmp_path / "predictions"
    data_dir.mkdir()
    ours = {}
    for task in ("SK1", "MV", "MQ"):
        samples = build_samples(smollm2_tokenizer, task, 1024, 4, seed=6)
        predictions = [" ".join(sample.outputs[: index + 1]) + " 0000000" for index, sample in enumerate(samples)]
        ours[TASKS[task].ruler_name] = 100 * sum(map(niah.score, predictions, [s.outputs for s in samples])) / 4
        lines = [json.dumps({**s.ruler_record(), "pred": p}) for s, p in zip(samples, predictions)]
        (data_dir / f"{TASKS[task].ruler_name}.jsonl").write_text("\n".join(lines) + "\n")
    # evaluate.py downloads nltk's punkt when it cannot find it; an empty folder of that name keeps it offline.
    nltk_data = tmp_path / "nltk_data"
    (nltk_data / "tokenizers" / "punkt").mkdir(parents=True)
    script = ruler_package_dir() / "eval" / "evaluate.py"
    subprocess.run([sys.executable, str(script), "--data_dir", str(data_dir), "--benchmark", "synthetic"],
                   cwd=tmp_path, env={**os.environ, "NLTK_DATA": str(nltk_data)}, check=True, capture_output=True)
    tasks_row, scores_row, _ = list(csv.reader((data_dir / "summary.csv").open()))[1:]
    ruler = {task: float(value) for task, value in zip(tasks_row[1:], scores_row[1:])}
    assert ruler == {task: pytest.approx(round(score, 2)) for task, score in ours.items()}
    assert len(set(ruler.values())) > 1


_TENACITY_SHIM = '''
def retry(*args, **kwargs):
    return lambda function: function


class _Wait:
    def __add__(self, other):
        return self


def stop_after_attempt(attempts):
    return None


def wait_fixed(seconds):
    return _Wait()


def wait_random(low, high):
    return _Wait()
'''


def _start_ruler_generator(folder, tokenizer_dir, shim_dir, task) -> subprocess.Popen:
    """Start RULER's own niah.py as prepare.py would, writing 3 samples of `task` under folder/ruler, with shim_dir's
    modules importable."""
    import os
    import subprocess
    import sys

    from long_context_eval.data.synthetic.constants import TASKS as RULER_TASKS

    template = RULER_TASKS["niah"]["template"] + RULER_TASKS["niah"]["answer_prefix"]
    args = {"type_haystack": task.type_haystack, "type_needle_k": task.type_needle_k,
            "type_needle_v": task.type_needle_v, "num_needle_k": task.num_needle_k,
            "num_needle_v": task.num_needle_v, "num_needle_q": task.num_needle_q}
    command = [sys.executable, str(ruler_package_dir() / "data" / "synthetic" / "niah.py"),
               "--save_dir", str(folder / "ruler"), "--save_name", task.ruler_name, "--tokenizer_path",
               str(tokenizer_dir), "--tokenizer_type", "hf", "--max_seq_length", "1024", "--tokens_to_generate", "128",
               "--num_samples", "3", "--template", template]
    command += [item for name, value in args.items() for item in (f"--{name}", str(value))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(shim_dir), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=folder)


RULER_GENERATED = ["SK1", "MK3"]


@pytest.fixture(scope="module")
def ruler_generated(tmp_path_factory, smollm2_tokenizer) -> dict:
    """The data file RULER's niah.py writes for each task of RULER_GENERATED. The generators run at once: each spends
    most of its time on one core building RULER's list of millions of key words."""
    pytest.importorskip("nltk", reason="RULER's niah.py imports nltk")
    folder = tmp_path_factory.mktemp("ruler-generated")
    tokenizer_dir = folder / "tokenizer"
    smollm2_tokenizer.save_pretrained(tokenizer_dir)
    # RULER's tokenizer module imports tenacity for API retries that an HF tokenizer never uses. Written once, before
    # any generator starts: a rewrite while another one imports it could hand that one an empty module.
    shim_dir = folder / "shims"
    shim_dir.mkdir()
    (shim_dir / "tenacity.py").write_text(_TENACITY_SHIM)
    processes = {name: _start_ruler_generator(folder, tokenizer_dir, shim_dir, TASKS[name]) for name in RULER_GENERATED}
    try:
        for name, process in processes.items():
            output, _ = process.communicate(timeout=600)
            assert process.returncode == 0, f"RULER's niah.py for {name}:\n{output[-3000:]}"
    finally:
        for process in processes.values():
            if process.poll() is None:
                process.kill()
                process.wait()
    return {name: folder / "ruler" / TASKS[name].ruler_name / "validation.jsonl" for name in RULER_GENERATED}


@pytest.mark.parametrize("task_name", RULER_GENERATED)
def test_samples_made_by_ruler_scripts_score_like_ours(ruler_generated, smollm2_tokenizer, needle_oracle, silent_model,
                                                        task_name):
    """RULER's own generator: its prompts fit our template, and --from-jsonl scores them (oracle 1, silent 0)."""
    task = TASKS[task_name]
    path = ruler_generated[task_name]
    rows = niah.read_ruler_jsonl(path)
    assert len(rows) == 3
    for row in rows:
        assert _expected_prompt_pattern(task.type_needle_v, singular=True).fullmatch(row["input"])
    perfect = niah.evaluate_ruler_jsonl(path, needle_oracle, smollm2_tokenizer, batch_size=3)
    assert perfect["summary"] == {"accuracy": 1.0, f"{task_name}/accuracy": 1.0, f"{task_name}/1024": 1.0}
    silent = niah.evaluate_ruler_jsonl(path, silent_model, smollm2_tokenizer, batch_size=3)
    assert silent["summary"]["accuracy"] == 0.0
