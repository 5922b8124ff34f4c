"""Run lm-eval-harness tasks on an already loaded model (ours or any HF causal LM) through its `HFLM` wrapper.

Most lm-eval tasks download their data set from the hub, so this is for users with internet; tasks defined in local
YAML files (`include_path`, with `dataset_path: json` and local `data_files`) run offline.
Install: `pip install lm-eval==0.4.13`.
"""

from __future__ import annotations

import math
from typing import Any

from hyla.evals.generation import model_device

LM_EVAL_INSTALL_HINT = "pip install lm-eval==0.4.13"


def _import_lm_eval() -> tuple[Any, Any, Any]:
    try:
        import lm_eval
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
    except ImportError as err:
        raise FileNotFoundError(f"lm-eval-harness is not installed: {LM_EVAL_INSTALL_HINT}") from err
    return lm_eval, HFLM, TaskManager


def _numeric_metrics(task_results: dict[str, Any]) -> dict[str, float]:
    # lm-eval keys metrics as "acc,none", "acc_stderr,none"; keep finite numbers and drop the filter suffix.
    metrics = {}
    for key, value in task_results.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            metrics[key.split(",")[0]] = float(value)
    return metrics


def run_lm_eval(
    model: Any,
    tokenizer: Any,
    tasks: list[str],
    *,
    limit: int | None = None,
    batch_size: int = 1,
    num_fewshot: int | None = None,
    include_path: str | None = None,
    include_default_tasks: bool = True,
) -> dict[str, Any]:
    """Evaluate `model` on lm-eval `tasks`; returns `{"summary": {"task/metric": value}, "tasks": {...}}`.

    `include_default_tasks=False` skips indexing lm-eval's thousands of bundled task files (~15 s) when only the
    tasks under `include_path` are wanted.
    """
    lm_eval, hflm_class, task_manager_class = _import_lm_eval()
    task_manager = task_manager_class(include_path=include_path, include_defaults=include_default_tasks)
    unknown = [task for task in tasks if not task_manager.match_tasks([task])]
    if unknown:
        raise ValueError(f"lm-eval does not know the task(s) {', '.join(unknown)}")
    wrapped = hflm_class(
        pretrained=model, tokenizer=tokenizer, batch_size=batch_size, device=str(model_device(model))
    )
    output = lm_eval.simple_evaluate(
        model=wrapped,
        tasks=list(tasks),
        limit=limit,
        num_fewshot=num_fewshot,
        task_manager=task_manager,
        log_samples=False,
        # lm-eval's default of 100k bootstrap resamples takes minutes for some metrics; stderrs of means are exact.
        bootstrap_iters=1000,
    )
    task_results = {task: _numeric_metrics(result) for task, result in output["results"].items()}
    summary = {f"{task}/{metric}": value for task, metrics in task_results.items() for metric, value in metrics.items()}
    return {"summary": summary, "tasks": task_results, "n_samples": output.get("n-samples", {})}
