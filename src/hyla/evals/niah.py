"""NIAH evaluation (RULER's eight tasks): greedy generation, RULER's scoring, accuracy by task, length and depth.

Sample generation lives in `hyla.evals.niah_samples`; `build_samples`, `NiahSample` and `TASKS` are re-exported here.
Scoring is RULER's `string_match_all` (`long_context_eval/eval/synthetic/constants.py`): the fraction of gold values
found, case-insensitively, in the prediction after RULER's post-processing. Accuracies are reported in [0, 1]
(RULER prints percentages).
"""

from __future__ import annotations

import json
import math
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from hyla.evals.generation import Generation, as_generation, generate_greedy
from hyla.evals.niah_cache import cached_samples
from hyla.evals.niah_samples import (
    RULER_TOKENS_TO_GENERATE,
    TASK_BY_RULER_NAME,
    TASKS,
    NiahSample,
    build_samples,
    get_task,
)
from hyla.progress import progress

__all__ = [
    "TASKS",
    "NiahSample",
    "build_samples",
    "score",
    "postprocess_prediction",
    "evaluate_niah",
    "evaluate_ruler_jsonl",
    "aggregate_scores",
    "plot_heatmap",
]

DEFAULT_LENGTHS = (2048, 4096, 8192)
# RULER generates up to 128 tokens. Four 7-digit values take ~35 tokens with digit-level tokenizers such as
# SmolLM2's, so 64 leaves room for MV and MQ while halving the decode time.
NIAH_MAX_NEW_TOKENS = 64
_CONTROL_CHARACTERS = re.compile(r"[\x00-\x1f]")


def postprocess_prediction(prediction: str | None) -> str:
    """RULER's `postprocess_pred`: strip, and turn control characters into newlines."""
    if prediction is None:
        return ""
    return _CONTROL_CHARACTERS.sub("\n", prediction.strip()).strip()


def score(prediction: str | None, gold_values: list[str]) -> float:
    """Fraction of `gold_values` that occur (case-insensitively) in the prediction: RULER's `string_match_all`."""
    if not gold_values:
        raise ValueError("a NIAH sample needs at least one gold value")
    text = postprocess_prediction(prediction).lower()
    return sum(value.lower() in text for value in gold_values) / len(gold_values)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _stderr(values: list[float]) -> float | None:
    # Sample standard deviation / √n, as for CSR; layer selection compares scores against this noise.
    if len(values) < 2:
        return None
    mean = _mean(values)
    return math.sqrt(sum((value - mean) ** 2 for value in values) / (len(values) - 1) / len(values))


