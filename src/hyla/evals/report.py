"""Result folders: atomic JSON, self-describing metadata, plots, and side-by-side comparison.

An evaluation folder holds `results.json` (metrics plus the resolved settings, the exact command, package versions
and the git SHA) and PNG plots. Files are written to a temporary name and renamed, so a crash never leaves a
half-written result behind.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

# Re-exported: evaluation code imports the output helpers from here.
from hyla.outputs import (
    git_sha,
    new_figure,
    package_versions,
    run_metadata,
    save_figure,
    write_atomic,
    write_json,
)

RESULTS_FILE = "results.json"


def read_results(path: str | Path) -> dict[str, Any]:
    """Read a `results.json`, given the file or the folder that holds it."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no results file at {path}")
    return json.loads(path.read_text())


def flatten_metrics(results: dict[str, Any]) -> dict[str, float]:
    """The headline numbers of a results.json as `{"kind/task/metric": value}`, for comparison tables."""
    flat: dict[str, float] = {}
    kind = results.get("kind", "eval")
    for name, value in results.get("summary", {}).items():
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            flat[f"{kind}/{name}"] = float(value)
    return flat


def compare_results(result_paths: list[str | Path]) -> dict[str, Any]:
    """Line up the headline metrics of several result folders: `{"columns": [...], "rows": {metric: [values]}}`."""
    columns, tables = [], []
    for path in result_paths:
        results = read_results(path)
        columns.append(results.get("model_label") or str(path))
        tables.append(flatten_metrics(results))
    metric_names = sorted({name for table in tables for name in table})
    rows = {name: [table.get(name) for table in tables] for name in metric_names}
    return {"columns": columns, "rows": rows}


def print_comparison(comparison: dict[str, Any]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="hyla eval compare")
    table.add_column("metric")
    for column in comparison["columns"]:
        table.add_column(column, justify="right")
    for name, values in comparison["rows"].items():
        table.add_row(name, *("—" if value is None else f"{value:.4f}" for value in values))
    Console().print(table)


__all__ = [
    "RESULTS_FILE", "compare_results", "flatten_metrics", "git_sha", "new_figure", "package_versions",
    "print_comparison", "read_results", "run_metadata", "save_figure", "write_atomic", "write_json",
]
