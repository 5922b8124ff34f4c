"""The plans' smoke profiles end to end on CPU with a tiny random teacher: the headline plan (teacher check, corpus
with recall documents, conversion through every stage, evaluations, report) and the halo-smollm2 recipe's plan (the
recipe's conversion on stand-in texts, evaluations, report), each with a subset of its evaluations (~2 minutes each),
and the seed003-smollm2 plan (three mixers at one budget and one data stage, stage 3 skipped, three of its thirteen
NIAH rows, one per mixer and a mode each, one table: ~3 minutes on 2 cores)."""

from __future__ import annotations

import json
import tarfile
from pathlib import Path

import pytest
from experiment_helpers import PLANS
from offline_models import save_tiny_teacher

from hyla.cli import main as hyla_main


# The tiny teacher's initial std (transformers' default 0.02 makes its logits nearly equal: its students' held-out
# loss then sits ~1e-3 from ln V, where the scaling stage's collapse check looks): logits of std ~1, as a trained
# model's, whatever text the run reads (the repository's docs, which change).
PEAKED = 0.3


def docs_text(folder: Path) -> Path:
    """The repository's docs pages as a folder of training text."""
    folder.mkdir()
    docs = Path(__file__).resolve().parents[2] / "docs"
    for path in sorted(docs.glob("*.md")):
        (folder / path.name).write_text(path.read_text())
    return folder


@pytest.mark.slow
def test_the_smoke_profile_runs_the_headline_plan_on_cpu(tmp_path, capsys):
    teacher = save_tiny_teacher(tmp_path / "teacher", initializer_range=PEAKED)
    text = docs_text(tmp_path / "text")
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


def recipe_smoke_argv(tmp_path: Path, only: str, *sets: str) -> list[str]:
    """`hyla experiment run` of the recipe plan's smoke profile into tmp_path/run, on a tiny random teacher and this
    repository's docs as text; `sets`: more NAME=VALUE variables."""
    teacher = save_tiny_teacher(tmp_path / "teacher", initializer_range=PEAKED)
    text = docs_text(tmp_path / "text")
    plan = next(path for path in PLANS if path.stem == "halo-smollm2")
    variables = [f"text={text}", f"teacher={teacher}", f"text_cache={tmp_path / 'no-cache'}", *sets]
    return ["experiment", "run", str(plan), "--out", str(tmp_path / "run"), "--profile", "smoke",
            *[arg for item in variables for arg in ("--set", item)], "--only", only, "--poll", "0.5"]


@pytest.mark.slow
def test_the_smoke_profile_runs_the_recipe_plan_on_cpu(tmp_path):
    run = tmp_path / "run"
    # One branch: a second stage 3 (another lr) from the main conversion's distilled student.
    branches = '[{"name": "lr", "from": "finetune", "args": ["--set", "finetune.lr=1e-4"]}]'
    argv = recipe_smoke_argv(tmp_path, "niah-*-SK1-short,csr-main,report", f"branches={branches}")
    assert hyla_main(argv) == 0, (run / "runner.log").read_text()
    status = json.loads((run / "status.json").read_text())
    assert {name for name, job in status["jobs"].items() if job["state"] == "done"} == {
        "teacher-check", "convert", "niah-teacher-SK1-short", "niah-main-SK1-short", "csr-main", "report",
        "snapshot-distill", "niah-distill-SK1-short", "check-lr", "copy-lr", "convert-lr", "niah-lr-SK1-short",
        "niah-samples"}
    # The prompts were built once, before any evaluation: each evaluation read them.
    assert "SK1 512: 1 samples built" in (run / "logs" / "niah-samples.log").read_text()
    # The branch's check ran before the run started (preflight), then as a job with a log of its own.
    assert "the stages before it have the same settings" in (run / "logs" / "check-lr.log").read_text()
    branch = run / "branch-lr"
    assert "[distill] complete" in (run / "logs" / "convert-lr.log").read_text()
    assert ((branch / "03-distill" / "student.safetensors").read_bytes()
            == (run / "main" / "03-distill" / "student.safetensors").read_bytes())
    lrs = [json.loads(line)["lr"] for line in (branch / "04-finetune" / "metrics.jsonl").read_text().splitlines()]
    assert max(lrs) > 5e-5  # the branch's stage 3 (the recipe's: 1e-5)
    stages = run / "main"
    data = json.loads((stages / "00-data" / "manifest.json").read_text())["results"]
    assert sorted(data["corpora"]) == ["long", "main", "scaling"]
    conversion = json.loads((stages / "06-export" / "conversion.json").read_text())
    assert conversion["plan"]["preset"] == "halo-smollm2" and conversion["plan"]["model"]["twin_init"] == "lstsq"
    finetune = json.loads((stages / "04-finetune" / "manifest.json").read_text())["results"]["data"]
    assert finetune["corpus"] == "long" and finetune["align_documents"]
    scaling = json.loads((stages / "05-scaling" / "manifest.json").read_text())["results"]
    assert scaling["source"] == "../00-data/scaling" and "c(L)" in scaling["loss_by_position"]
    # the recipe chooses a by the answer loss of recall documents (the smoke profile's on its own text)
    assert scaling["criterion"] == "recall" and set(scaling["recall_loss_by_a"]) == set(scaling["loss_by_a"])
    # The distilled student, snapshot before stage 3, as an evaluated model of its own beside the final one.
    assert json.loads((run / "main-distill" / "snapshot.json").read_text())["stage"] == "distill"
    summary = json.loads((run / "report" / "summary.json").read_text())
    assert set(summary["niah"]) == {"teacher", "main", "distill", "lr"} and "main" in summary["csr"]
    assert summary["conversions"]["branch-lr"]["stages"]["06-export"]
    assert set(summary["niah"]["distill"]["SK1"]) == set(summary["niah"]["main"]["SK1"]) == {"512"}
    assert "| distill | SK1 |" in (run / "report" / "report.md").read_text()
    with tarfile.open(run / "report" / "results.tar.xz") as archive:
        assert "main-distill/snapshot.json" in archive.getnames()
    assert summary["alignment"]["main"]["twin_init"] == "lstsq"
    assert (run / "report" / "align.png").is_file()


