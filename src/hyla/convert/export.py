"""The export stage: an HF folder (config with the layer types and a, safetensors, tokenizer, model card, report) that
loads with `import hyla`, or with `trust_remote_code=True` (`hyla.models.hf`); the stage's own bookkeeping sits beside
it (`Stage.state_path`), so the folder holds only what a published model needs."""

from __future__ import annotations

import json
from pathlib import Path

from hyla.convert.runners import Run, load_student
from hyla.convert.stages import STAGES, Stage
from hyla.outputs import write_atomic, write_json


def conversion_report(run: Run) -> dict:
    report = {"teacher": run.teacher_spec, "teacher_fingerprint": run.stages["data"].fingerprint,
              "preset": run.plan.preset, "plan": run.plan.to_dict(), "stages": {}}
    for name in STAGES[:-1]:
        manifest = run.stages[name].read_manifest()
        if manifest is not None:
            report["stages"][name] = manifest["results"]
    report["total_training_tokens"] = sum(
        report["stages"].get(name, {}).get("tokens", 0) for name in ("align", "distill", "finetune")
    )
    return report


def model_card(report: dict) -> str:
    stages = report["stages"]
    select = stages.get("select", {})
    scaling = stages.get("scaling", {})
    lines = [
        "---", "library_name: transformers", "tags: [hyla, hypenet, hybrid-linear-attention]", "---", "",
        f"# HypeNet converted from `{report['teacher']}`", "",
        "Converted with hyla's HALO pipeline (`hyla convert`). Load with `import hyla` then "
        "`AutoModelForCausalLM.from_pretrained(folder)`, or without the import with "
        "`from_pretrained(folder, trust_remote_code=True)` (hyla must be installed).", "",
        f"- preset: `{report['preset']}`; training tokens in total: {report['total_training_tokens']:,}",
        f"- attention layers kept (NoPE, output-gated): {select.get('chosen')} by `{select.get('method')}`",
        rnn_mixer_line(report["plan"]["model"]),
        scaling_line(scaling), "",
        *training_table(stages, ("align", "distill", "finetune")),
        "", "The full report is in `conversion.json`.", "",
    ]
    return "\n".join(lines)


def rnn_mixer_line(model: dict) -> str:
    """The model card's line on the layers not kept as attention (`model`: the plan's model section); GLA's and GDN's
    RoPE is named when on."""
    mixer = model["rnn_mixer"]
    line = f"- the other layers: `{mixer}` (`model.rnn_mixer`)"
    if mixer in ("gla", "gdn") and model.get(f"{mixer}_rope"):
        line += f", RoPE on their q and k (`model.{mixer}_rope`)"
    return line


def scaling_line(scaling: dict) -> str:
    """The model card's line on the chosen a: the held-out loss by a and, when measured, the recall documents'
    answer loss by a and which of the two chose."""
    line = f"- logit scaling a: {scaling.get('chosen_a')} (held-out loss by a: {scaling.get('loss_by_a')}"
    if scaling.get("recall_loss_by_a"):
        chosen_by = "answer" if scaling.get("criterion") == "recall" else "held-out"
        line += f"; answer loss on recall documents by a: {scaling['recall_loss_by_a']}; chosen by {chosen_by} loss"
    return line + ")"


def training_table(stages: dict, names) -> list[str]:
    """A model card's markdown table of the training stages `names`: steps, tokens, first and last loss (`stages`:
    each stage's manifest results)."""
    lines = ["| stage | steps | tokens | first loss | last loss |", "|---|---|---|---|---|"]
    for name in names:
        result = stages.get(name, {})
        lines.append(
            f"| {name} | {result.get('steps')} | {result.get('tokens', 0):,} | "
            f"{result.get('first', {}).get('loss', float('nan')):.4g} | {result.get('last', {}).get('loss', float('nan')):.4g} |"
        )
    return lines


def run_export(run: Run, stage: Stage) -> dict:
    chosen_a = run.stages["scaling"].read_manifest()["results"]["chosen_a"]
    student = load_student(run, "finetune", attention_logit_scaling_a=chosen_a)
    if run.env.is_main:
        student.save_pretrained(stage.path, safe_serialization=True)
        run.tokenizer.save_pretrained(stage.path)
        report = conversion_report(run)
        write_json(stage.path / "conversion.json", report)
        write_atomic(stage.path / "README.md", model_card(report).encode())
    return {"model": stage.relative(stage.path), "attention_logit_scaling_a": student.config.attention_logit_scaling_a,
            "layer_types": student.config.layer_types}


def read_report(out_dir: Path) -> dict:
    return json.loads((out_dir / f"{STAGES.index('export'):02d}-export" / "conversion.json").read_text())
