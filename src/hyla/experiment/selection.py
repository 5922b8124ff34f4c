"""The layer selection of the conversions in a run, for `hyla experiment report`: each variant's recall and CSR with
their standard errors, the noise-aware score and rank, the chosen layers and which of them noise chose; a selection
still running is read from its partial scores (`scores.partial.json`), so a cut run still shows what it measured."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

SELECT_STAGE = "02-select"


def _read(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def collect_selection(folder: Path) -> dict[str, Any] | None:
    """A conversion folder's selection record, or None when it scored no variant (rules that measure nothing, such
    as `uniform` or a list of layers, have no rows)."""
    stage = folder / SELECT_STAGE
    report = _read(stage / "selection.json")
    complete = report is not None
    payload = report if complete else _read(stage / "scores.partial.json")
    if payload is None or not payload.get("layers"):
        return None
    keys = ("layer", "recall", "recall_stderr", "csr", "csr_stderr", "seconds", "noise_aware_score",
            "noise_aware_rank", "alignment_error", "chosen", "chosen_by_noise", "near_miss")
    rows = [{key: row.get(key) for key in keys} for row in payload["layers"]]
    teacher = payload.get("teacher") or {}
    return {
        "complete": complete, "method": payload.get("method"), "chosen": payload.get("chosen"),
        "teacher_recall": teacher.get("recall"), "teacher_recall_stderr": teacher.get("recall_stderr"),
        "teacher_csr": teacher.get("csr"), "teacher_csr_stderr": teacher.get("csr_stderr"),
        "num_layers": payload.get("num_layers"), "layers": rows, "notes": payload.get("notes") or [],
        "noise": payload.get("noise"),
    }


def _value(value: float | None, stderr: float | None, cell) -> str:
    if value is None:
        return "-"
    return f"{cell(value, 3)} ± {cell(stderr, 3)}" if stderr is not None else cell(value, 3)


def selection_lines(selection: dict[str, dict], cell) -> list[str]:
    """The markdown of `hyla experiment report`: per conversion, the teacher and one row per scored variant (the
    teacher with only that layer replaced by its stage-1 twin); `cell` formats a number or None."""
    lines = []
    for name, record in sorted(selection.items()):
        scored = len(record["layers"])
        state = (f"chosen {record['chosen']}" if record["complete"]
                 else f"running or cut: {scored} of {record['num_layers']} variants scored")
        lines += [f"## Layer selection: {name} ({record['method'] or 'halo'}, {state})", "",
                  f"Teacher: recall {_value(record['teacher_recall'], record['teacher_recall_stderr'], cell)}, "
                  f"CSR {_value(record['teacher_csr'], record['teacher_csr_stderr'], cell)}.", "",
                  "| layer | recall | CSR | noise-aware s_i | rank | alignment error | chosen | seconds |",
                  "|---|---|---|---|---|---|---|---|"]
        for row in sorted(record["layers"], key=lambda row: row["layer"]):
            chosen = ("yes (by noise)" if row["chosen_by_noise"] and row["chosen"] else
                      "yes" if row["chosen"] else "near miss" if row["near_miss"] else "")
            lines.append(f"| {row['layer']} | {_value(row['recall'], row['recall_stderr'], cell)} | "
                         f"{_value(row['csr'], row['csr_stderr'], cell)} | {cell(row['noise_aware_score'], 3)} | "
                         f"{row['noise_aware_rank'] or '-'} | {cell(row['alignment_error'], 3)} | {chosen} | "
                         f"{cell(row['seconds'], 1)} |")
        lines += ["", *(f"- {note}" for note in record["notes"]), ""] if record["notes"] else [""]
    return lines
