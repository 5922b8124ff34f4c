"""Where an experiment run's seconds went, from the files a GPU session brings back: `runner.log` (each job's start and
end) and `results.tar.xz` (or an older run's `results.tar.gz`: the report's archive of plan, job logs, stage
manifests, evaluation results).

    python bench/run_breakdown.py docs/results/smollm2-135m/halo-sitting-d [--convert convert] [--model main]

Prints the critical path through the conversion job (the jobs it waited for, its stages from their manifests, the
gaps between them) and, for the evaluations of `--model` that started after it, each job's seconds: its first
progress bar's first step (compiling shows there), the evaluation's own generation totals (results.json) and the
rest (start-up, loading, building prompts, writing).
"""

from __future__ import annotations

import argparse
import datetime
import io
import json
import re
import tarfile
from pathlib import Path

_EVENT = re.compile(r"^\[(\S+) \+\s*([\d.]+) s\] (start|done|failed|skipped)\s+(\S+?)[;:( ]")
# A progress line's first step, e.g. "generate:   4%|##9   | 1/25 [00:53<21:22, 53.43s/it]".
_FIRST_STEP = re.compile(r"\| 1/\d+ \[(\d+):(\d+)<")
_STAGES = ("00-data", "01-align", "02-select", "03-distill", "04-finetune", "05-scaling", "06-export.stage")
TRAINING = ("01-align", "03-distill", "04-finetune")


def job_spans(runner_log: str) -> dict[str, list[float]]:
    """Job -> [start, end] seconds from the run's start (the last attempt)."""
    spans: dict[str, list[float]] = {}
    for line in runner_log.splitlines():
        match = _EVENT.match(line)
        if match is None:
            continue
        _, moment, event, name = match.groups()
        if event == "start":
            spans[name] = [float(moment), None]
        elif name in spans:
            spans[name][1] = float(moment)
    return spans


def _utc(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp)


def read_archive(path: Path) -> dict[str, bytes]:
    with tarfile.open(path) as archive:
        return {member.name.removeprefix("./"): archive.extractfile(member).read()
                for member in archive.getmembers() if member.isfile() and not member.name.endswith(".png")}


def first_step_seconds(log: str) -> float | None:
    match = _FIRST_STEP.search(log.replace("\r", "\n"))
    return None if match is None else 60 * int(match.group(1)) + int(match.group(2))


def breakdown(folder: Path, convert: str = "convert", model: str = "main") -> list[tuple[str, float, str]]:
    """(item, seconds, where the number comes from) along the run's critical path."""
    runner_log = (folder / "runner.log").read_text()
    archive = next(path for name in ("results.tar.xz", "results.tar.gz") if (path := folder / name).is_file())
    files = read_archive(archive)
    spans = job_spans(runner_log)
    run_start = _utc(runner_log.splitlines()[0][1:].split(" ")[0])
    rows = []
    start, end = spans[convert]
    if start > 0:
        rows.append((f"before {convert} (the jobs it waited for)", start, "runner.log"))
    manifests = {stage: json.loads(files[f"{model}/{stage}/manifest.json"]) for stage in _STAGES
                 if f"{model}/{stage}/manifest.json" in files}
    cursor = start
    for stage, manifest in manifests.items():
        seconds = manifest["results"].get("seconds", 0.0)
        finished = (_utc(manifest["created_utc"]) - run_start).total_seconds()
        gap = finished - seconds - cursor
        if gap > 1:
            label = "start-up (imports, teacher, plan)" if stage == "00-data" else f"between stages, before {stage}"
            rows.append((f"{convert}: {label}", gap, "manifest created_utc - seconds"))
        kind = "training" if stage in TRAINING else "not training"
        rows.append((f"{convert}: {stage} ({kind})", seconds, f"{stage}/manifest.json results.seconds"))
        cursor = finished
    rows.append((f"{convert}: after the last stage (summary, exit)", end - cursor, "runner.log - manifest"))
    evals = {name: span for name, span in spans.items() if span[0] >= end and name.split("-")[1:2] == [model]}
    if evals:
        slowest = max(evals, key=lambda name: evals[name][1] or 0)
        rows.append((f"evaluations of {model} side by side (slowest: {slowest})",
                     evals[slowest][1] - evals[slowest][0], "runner.log"))
        for name in sorted(evals, key=lambda n: -(evals[n][1] - evals[n][0])):
            total = evals[name][1] - evals[name][0]
            log = files.get(f"logs/{name}.log", b"").decode("utf-8", "replace")
            first = first_step_seconds(log)
            generation = json.loads(files.get(f"evals/{name}/results.json", b"{}")).get("generation") or {}
            note = f"first step {first} s" if first is not None else "no progress line"
            if generation.get("seconds"):
                note += (f"; generation {generation['seconds']:.1f} s (prefill {generation['prefill_s']:.1f}, "
                         f"decode {generation['decode_s']:.1f}); rest {total - generation['seconds']:.1f} s")
            rows.append((f"  {name}", total, note))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", type=Path, help="a folder with runner.log and results.tar.xz (or .tar.gz)")
    parser.add_argument("--convert", default="convert", help="the conversion job")
    parser.add_argument("--model", default="main", help="the conversion's folder and evaluation label")
    args = parser.parse_args()
    rows = breakdown(args.folder, args.convert, args.model)
    training = sum(seconds for item, seconds, _ in rows if "(training)" in item)
    path = sum(seconds for item, seconds, _ in rows if not item.startswith("  ") and "(training)" not in item)
    out = io.StringIO()
    for item, seconds, source in rows:
        out.write(f"{item:<62} {seconds:7.1f} s   {source}\n")
    out.write(f"{'training on the critical path':<62} {training:7.1f} s\n")
    out.write(f"{'not training on the critical path':<62} {path:7.1f} s\n")
    print(out.getvalue(), end="")


if __name__ == "__main__":
    main()