def aggregate_scores(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Mean score per task, per length, per depth, and per (length, depth), from per-sample records.

    Each record has `task`, `length` (the target length), `depth_percent` and `score`. Accuracies come with
    `accuracy_stderr` (standard error of the mean over samples).
    """
    by_task: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        by_task[record["task"]].append(record)
    tasks = {task: _aggregate_one(task_records) for task, task_records in by_task.items()}
    overall = _aggregate_one(records)
    summary = {"accuracy": overall["accuracy"]}
    for task, result in tasks.items():
        summary[f"{task}/accuracy"] = result["accuracy"]
        for length, accuracy in result["by_length"].items():
            summary[f"{task}/{length}"] = accuracy
    return {"summary": summary, "overall": overall, "tasks": tasks}


def _aggregate_one(records: list[dict[str, Any]]) -> dict[str, Any]:
    by_length, by_depth, by_cell = defaultdict(list), defaultdict(list), defaultdict(list)
    for record in records:
        by_length[record["length"]].append(record["score"])
        by_depth[record["depth_percent"]].append(record["score"])
        by_cell[(record["length"], record["depth_percent"])].append(record["score"])
    by_length_depth: dict[int, dict[int, float]] = defaultdict(dict)
    for (length, depth), scores in sorted(by_cell.items()):
        by_length_depth[length][depth] = _mean(scores)
    scores = [record["score"] for record in records]
    return {
        "accuracy": _mean(scores),
        "accuracy_stderr": _stderr(scores),
        "num_samples": len(records),
        "by_length": {length: _mean(scores) for length, scores in sorted(by_length.items())},
        "by_depth": {depth: _mean(scores) for depth, scores in sorted(by_depth.items())},
        "by_length_depth": dict(by_length_depth),
    }


def _ruler_fields(sample: NiahSample) -> dict[str, Any]:
    # What RULER's evaluate.py reads besides `pred` and `outputs`; `others` also lets our reader recover the cell.
    others = {"task": sample.task, "target_length": sample.target_length, "depth_percent": sample.depth_percent}
    return {"input": sample.input, "length_tokens": sample.length, "others": others}


def _score_samples(
    samples: list[NiahSample], predictions: list[str], keep_inputs: bool = False
) -> list[dict[str, Any]]:
    return [
        {
            **(_ruler_fields(sample) if keep_inputs else {}),
            "task": sample.task,
            "length": sample.target_length,
            "depth_percent": sample.depth_percent,
            "index": sample.index,
            "num_prompt_tokens": sample.num_prompt_tokens,
            "outputs": sample.outputs,
            "pred": prediction,
            "score": score(prediction, sample.outputs),
        }
        for sample, prediction in zip(samples, predictions)
    ]


def evaluate_samples(
    model,
    tokenizer,
    samples: list[NiahSample],
    *,
    batch_size: int = 1,
    max_new_tokens: int = NIAH_MAX_NEW_TOKENS,
    keep_inputs: bool = False,
    generation: str | Generation | None = None,
) -> list[dict[str, Any]]:
    """Generate greedily for each sample and score it; returns one record per sample (with its prompt if asked).
    generation: the path ("auto": hyla's engine for the HypeNet models it runs, "engine", "hf") or a Generation.
    Prompts are not encoded again where every sample kept its token ids from `tokenizer` (`NiahSample.prompt_ids`)."""
    kept = [sample.prompt_ids.of(tokenizer) if sample.prompt_ids is not None else None for sample in samples]
    predictions = generate_greedy(
        model, tokenizer, [sample.input for sample in samples], max_new_tokens=max_new_tokens, batch_size=batch_size,
        generation=generation, encoded=kept if all(ids is not None for ids in kept) else None,
    )
    return _score_samples(samples, predictions, keep_inputs)


def niah_positions(lengths, max_new_tokens: int, tokens_to_generate: int = RULER_TOKENS_TO_GENERATE) -> int:
    """The most positions a NIAH prompt of `lengths` and its answer take: prompts leave `tokens_to_generate` of their
    length free, and the model generates up to `max_new_tokens`."""
    return max(lengths) + max(0, max_new_tokens - tokens_to_generate)


def evaluate_niah(
    model,
    tokenizer,
    tasks: list[str] | tuple[str, ...] = tuple(TASKS),
    lengths: list[int] | tuple[int, ...] = DEFAULT_LENGTHS,
    num_samples: int = 10,
    batch_size: int = 1,
    *,
    max_new_tokens: int = NIAH_MAX_NEW_TOKENS,
    tokens_to_generate: int = RULER_TOKENS_TO_GENERATE,
    num_depths: int = 11,
    seed: int = 42,
    keep_inputs: bool = False,
    generation: str | Generation | None = None,
    samples_cache: str | Path | None = None,
    haystack_offset: int = 0,
) -> dict[str, Any]:
    """Run the NIAH tasks at each length; returns `{"summary", "overall", "tasks", "records", "generation"}`
    (`generation`: the path it took and its time, `Generation.describe`). samples_cache: a folder where the prompts
    are read from when an evaluation with the same tokenizer built them before, else left (`hyla.evals.niah_cache`).

    Prompts are sized so that prompt + `tokens_to_generate` (RULER: 128) fits `length`; the model then generates up
    to `max_new_tokens` (default 64, see `NIAH_MAX_NEW_TOKENS`). With `keep_inputs`, each record also holds its
    prompt (`input`) and RULER's `length_tokens`, so the records form a RULER prediction file. haystack_offset: essay
    haystacks start that many words into the essays (a diagnostic outside RULER's prompts; `hyla.evals.niah_samples`).
    """
    records: list[dict[str, Any]] = []
    generation = as_generation(model, generation)
    # One engine for every task and length: sized for the longest prompt and the largest batch.
    if tasks and lengths and num_samples > 0:
        generation.reserve(min(batch_size, num_samples), niah_positions(lengths, max_new_tokens, tokens_to_generate))
    groups = [(get_task(task).name, length) for task in tasks for length in lengths]
    for task, length in progress(groups, desc="niah", unit="task×length"):
        samples = cached_samples(samples_cache, tokenizer, task, length, num_samples, seed, num_depths=num_depths,
                                 tokens_to_generate=tokens_to_generate, haystack_offset=haystack_offset)
        records += evaluate_samples(
            model, tokenizer, samples, batch_size=batch_size, max_new_tokens=max_new_tokens, keep_inputs=keep_inputs,
            generation=generation,
        )
    return {**aggregate_scores(records), "records": records, "generation": generation.describe()}


def read_ruler_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a RULER data or prediction file (`input`, `outputs`, `length`, optional `pred`, `others`)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no RULER jsonl file at {path}")
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for number, row in enumerate(rows, start=1):
        if "input" not in row or not row.get("outputs"):
            raise ValueError(f"{path}:{number}: a RULER sample needs 'input' and a non-empty 'outputs' list")
    if not rows:
        raise ValueError(f"{path} holds no samples")
    return rows


def task_name_from_path(path: str | Path) -> str:
    """Our task name for a RULER file named after its task (`niah_single_1.jsonl`, `niah_single_1/validation.jsonl`)."""
    path = Path(path)
    for candidate in (path.stem, path.parent.name):
        if candidate in TASK_BY_RULER_NAME:
            return TASK_BY_RULER_NAME[candidate].name
    return path.stem


def _nominal_length(num_tokens: int) -> int:
    # RULER files keep the real length (≤ the requested max); the requested one is the power of two at or above it.
    return 2 ** math.ceil(math.log2(max(num_tokens, 1)))


def _needle_depth(row: dict[str, Any]) -> int:
    # Where the first gold value sits in the input, rounded to 10%: RULER files do not record the depth.
    position = row["input"].find(row["outputs"][0])
    return -1 if position < 0 else int(round(10 * position / len(row["input"]))) * 10


def evaluate_ruler_jsonl(
    path: str | Path,
    model=None,
    tokenizer=None,
    *,
    task: str | None = None,
    batch_size: int = 1,
    max_new_tokens: int = NIAH_MAX_NEW_TOKENS,
    generation: str | Generation | None = None,
) -> dict[str, Any]:
    """Score a file in RULER's format: its `pred` fields if every row has one, else the model's greedy outputs."""
    rows = read_ruler_jsonl(path)
    task_from_path = task_name_from_path(path)
    described = {"path": "predictions in the file"}
    if all("pred" in row for row in rows):
        predictions = [row["pred"] for row in rows]
    elif model is None or tokenizer is None:
        raise ValueError(f"{path} has no 'pred' fields: pass a model to generate them")
    else:
        prompts = [row["input"] for row in rows]
        generation = as_generation(model, generation)
        predictions = generate_greedy(model, tokenizer, prompts, max_new_tokens=max_new_tokens, batch_size=batch_size,
                                      generation=generation)
        described = generation.describe()
    records = [
        {
            "task": task or (row.get("others") or {}).get("task") or task_from_path,
            "length": (row.get("others") or {}).get("target_length") or _nominal_length(row.get("length", 0)),
            "depth_percent": (row.get("others") or {}).get("depth_percent", _needle_depth(row)),
            "index": row.get("index", number),
            "outputs": row["outputs"],
            "pred": prediction,
            "score": score(prediction, row["outputs"]),
        }
        for number, (row, prediction) in enumerate(zip(rows, predictions))
    ]
    return {**aggregate_scores(records), "records": records, "generation": described}


def plot_heatmap(by_length_depth: dict, title: str, path: Path) -> None:
    """Accuracy heatmap: depth (rows) × length (columns)."""
    import numpy as np

    from hyla.evals.report import new_figure, save_figure

    lengths = sorted(by_length_depth, key=int)
    depths = sorted({int(depth) for cells in by_length_depth.values() for depth in cells})
    grid = np.full((len(depths), len(lengths)), np.nan)
    for column, length in enumerate(lengths):
        for depth, accuracy in by_length_depth[length].items():
            grid[depths.index(int(depth)), column] = accuracy
    figure, axes = new_figure(1.2 + 0.9 * len(lengths), 1.2 + 0.35 * len(depths))
    image = axes.imshow(grid, vmin=0.0, vmax=1.0, cmap="RdYlGn", aspect="auto")
    for (row, column), accuracy in np.ndenumerate(grid):
        if not np.isnan(accuracy):
            axes.text(column, row, f"{accuracy:.2f}", ha="center", va="center", fontsize=7)
    axes.set_xticks(range(len(lengths)), [_length_label(int(length)) for length in lengths])
    axes.set_yticks(range(len(depths)), [f"{depth}%" for depth in depths])
    axes.set_xlabel("context length (tokens)")
    axes.set_ylabel("needle depth")
    axes.set_title(title)
    figure.colorbar(image, ax=axes, label="accuracy")
    save_figure(figure, path)


def _length_label(length: int) -> str:
    return f"{length // 1024}K" if length % 1024 == 0 else str(length)
