"""`hyla experiment status RUN`: where a run stands, from its `status.json` and job logs."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from hyla.experiment.runner import process_alive

# Progress bars rewrite their line with carriage returns; escape sequences colour it.
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def read_status(run_dir: str | Path) -> dict[str, Any]:
    """The run's status.json, with `runner.alive` added; FileNotFoundError when the folder holds no run."""
    path = Path(run_dir) / "status.json"
    if not path.is_file():
        raise FileNotFoundError(f"{run_dir} holds no experiment run (no status.json); start one with "
                                f"`hyla experiment run PLAN --out {run_dir}`")
    status = json.loads(path.read_text())
    runner = status["runner"]
    runner["alive"] = runner["state"] == "running" and process_alive(runner.get("pid"))
    if runner["state"] == "running" and not runner["alive"]:
        runner["state"] = "gone"  # killed without a chance to write its end
    return status


def last_line(log: Path, limit: int = 20_000) -> str:
    """The last non-empty line of a log, progress-bar redraws included."""
    try:
        with open(log, "rb") as handle:
            handle.seek(0, 2)
            handle.seek(max(0, handle.tell() - limit))
            tail = handle.read().decode("utf-8", "replace")
    except OSError:
        return ""
    lines = [line.strip() for line in re.split(r"[\r\n]", _ANSI.sub("", tail)) if line.strip()]
    return lines[-1] if lines else ""


def _seconds(value: float | None) -> str:
    if value is None:
        return "-"
    value = int(value)
    return f"{value // 3600}:{value // 60 % 60:02d}:{value % 60:02d}" if value >= 3600 else (
        f"{value // 60}:{value % 60:02d}" if value >= 60 else f"{value} s")


def format_status(run_dir: str | Path, status: dict[str, Any], *, width: int = 60) -> str:
    """A table of every job: kind, state, time, exit code, and the last log line of running and failed jobs."""
    run_dir = Path(run_dir)
    runner, counts = status["runner"], status["counts"]
    describe = {"running": f"running (pid {runner['pid']})", "gone": "not running (the runner was killed; run the "
                "plan again to go on)", "interrupted": "stopped (run the plan again to go on)",
                "done": "finished, every job succeeded", "failed": "finished, some jobs did not succeed"}
    lines = [f"{status['plan']}{' (profile ' + status['profile'] + ')' if status.get('profile') else ''}: "
             f"{describe.get(runner['state'], runner['state'])}; updated {runner['updated_utc']}, "
             f"{_seconds(runner['seconds'])} in the runner",
             f"{counts['done']}/{sum(counts.values())} done, {counts['running']} running, {counts['waiting']} waiting, "
             f"{counts['failed']} failed, {counts['skipped']} skipped",
             ""]
    name_width = max(len("job"), *(len(name) for name in status["jobs"]))
    lines.append(f"{'job':{name_width}s}  {'kind':5s}  {'state':7s}  {'time':>7s}  exit  note")
    for name, job in status["jobs"].items():
        note = job.get("note") or ""
        if job["state"] in ("running", "failed"):
            tail = last_line(run_dir / job["log"])
            note = tail[-width:] if job["state"] == "running" and tail else (note + (f": {tail[-width:]}" if tail
                                                                                      else ""))
        code = "" if job["returncode"] is None else str(job["returncode"])
        lines.append(f"{name:{name_width}s}  {job['kind']:5s}  {job['state']:7s}  {_seconds(job['seconds']):>7s}  "
                     f"{code:>4s}  {note}".rstrip())
    return "\n".join(lines)
