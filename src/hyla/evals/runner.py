"""Glue between the CLI and the evaluations: load a model with its overrides, run, write the result folder."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hyla.evals.report import RESULTS_FILE, run_metadata, write_atomic, write_json


def model_label(spec: str) -> str:
    """A short name for a model spec: the folder or file name, or the alias itself."""
    path = Path(spec.rstrip("/"))
    return path.stem if path.suffix == ".gguf" else path.name or spec


def load_for_eval(
    spec: str, *, dtype: str = "float32", device: str = "cpu", **overrides: Any
) -> tuple[Any, Any, dict[str, Any]]:
    """(model, tokenizer, the inference options given) for a model spec, ready to evaluate.

    `overrides` are inference options such as `logit_scaling_a` or `eme_window` (`hyla.evals.overrides`): the
    loaded model runs with them, its config stays as saved.
    """
    from hyla.evals.overrides import apply_inference_overrides
    from hyla.models.loading import load_model

    model, tokenizer = load_model(spec, dtype=dtype, device=device)
    applied = apply_inference_overrides(model, **overrides)
    return model, tokenizer, applied


def save_run(
    out_dir: str | Path, kind: str, label: str, settings: dict[str, Any], result: dict[str, Any]
) -> Path:
    """Write `results.json` (metrics, settings, command, versions, git SHA) into `out_dir`; returns its path."""
    out_dir = Path(out_dir)
    payload = {"kind": kind, "model_label": label, **run_metadata(settings), **result}
    path = out_dir / RESULTS_FILE
    write_json(path, payload)
    return path


def save_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    write_atomic(path, "".join(json.dumps(row) + "\n" for row in rows).encode())


def print_settings(kind: str, settings: dict[str, Any]) -> None:
    print(f"hyla eval {kind}: " + ", ".join(f"{name}={value}" for name, value in settings.items()), flush=True)


def print_summary(summary: dict[str, Any], path: Path) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(show_header=True)
    table.add_column("metric")
    table.add_column("value", justify="right")
    for name, value in summary.items():
        table.add_row(name, f"{value:.4f}" if isinstance(value, float) else str(value))
    console = Console()
    console.print(table)
    console.print(f"wrote {path}")
