"""The halo-smollm2 recipe's plan end to end on CUDA at its smoke profile's toy sizes: every CUDA path a real
conversion takes, on a tiny random teacher, before a full-budget sitting spends its minutes finding a device bug.
Those paths: the twin init's least squares, alignment and distillation on the training fast path, the selection
stage's scoring (NIAH on the inference engine with its compiled prefill, CSR), the scaling stage's candidates (their
losses in the stage, the c(L) candidate's NIAH as the plan's evaluation of the export), and the converted model's NIAH
at both spans, CSR and loss by position. It takes over 8 minutes on an H200 (every job is
a process that compiles its own kernels). Run it alone after a change to a CUDA path
(`TESTS=tests/experiment/test_smoke_run_gpu.py TEST_WORKERS=1 bash scripts/gpu-session/gpu-tests.sh`, carry ".whl"
and ".gpu-inputs/b"), or beside a conversion sitting's run, where it reaches the later stages first
(`SMOKE=1 bash scripts/gpu-session/experiment.sh stash`)."""

from __future__ import annotations

import json

import pytest
from experiment_helpers import PLANS
from offline_models import save_tiny_teacher
from test_smoke_run import PEAKED, docs_text, recipe_smoke_argv

from hyla.cli import main as hyla_main

pytestmark = pytest.mark.gpu


def test_the_recipe_plan_runs_on_cuda(tmp_path):
    run = tmp_path / "run"
    # halo, not the smoke profile's uniform rule: the selection scores every variant (bf16 on the engine, CSR).
    code = hyla_main(recipe_smoke_argv(tmp_path, "niah-main-SK1-*,niah-scaling-cL,csr-main,ppl-main,report", "device=cuda",
                                          "dtype=bfloat16", "attention_layers=halo"))
    logs = "\n".join(path.read_text()[-6000:] for path in sorted((run / "logs").glob("*.log")))
    assert code == 0, logs
    status = json.loads((run / "status.json").read_text())
    assert {name for name, job in status["jobs"].items() if job["state"] == "done"} == {
        "teacher-check", "convert", "niah-main-SK1-short", "niah-main-SK1-long", "niah-scaling-cL", "csr-main",
        "ppl-main", "report"}
    conversion = json.loads((run / "main" / "06-export" / "conversion.json").read_text())
    assert conversion["plan"]["model"]["twin_init"] == "lstsq"
    selection = json.loads((run / "main" / "02-select" / "selection.json").read_text())
    assert selection["method"] == "halo" and len(selection["layers"]) == selection["num_layers"]
    for span in ("short", "long"):
        results = json.loads((run / "evals" / f"niah-main-SK1-{span}" / "results.json").read_text())
        assert results["generation_path"] == "engine", results["generation_path"]


def test_the_seed003_plan_converts_and_evaluates_gla_and_gdn_on_cuda(tmp_path):
    """The seed003-smollm2 plan's smoke profile on CUDA: GLA's and GDN's twins and hybrids through stages 1-2 on the
    training fast path (compiled blocks around fla's chunk kernels), then EME (SWLA + c(L)) on the inference engine.
    Beside a sitting's run it reaches the GLA conversion minutes before the run does: `SMOKE=1 SMOKE_TESTS=SEED003
    bash scripts/gpu-session/experiment.sh stash`, SEED003 being
    tests/experiment/test_smoke_run_gpu.py::test_the_seed003_plan_converts_and_evaluates_gla_and_gdn_on_cuda."""
    teacher = save_tiny_teacher(tmp_path / "teacher", initializer_range=PEAKED)
    text = docs_text(tmp_path / "text")
    plan = next(path for path in PLANS if path.stem == "seed003-smollm2")
    run = tmp_path / "run"
    evals = ["niah-gla-swla+log", "niah-gdn-swla+log", "analyze-gla-512-eme", "analyze-gdn-512-eme"]
    variables = [f"text={text}", f"teacher={teacher}", f"text_cache={tmp_path / 'no-cache'}", "device=cuda",
                 "dtype=bfloat16"]
    argv = ["experiment", "run", str(plan), "--out", str(run), "--profile", "smoke",
            *[arg for item in variables for arg in ("--set", item)],
            "--only", ",".join(["convert-gla", "convert-gdn", *evals, "report"]), "--poll", "0.5"]
    code = hyla_main(argv)
    logs = "\n".join(path.read_text()[-6000:] for path in sorted((run / "logs").glob("*.log")))
    assert code == 0, logs
    status = json.loads((run / "status.json").read_text())
    assert {name for name, job in status["jobs"].items() if job["state"] == "done"} == {
        "teacher-check", "data", "copy-gla", "copy-gdn", "convert-gla", "convert-gdn", *evals, "report"}
    for mixer in ("gla", "gdn"):
        log = (run / "logs" / f"convert-{mixer}.log").read_text()
        assert "[distill] fast path: compiled blocks" in log and "compiled blocks off" not in log
        results = json.loads((run / "evals" / f"niah-{mixer}-swla+log" / "results.json").read_text())
        assert results["generation_path"] == "engine", results["generation_path"]
        # the head analysis's GLA / GDN forms on CUDA (fla's kernels in the forward), under EME
        heads = json.loads((run / "evals" / f"analyze-{mixer}-512-eme" / "results.json").read_text())["heads"]
        assert {record["group"] for record in heads} == {mixer, "attention"}
        assert all(0.0 <= record["hit_rate"] <= 1.0 and 0.0 <= record["answer_entropy"] <= 1.0 for record in heads)
