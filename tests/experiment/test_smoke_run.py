"""The headline plan's smoke profile end to end on CPU with a tiny random teacher: teacher check, corpus with recall
documents, conversion through every stage, evaluations, report (a subset of its evaluations, ~2 minutes)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from experiment_helpers import PLANS
from offline_models import save_tiny_teacher

from hyla.cli import main as hyla_main


@pytest.mark.slow
def test_the_smoke_profile_runs_the_headline_plan_on_cpu(tmp_path, capsys):
    teacher = save_tiny_teacher(tmp_path / "teacher")
    text = tmp_path / "text"
    text.mkdir()
    docs = Path(__file__).resolve().parents[2] / "docs"
    for path in sorted(docs.glob("*.md")):
        (text / path.name).write_text(path.read_text())
    plan = next(path for path in PLANS if path.stem == "smollm2")
    run = tmp_path / "run"
    argv = ["experiment", "run", str(plan), "--out", str(run), "--profile", "smoke", "--set", f"text={text}",
            "--set", f"teacher={teacher}", "--only", "niah-main-SK1-short,ppl-main,report", "--poll", "0.5"]
    assert hyla_main(argv) == 0, (run / "runner.log").read_text()
    status = json.loads((run / "status.json").read_text())
    assert set(status["jobs"]) == {"teacher-check", "corpus", "convert", "niah-main-SK1-short", "ppl-main", "report"}
    assert json.loads((run / "teacher-hf" / "teacher-check.json").read_text())["passed"]
    corpus = json.loads((run / "corpus" / "manifest.json").read_text())
    assert [source["spec"].split("@")[0].split(":")[0] for source in corpus["sources"]] == [str(text), "recall",
                                                                                            "stdlib"]
    summary = json.loads((run / "report" / "summary.json").read_text())
    assert summary["conversions"]["main"]["stages"]["06-export"] and "main" in summary["ppl"]
    assert set(summary["niah"]["main"]["SK1"]) == {"512"}
    # A second run finds everything done and only remakes the report.
    capsys.readouterr()
    assert hyla_main(argv) == 0
    assert "done in an earlier run" in json.loads((run / "status.json").read_text())["jobs"]["convert"]["note"]
    assert (run / "logs" / "report.log").read_text().count("attempt 1") == 2
