"""Stage-1 alignment of the conversions in a run, for `hyla experiment report`: each conversion's alignment loss and
gradient norm by step, its per-layer error relative to the teacher's output energy at the first and last step, and
what the twin init (`model.twin_init`) changed before the first step; one plot (`align.png`) puts the conversions
side by side, e.g. two runs with `model.twin_init=none` and `=lstsq` on the same data."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

ALIGN_STAGE = "01-align"


def _rows(path: Path) -> list[dict]:
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                break  # a line cut by a kill: the steps before it stand
    return rows


def relative_errors(row: dict) -> list[float] | None:
    """Per layer, mse_i / energy_i of one metrics row (None for runs that did not log the energies)."""
    layers = sorted(int(key[4:]) for key in row if key.startswith("mse_"))
    if not layers or any(f"energy_{i:02d}" not in row for i in layers):
        return None
    return [row[f"mse_{i:02d}"] / max(row[f"energy_{i:02d}"], 1e-30) for i in layers]


def _median(values: list[float] | None) -> float | None:
    return statistics.median(values) if values else None


def collect_alignment(folder: Path) -> dict[str, Any] | None:
    """A conversion folder's stage-1 record (complete or not), or None when it has no alignment metrics."""
    metrics = folder / ALIGN_STAGE / "metrics.jsonl"
    if not metrics.is_file():
        return None
    rows = [row for row in _rows(metrics) if "loss" in row and "step" in row]
    if not rows:
        return None
    try:
        manifest = json.loads((folder / ALIGN_STAGE / "manifest.json").read_text())
    except (OSError, json.JSONDecodeError):
        manifest = None
    init = ((manifest or {}).get("results") or {}).get("init")
    first, last = relative_errors(rows[0]), relative_errors(rows[-1])
    return {
        "complete": manifest is not None and manifest.get("status") == "complete",
        "twin_init": init.get("mode") if init else None,
        "steps": [row["step"] for row in rows], "loss": [row["loss"] for row in rows],
        "grad_norm": [row.get("grad_norm") for row in rows],
        "relative_error_first": first, "relative_error_last": last,
        "median_relative_error_first": _median(first), "median_relative_error_last": _median(last),
        "init_median_before": _median(init.get("relative_error_before")) if init else None,
        "init_median_after": _median(init.get("relative_error_after")) if init else None,
    }


def alignment_lines(alignment: dict[str, dict], cell) -> list[str]:
    """The markdown table of `hyla experiment report` (`cell` formats a number or None)."""
    if not alignment:
        return []
    rows = [f"| {name} | {a['twin_init'] or '-'} | {a['steps'][-1]}{'' if a['complete'] else ' (running)'} | "
            f"{cell(a['init_median_before'], 3)} -> {cell(a['init_median_after'], 3)} | "
            f"{cell(a['loss'][0], 4)} -> {cell(a['loss'][-1], 4)} | "
            f"{cell(a['median_relative_error_first'], 3)} -> {cell(a['median_relative_error_last'], 3)} |"
            for name, a in sorted(alignment.items())]
    return ["## Stage-1 alignment (error / teacher output energy: median over layers)", "",
            "| conversion | twin init | steps | init error before -> after | loss first -> last | "
            "error first -> last step |", "|---|---|---|---|---|---|", *rows, ""]


def plot_alignment(alignment: dict[str, dict], path: Path) -> Path:
    """Loss and gradient norm by step, and the per-layer error at the first and the last logged step, one line (a
    colour) per conversion."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (loss_axis, norm_axis, layer_axis) = plt.subplots(1, 3, figsize=(15, 4))
    for name, a in sorted(alignment.items()):
        label = f"{name} (twin init {a['twin_init']})" if a["twin_init"] else name
        line, = loss_axis.plot(a["steps"], a["loss"], label=label)
        norms = [(step, norm) for step, norm in zip(a["steps"], a["grad_norm"]) if norm is not None]
        if norms:
            norm_axis.plot(*zip(*norms), color=line.get_color(), label=label)
        if a["relative_error_first"] is not None:
            layers = range(len(a["relative_error_first"]))
            layer_axis.plot(layers, a["relative_error_last"], marker=".", color=line.get_color(),
                            label=f"{name}, step {a['steps'][-1]}")
            layer_axis.plot(layers, a["relative_error_first"], linestyle=":", color=line.get_color(),
                            label=f"{name}, step {a['steps'][0]}")
    loss_axis.set(yscale="log", xlabel="step", ylabel="alignment loss (sum of per-layer MSE)")
    norm_axis.set(yscale="log", xlabel="step", ylabel="gradient norm")
    layer_axis.set(yscale="log", xlabel="layer", ylabel="MSE / teacher output energy")
    for axis in (loss_axis, norm_axis, layer_axis):
        if axis.get_legend_handles_labels()[0]:
            axis.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
    return path