@pytest.mark.slow
def test_the_smoke_profile_runs_the_seed003_plan_on_cpu(tmp_path):
    teacher = save_tiny_teacher(tmp_path / "teacher", initializer_range=PEAKED)
    text = docs_text(tmp_path / "text")
    plan = next(path for path in PLANS if path.stem == "seed003-smollm2")
    run = tmp_path / "run"
    # One row of each mixer, each in another mode (the others differ only in their options: test_shipped_plans)
    evals = ["niah-lightning-per-query", "niah-gla-swla+log", "niah-gdn-log"]
    analyses = ["analyze-gla-512-eme", "analyze-gdn-512-direct"]  # one head analysis each way
    argv = ["experiment", "run", str(plan), "--out", str(run), "--profile", "smoke", "--set", f"text={text}",
            "--set", f"teacher={teacher}", "--set", f"text_cache={tmp_path / 'no-cache'}",
            "--only", ",".join(["convert-*", *evals, *analyses, "report"]), "--poll", "0.5"]
    assert hyla_main(argv) == 0, (run / "runner.log").read_text()
    status = json.loads((run / "status.json").read_text())
    assert {name for name, job in status["jobs"].items() if job["state"] == "done"} == {
        "teacher-check", "data", "copy-gla", "copy-gdn", "convert-lightning", "convert-gla", "convert-gdn", *evals,
        *analyses, "niah-samples", "report"}
    data = json.loads((run / "lightning" / "00-data" / "manifest.json").read_text())
    assert sorted(data["results"]["corpora"]) == ["main", "scaling"]  # no stage-3 corpus
    for mixer in ("lightning", "gla", "gdn"):
        # Every conversion used the one data stage, trained at the 256-token window and skipped stage 3.
        assert "[data] complete" in (run / "logs" / f"convert-{mixer}.log").read_text()
        assert json.loads((run / mixer / "00-data" / "manifest.json").read_text()) == data
        distill = json.loads((run / mixer / "03-distill" / "manifest.json").read_text())
        assert distill["settings"]["budget"]["seq_len"] == 256 and distill["results"]["tokens"] == 2048
        finetune = json.loads((run / mixer / "04-finetune" / "manifest.json").read_text())["results"]
        assert finetune["skipped"] and finetune["tokens"] == 0
        scaling = json.loads((run / mixer / "05-scaling" / "manifest.json").read_text())["results"]
        assert scaling["chosen_a"] in (20, 500) and scaling["per_length_train_length"] == 256
        config = json.loads((run / mixer / "06-export" / "config.json").read_text())
        layer_types = config["hypenet_layer_types"]
        assert layer_types[1] == "attention" and layer_types.count(mixer) == 3
    # One set of prompts for every row: a file a task and length, built once.
    assert len(list((run / "niah-samples").iterdir())) == 6
    summary = json.loads((run / "report" / "summary.json").read_text())
    assert set(summary["niah"]) == {name.removeprefix("niah-") for name in evals}
    assert all(set(summary["niah"][label][task]) == {"512", "1024"} for label in summary["niah"]
               for task in ("SK1", "SK2", "SK3"))
    assert summary["niah_options"]["lightning-per-query"] == [{"logit_scaling": "per_query"}]
    assert summary["niah_options"]["gla-swla+log"] == [{"logit_scaling": "per_length",
                                                        "logit_scaling_train_length": 256, "eme_window": 256,
                                                        "eme_stride": 64}]
    assert summary["niah_options"]["gdn-log"] == [{"logit_scaling": "per_length", "logit_scaling_train_length": 256}]
    lines = (run / "report" / "report.md").read_text().splitlines()
    table = lines[lines.index("## NIAH accuracy") + 2:]
    assert table[0] == "| model | inference options | SK1 512 | SK1 1K | SK2 512 | SK2 1K | SK3 512 | SK3 1K |"
    # the rows in the plan's order
    assert [row.split(" | ")[0] for row in table[2:5]] == ["| lightning-per-query", "| gla-swla+log", "| gdn-log"]
    assert "| GDN-NoPE-LH | 99 | 100 | 90 | 53 |" in lines and "| SWLA + Log | 100 | 59 | 64 |" in lines
    # The head analyses: under EME for GLA (its options recorded), without logit scaling for GDN, each layer type.
    assert summary["heads"]["gla-512-eme"]["options"] == {"logit_scaling": "per_length",
                                                          "logit_scaling_train_length": 256, "eme_window": 256,
                                                          "eme_stride": 64}
    assert summary["heads"]["gdn-512-direct"]["options"] == {"logit_scaling": "off"}
    for label, mixer in (("gla-512-eme", "gla"), ("gdn-512-direct", "gdn")):
        groups = summary["heads"][label]["groups"]
        assert set(groups) == {mixer, "attention"} and groups[mixer]["num_heads"] == 3 * groups["attention"]["num_heads"]
        assert (run / "evals" / f"analyze-{label}" / "entropy_vs_hitrate.png").is_file()
    assert "## Head analysis (`hyla analyze hitrate`)" in lines
