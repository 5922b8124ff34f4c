"""Run lm-eval-harness tasks on an already loaded model (ours or any HF causal LM) through its `HFLM` wrapper.

Generative tasks (`generate_until`) generate through hyla's `Generation`: a HypeNet model on hyla's inference
engine, with lm-eval's max length, greedy or sampling settings and end-of-sequence tokens; lm-eval then cuts each
continuation at its stop strings after decoding it, as it does for every model. Other models, or `generation="hf"`,
generate through HFLM's own call of transformers' `generate`. The result names the path (`generation`).

Most lm-eval tasks download their data set from the hub, so this is for users with internet; tasks defined in local
YAML files (`include_path`, with `dataset_path: json` and local `data_files`) run offline.
Install: `pip install lm-eval==0.4.13`.
"""

from __future__ import annotations

import functools
import math
import time
from typing import Any

from hyla.evals.generation import Generation, as_generation, model_device

LM_EVAL_INSTALL_HINT = "pip install lm-eval==0.4.13"


def _import_lm_eval() -> tuple[Any, Any, Any]:
    try:
        import lm_eval
        from lm_eval.models.huggingface import HFLM
        from lm_eval.tasks import TaskManager
    except ImportError as err:
        raise FileNotFoundError(f"lm-eval-harness is not installed: {LM_EVAL_INSTALL_HINT}") from err
    return lm_eval, HFLM, TaskManager


def lm_eval_model(model: Any, tokenizer: Any, *, batch_size: int = 1,
                  generation: str | Generation | None = None) -> Any:
    """lm-eval's HFLM around `model`, generating through `generation` (a Generation, or its path: "auto", "engine",
    "hf"; None: "auto")."""
    _, hflm_class, _ = _import_lm_eval()
    return _generating_hflm(hflm_class)(
        pretrained=model, tokenizer=tokenizer, batch_size=batch_size, device=str(model_device(model)),
        generation=as_generation(model, generation),
    )


@functools.cache
def _generating_hflm(hflm_class: type) -> type:
    """The HFLM subclass whose `_model_generate` (lm-eval's one call of `generate`) goes through a Generation; made
    on first use, so that importing this module needs no lm-eval."""

    class GeneratingHFLM(hflm_class):
        def __init__(self, *args: Any, generation: Generation, **kwargs: Any):
            super().__init__(*args, **kwargs)
            self.generation = generation

        def _model_generate(self, context, max_length: int, stop: list[str], **generation_kwargs):
            started = time.perf_counter()
            if self.generation.session is None:
                output = super()._model_generate(context, max_length, stop, **generation_kwargs)
                self.generation.record_hf_call(context, generation_kwargs.get("attention_mask"), output, started)
                return output
            return _engine_generate(self, context, max_length, stop, generation_kwargs)

    return GeneratingHFLM


def _engine_generate(lm: Any, context, max_length: int, stop: list[str], generation_kwargs: dict):
    """The ids lm-eval's `generate` call would return [B, T + new], from hyla's inference engine. The stop strings
    do not stop it: lm-eval cuts every decoded continuation at them (`generate_until`), so generating on to the
    length limit or end-of-sequence gives the same text; only a stop string that is one special token, which
    decoding drops, ends a row's generation here."""
    from hyla.inference.generate import engine_request

    kwargs = dict(generation_kwargs)
    attention_mask = kwargs.pop("attention_mask", None)
    # lm-eval reads a temperature of 0 (its default) without do_sample as greedy decoding and then sends none.
    temperature = kwargs.pop("temperature", 0.0)
    if temperature == 0.0 and not kwargs.get("do_sample"):
        kwargs["do_sample"] = False
    else:
        kwargs["temperature"] = temperature
    call = {"input_ids": context, "attention_mask": attention_mask, "max_length": max_length,
            "pad_token_id": lm.tokenizer.pad_token_id, "use_cache": True, **kwargs}
    request = engine_request(lm.model, None, None, call)
    if request is None:
        raise ValueError(f"the inference engine cannot serve lm-eval's generation settings {kwargs}; "
                         "run with --generation hf (transformers' generate)")
    eos = request["eos_token_id"]
    eos = [eos] if isinstance(eos, int) else list(eos or [])
    eos += [token for token in special_stop_ids(lm.tokenizer, stop) if token not in eos]
    return lm.generation.batch(context, attention_mask, max_new_tokens=request["max_new_tokens"],
                               pad_token_id=request["pad_token_id"], sampling=request["sampling"],
                               eos_token_id=eos or None)


def special_stop_ids(tokenizer: Any, stop: list[str]) -> list[int]:
    """The ids of the stop strings that are one special token (lm-eval adds the tokenizer's end-of-sequence token to
    every request's). lm-eval decodes continuations without special tokens, so its cut at the stop strings cannot
    see these; on transformers' generate its stopping criteria end generation there (a batch once every row has
    produced one), so a row on the engine ends there."""
    ids = []
    for text in stop:
        encoded = tokenizer.encode(text, add_special_tokens=False)
        if len(encoded) == 1 and tokenizer.decode(encoded, skip_special_tokens=True) == "":
            ids.append(encoded[0])
    return ids


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
    generation: str | Generation | None = None,
) -> dict[str, Any]:
    """Evaluate `model` on lm-eval `tasks`; returns `{"summary": {"task/metric": value}, "tasks": {...},
    "n_samples": {...}, "generation": Generation.describe()}`.

    `include_default_tasks=False` skips indexing lm-eval's thousands of bundled task files (~15 s) when only the
    tasks under `include_path` are wanted. generation: how generative tasks generate (`lm_eval_model`).
    """
    lm_eval, _, task_manager_class = _import_lm_eval()
    task_manager = task_manager_class(include_path=include_path, include_defaults=include_default_tasks)
    unknown = [task for task in tasks if not task_manager.match_tasks([task])]
    if unknown:
        raise ValueError(f"lm-eval does not know the task(s) {', '.join(unknown)}")
    generation = as_generation(model, generation)
    wrapped = lm_eval_model(model, tokenizer, batch_size=batch_size, generation=generation)
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
    return {"summary": summary, "tasks": task_results, "n_samples": output.get("n-samples", {}),
            "generation": generation.describe()}
