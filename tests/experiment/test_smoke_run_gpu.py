"""The halo-smollm2 recipe's plan end to end on CUDA at its smoke profile's toy sizes: every CUDA path a real
conversion takes (the twin init's least squares, alignment and distillation on the training fast path, the selection
stage's NIAH on the inference engine with its compiled prefill, the scaling stage's candidates, the evaluations),
on a tiny random teacher, before a full-budget sitting spends its minutes finding a device bug. It takes over 7
minutes on an H200 (every job is a process that compiles its own kernels): run it alone after a change to a CUDA
path (`TESTS=tests/experiment/test_smoke_run_gpu.py TEST_WORKERS=1 bash scripts/gpu-session/gpu-tests.sh`, carry
".whl" and ".gpu-inputs/b"), not inside a conversion sitting."""

from __future__ import annotations

import json

import pytest
from experiment_helpers import PLANS
from offline_models import save_tiny_teacher
from test_smoke_run import docs_text

from hyla.cli import main as hyla_main

pytestmark = pytest.mark.gpu


def test_the_recipe_plan_runs_on_cuda(tmp_path):
    teacher = save_tiny_teacher(tmp_path / "teacher")
    text = docs_text(tmp_path / "text")
    plan = next(path for path in PLANS if path.stem == "halo-smollm2")
    run = tmp_path / "run"
    argv = ["experiment", "run", str(plan), "--out", str(run), "--profile", "smoke", "--set", f"text={text}",
            "--set", f"teacher={teacher}", "--set", f"text_cache={tmp_path / 'no-cache'}",
            "--set", "device=cuda", "--set", "dtype=bfloat16",
            "--only", "niah-main-SK1-short,report", "--poll", "0.5"]
    code = hyla_main(argv)
    logs = "\n".join(path.read_text()[-6000:] for path in sorted((run / "logs").glob("*.log")))
    assert code == 0, logs
    status = json.loads((run / "status.json").read_text())
    assert {name for name, job in status["jobs"].items() if job["state"] == "done"} == {
        "teacher-check", "convert", "niah-main-SK1-short", "report"}
    conversion = json.loads((run / "main" / "06-export" / "conversion.json").read_text())
    assert conversion["plan"]["model"]["twin_init"] == "lstsq"
    results = json.loads((run / "evals" / "niah-main-SK1-short" / "results.json").read_text())
    assert results["generation_path"] == "engine", results["generation_path"]
