"""The selection stage of a conversion: score single-layer replacements (resumably) and choose the attention layers."""

from __future__ import annotations

import dataclasses
import functools
import json

from hyla.convert.runners import Run, load_twins
from hyla.convert.select_report import build_report
from hyla.convert.selection import SelectionScores, default_scorers, normalize_method, score_replacements
from hyla.convert.stages import Stage
from hyla.outputs import write_json
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
    kl_by_layer = None
    if method == "kl-ls":
        kl_by_layer = kl_ls_scores(run, stage)
    if method in SCORED_METHODS:
        if run.env.is_main:
            scores = _score(run, stage, plan)
        barrier(run.env)
        scores = SelectionScores.from_dict(json.loads((stage.path / "scores.json").read_text()))
    errors = _alignment_errors(run, num_layers) if plan.tie_break == "alignment" else None
    report = build_report(scores, method, None if method == "user" else plan.k, layers=layers,
                          kl_by_layer=kl_by_layer, settings=run.plan.selection.__dict__, noise_z=plan.noise_z,
                          alignment_errors=errors)
    if run.env.is_main:
        report.write_json(stage.path / "selection.json")
        report.print_table()
        if scores.recall:
            report.plot(stage.path / "selection.png")
    return {"method": method, "k": report.k, "chosen": sorted(report.chosen), "ranked": report.chosen,
            "generation_path": scores.generation_path}


def _alignment_errors(run: Run, num_layers: int) -> dict[int, float] | None:
    """Stage 1's per-layer alignment error (the noise-aware rule's tie-break), from its metrics; for twins stage 1
    does not train (SWA), the error it measured."""
    from hyla.convert.noise_select import alignment_errors_from_metrics
    from hyla.train.progress import read_metrics

    path = run.stages["align"].path / "metrics.jsonl"
    if path.exists():
        return alignment_errors_from_metrics(read_metrics(path), num_layers)
    measured = (run.stages["align"].read_manifest() or {}).get("results", {}).get("relative_error")
    return dict(enumerate(measured)) if measured is not None else None


def kl_ls_scores(run: Run, stage: Stage) -> dict[int, float]:
    """KL-LS (docs/method.md, "Layer selection"): for each layer i, the all-Lightning student with only layer i restored
    to attention, distilled for `selection.kl_ls_steps` steps; the layer's score is the KL to the teacher it reaches on
    a held-out batch. Each layer's short run has its own folder, so an interrupted selection resumes."""
    import torch

    from hyla.convert.distill import StudentWithTeacher, distill_loss, kl_divergence
    from hyla.convert.runners import stage_fast_path, train_budget
    from hyla.train.weights import full_state_dict, load_state

    budget = dataclasses.replace(
        run.plan.distill, tokens=run.plan.selection.kl_ls_steps * run.plan.distill.seq_len * run.plan.distill.batch_size,
        warmup_steps=0, checkpoint_every=max(1, run.plan.selection.kl_ls_steps),
    )
    heldout = run.corpus()[1]
    length = min(budget.seq_len, heldout.num_tokens - 1)
    batch = torch.from_numpy(heldout.read(0, length))[None].to(run.env.device)
    teacher = run.teacher_equivalent()
    # Short runs of one student each: compiling every student (and the teacher again) would cost more than it saves.
    fast = dataclasses.replace(stage_fast_path(run, budget), compile=False)
    loss_fn = functools.partial(distill_loss, fused=fast.fused_loss)
    kl_by_layer = {}
    for layer in range(run.hf_teacher.config.num_hidden_layers):
        folder = stage.path / "kl-ls" / f"layer-{layer:03d}"
        result_file = folder / "kl.json"
        if result_file.exists():
            kl_by_layer[layer] = json.loads(result_file.read_text())["kl"]
            continue
        student = run.build_student([layer]).to(run.env.device).float()
        pair = StudentWithTeacher(student, teacher)
        train_budget(run, folder, f"kl-ls {layer}", pair, loss_fn, budget, list(student.model.layers), root=student,
                     fast=fast, teacher=teacher)
        # A fresh copy of the trained student: under FSDP2 the trained one holds a shard of each weight.
        trained = run.build_student([layer])
        load_state(trained, {k.removeprefix("student."): v for k, v in full_state_dict(pair, everywhere=True).items()})
        with torch.no_grad():
            kl = kl_divergence(teacher(batch, use_cache=False).logits,
                               trained.to(run.env.device).float().eval()(batch, use_cache=False).logits)
        kl_by_layer[layer] = kl.item()
        if run.env.is_main:
            write_json(result_file, {"layer": layer, "kl": kl_by_layer[layer], "steps": budget.steps})
        run.log(f"[select] kl-ls layer {layer}: KL {kl_by_layer[layer]:.4f} after {budget.steps} steps")
    write_json(stage.path / "kl_by_layer.json", {str(k): v for k, v in kl_by_layer.items()})
    return kl_by_layer


def scoring_model(run: Run):
    """The teacher-equivalent model the variants are scored on: on CUDA a bfloat16 copy, as `hyla eval` and the
    scaling stage run (in float32 its NIAH took 2.3 s a batch of 16 prompts at 4K on an H200, 14 of each variant's
    19 s); on CPU the float32 model itself. Each twin is placed in the model's dtype when swapped in."""
    from hyla.convert.distill import bf16_teacher

    teacher = run.teacher_equivalent()
    if run.env.device.type != "cuda":
        return teacher
    return bf16_teacher(teacher)


def _score(run: Run, stage: Stage, plan) -> SelectionScores:
    from hyla.inference.generate import generation_path_record

    partial_path = stage.path / "scores.partial.json"
    resume = SelectionScores.from_dict(json.loads(partial_path.read_text())) if partial_path.exists() else None
    paths: set[str] = set()
    recall_fn, csr_fn = default_scorers(
        run.tokenizer, plan.niah_tasks, plan.niah_lengths, plan.niah_samples, plan.csr_tasks, plan.csr_limit,
        plan.batch_size, csr_batch_size=plan.csr_batch_size, csr_metric="acc_norm",
        niah_max_new_tokens=plan.niah_max_new_tokens, log=run.log, generation_paths=paths,
    )

    def with_paths(partial: SelectionScores) -> SelectionScores:
        # the paths of this run's recall scores, and those of the scores resumed from
        partial.generation_path = generation_path_record(partial.generation_path, *paths)
        return partial

    scores = score_replacements(
        scoring_model(run), load_twins(run), recall_fn, csr_fn, resume_from=resume,
        on_scored=lambda partial: write_json(partial_path, with_paths(partial).to_dict()),
    )
    with_paths(scores)
    write_json(stage.path / "scores.json", scores.to_dict())
    partial_path.unlink(missing_ok=True)
    return scores
