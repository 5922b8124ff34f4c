"""pytest plugin: with HYLA_TEST_REPORT=FILE, each test's outcome is appended to FILE as soon as it is known, with
the traceback of every failure. A run stopped by a time limit (a GPU call's) keeps what it learned; pytest's own
summary and tracebacks come only at the end, and are lost with the run. Under xdist only the controller writes."""

from __future__ import annotations

import os

_path: str | None = None


def pytest_configure(config):
    global _path
    _path = None if hasattr(config, "workerinput") else os.environ.get("HYLA_TEST_REPORT") or None


def pytest_runtest_logreport(report):
    if _path is None or (report.when != "call" and not report.failed and not report.skipped):
        return
    outcome = "ERROR" if report.failed and report.when != "call" else report.outcome.upper()
    lines = [f"{outcome} {report.nodeid} ({report.when}, {report.duration:.1f} s)"]
    if report.failed:
        lines.append(report.longreprtext)
    elif report.skipped and isinstance(report.longrepr, tuple):
        lines.append(f"  reason: {report.longrepr[2]}")
    with open(_path, "a", encoding="utf-8") as handle:
        handle.write("\n".join(lines) + "\n")
