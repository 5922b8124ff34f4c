"""The selection stage of a conversion: score single-layer replacements (resumably) and choose the attention layers."""

from __future__ import annotations

import json

from hyla.convert.runners import Run, load_twins
from hyla.convert.select_report import build_report
from hyla.convert.selection import SelectionScores, default_scorers, normalize_method, score_replacements
from hyla.convert.stages import Stage
from hyla.evals.report import write_json
from hyla.train.distributed import barrier

SCORED_METHODS = ("halo", "jet-nemotron")


def _method_and_layers(text: str) -> tuple[str, list[int] | None]:
    """"3,7,11" names the kept layers directly; anything else is a rule name."""
    if all(part.strip().isdigit() for part in text.split(",")):
        return "user", [int(part) for part in text.split(",")]
    return normalize_method(text), None


def run_select(run: Run, stage: Stage) -> dict:
    plan = run.plan.selection
    method, layers = _method_and_layers(str(plan.method))
    num_layers = run.hf_teacher.config.num_hidden_layers
    scores = SelectionScores(num_layers)
    if method == "kl-ls":
        raise ValueError("selection method kl-ls is available as a library rule (hyla.convert.selection.kl_ls_select) "
                         "but the pipeline does not run its per-layer distillations yet; choose halo, jet-nemotron, "
                         "uniform, latter-half or a layer list")
    if method in SCORED_METHODS:
        if run.env.is_main:
            scores = _score(run, stage, plan)
        barrier(run.env)
        scores = SelectionScores.from_dict(json.loads((stage.path / "scores.json").read_text()))
    report = build_report(scores, method, None if method == "user" else plan.k, layers=layers, settings=run.plan.selection.__dict__)
    if run.env.is_main:
        report.write_json(stage.path / "selection.json")
        report.print_table()
        if scores.recall:
            report.plot(stage.path / "selection.png")
    return {"method": method, "k": report.k, "chosen": sorted(report.chosen), "ranked": report.chosen}


def _score(run: Run, stage: Stage, plan) -> SelectionScores:
    partial_path = stage.path / "scores.partial.json"
    resume = SelectionScores.from_dict(json.loads(partial_path.read_text())) if partial_path.exists() else None
    recall_fn, csr_fn = default_scorers(
        run.tokenizer, plan.niah_tasks, plan.niah_lengths, plan.niah_samples, plan.csr_tasks, plan.csr_limit,
        plan.batch_size, csr_metric="acc_norm",
    )
    scores = score_replacements(
        run.teacher_equivalent(), load_twins(run), recall_fn, csr_fn, resume_from=resume,
        on_scored=lambda partial: write_json(partial_path, partial.to_dict()),
    )
    write_json(stage.path / "scores.json", scores.to_dict())
    partial_path.unlink(missing_ok=True)
    return scores
