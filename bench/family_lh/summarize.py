"""Summarize a family-LH run folder (bench/family_lh/run.sh) into summary.json, summary.md and summary.png.

    python bench/family_lh/summarize.py OUTDIR

Reads OUTDIR/settings.json, steps.tsv, data/mix/manifest.json, <model>/train/metrics.jsonl and
<model>/eval-{plain,eme}/results.json; a missing piece is reported as missing (status "partial"), never filled in.
Seed 003's Table 1 is quoted beside the measured cells for direction only: other scale (776M), training (50B tokens
at 4K) and lengths (64K), and no SWA-NoPE row.
"""

from __future__ import annotations

import json
import math
import re
import sys
from pathlib import Path

MODELS = {"gla-nope": "GLA-NoPE-LH", "swa-nope": "SWA-NoPE-LH"}
MODES = ("plain", "eme")
QUERY = re.compile(r"What is the special magic number for (\S+) mentioned in the provided text\?")

# Quoted from ../shared/seeds/003_*.txt, frame "The 100% result is specific to SK1 at 776M" (paper, Table 1, p. 23)
# and the backup frame "SWLA and Log solve different parts of retrieval".
SEED_003_TABLE_1 = {
    "source": "seed deck 003 (arXiv:2610.10114v1), Table 1, p. 23",
    "setting": "776M models, trained at 4K on 50B tokens, RULER at 64K (16x); accuracy in %",
    "columns": ["SK1 direct", "SK1 EME", "SK2 EME", "SK3 EME"],
    "rows": {
        "GLA-NoPE-LH": [0, 100, 59, 64],
        "GLA-NoPE-HH": [0, 100, 31, 34],
        "GDN-NoPE-LH": [99, 100, 90, 53],
        "GDN-NoPE-HH": [92, 100, 35, 16],
    },
    "ablation_776m_gla_nope_lh_64k": {"Direct": [0, 0, 0], "Log": [0, 0, 0], "SWLA": [97, 0, 3],
                                      "SWLA + Log": [100, 59, 64], "columns": ["SK1", "SK2", "SK3"]},
    "notes": [
        "All models were trained at 4K: 16x length extrapolation.",
        "At 32K SK1, the same EME model scores 96%.",
        "Table 1 has no SWA-NoPE row; for SWA-NoPE, EME reduces to the Log (per-length NoPE scaling) part, since "
        "SWA keeps its own window.",
    ],
}


def read_json(path: Path) -> dict | None:
    return json.loads(path.read_text()) if path.is_file() else None


def stderr(scores: list[float]) -> float | None:
    if len(scores) < 2:
        return None
    mean = sum(scores) / len(scores)
    return math.sqrt(sum((s - mean) ** 2 for s in scores) / (len(scores) - 1) / len(scores))


def niah_cells(results: dict) -> dict:
    """Per length: accuracy, its standard error, n, accuracy by depth, and the first few predictions."""
    cells: dict[str, dict] = {}
    for length in sorted({r["length"] for r in results["records"]}):
        records = [r for r in results["records"] if r["length"] == length]
        scores = [r["score"] for r in records]
        depths = sorted({r["depth_percent"] for r in records})
        cells[str(length)] = {
            "accuracy": sum(scores) / len(scores),
            "stderr": stderr(scores),
            "num_samples": len(scores),
            "mean_prompt_tokens": sum(r["num_prompt_tokens"] for r in records) / len(records),
            "by_depth": {str(d): sum(r["score"] for r in records if r["depth_percent"] == d)
                         / sum(1 for r in records if r["depth_percent"] == d) for d in depths},
            "examples": [{"gold": r["outputs"], "pred": r["pred"], "depth": r["depth_percent"]} for r in records[:3]],
        }
    return cells


def inert_check(model: dict, seq_len: int) -> dict | None:
    """At the training length EME is inert (W >= T, c(L) = 1): plain and EME predictions should match per sample."""
    plain, eme = (model["niah"].get(mode, {}).get("records_at_train_length") for mode in MODES)
    if not plain or not eme:
        return None
    eme_by_index = {record["index"]: record for record in eme}
    same = [eme_by_index[r["index"]]["pred"] == r["pred"] for r in plain if r["index"] in eme_by_index]
    return {"length": seq_len, "num_samples": len(same), "same_prediction": sum(same)}


def training_needles(outdir: Path) -> tuple[set[str], set[str]] | None:
    path = outdir / "data" / "mix" / "retrieval-docs.jsonl"
    if not path.is_file():
        return None
    rows = [json.loads(line) for line in path.read_text().splitlines() if line]
    return {row["key"] for row in rows}, {row["value"] for row in rows}


def overlap_with_training(eval_folder: Path, results: dict, needles: tuple[set[str], set[str]] | None) -> dict:
    """How many evaluated samples share a key or a value with a training document (checked, not assumed)."""
    if needles is None:
        return {"checked": False}
    keys, values = needles
    value_hits = sum(any(v in values for v in r["outputs"]) for r in results["records"])
    predictions = eval_folder / "predictions.jsonl"
    key_hits = None
    if predictions.is_file():
        rows = [json.loads(line) for line in predictions.read_text().splitlines() if line]
        found = [QUERY.search(row["input"]) for row in rows]
        key_hits = sum(match is not None and match.group(1) in keys for match in found)
    return {"checked": True, "num_samples": len(results["records"]), "samples_with_training_value": value_hits,
            "samples_with_training_key": key_hits}


def training_summary(folder: Path, settings: dict, wall_s: dict) -> dict | None:
    metrics_path = folder / "train" / "metrics.jsonl"
    if not metrics_path.is_file():
        return None
    metrics = [json.loads(line) for line in metrics_path.read_text().splitlines() if line]
    if not metrics:
        return None
    steps = metrics[-1]["step"]
    last = metrics[-min(20, len(metrics)):]
    speeds = sorted(m["tok_per_s"] for m in metrics[1:] or metrics)
    stopped = folder / "stopped-at-step"
    return {
        "planned_steps": settings["steps"],
        "steps": steps,
        "stopped_by_time_budget_at_step": int(stopped.read_text()) if stopped.is_file() else None,
        "tokens": steps * settings["batch_size"] * settings["seq_len"],
        "first_loss": metrics[0]["loss"],
        "final_loss_mean_last_20": sum(m["loss"] for m in last) / len(last),
        "median_tok_per_s": speeds[len(speeds) // 2],
        "wall_s": wall_s.get(f"{folder.name}/train"),
        "num_params": count_params(folder / "train" / "model" / "model.safetensors"),
    }


def count_params(path: Path) -> int | None:
    if not path.is_file():
        return None
    from safetensors import safe_open

    with safe_open(path, framework="pt") as handle:
        return sum(math.prod(handle.get_slice(name).get_shape()) for name in handle.keys())


def read_steps(path: Path) -> tuple[dict, list[dict]]:
    rows = []
    if path.is_file():
        for line in path.read_text().splitlines():
            name, rc, seconds = line.split("\t")
            rows.append({"step": name, "exit": int(rc), "seconds": int(seconds)})
    # the last attempt of each step (a step stopped by the time budget has exit 124 and still took its time)
    return {row["step"]: row["seconds"] for row in rows}, rows


def fmt(cell: dict | None) -> str:
    if cell is None:
        return "missing"
    error = f" ± {cell['stderr']:.2f}" if cell["stderr"] is not None else ""
    return f"{cell['accuracy']:.2f}{error} (n={cell['num_samples']})"


def markdown(summary: dict) -> str:
    settings = summary["settings"]
    lines = [
        f"NIAH SK1 accuracy (fraction of samples; ± standard error), trained at L = {settings['seq_len']}; "
        f"EME = SWLA W={settings['eme_window']}, S={settings['eme_stride']} + per-length NoPE scaling, "
        f"L0={settings['logit_scaling_train_length']}. Status: {summary['status']}.",
        "",
        "| model | length | × L | plain | EME |",
        "|---|---|---|---|---|",
    ]
    for row in summary["table"]:
        lines.append(f"| {row['model']} | {row['length']} | {row['ratio']} | {fmt(row['plain'])} | {fmt(row['eme'])} |")
    lines.append("")
    for name, model in summary["models"].items():
        train = model["train"]
        if train is None:
            lines.append(f"- {MODELS[name]}: no training metrics")
            continue
        stopped = (f", stopped by the time budget at step {train['stopped_by_time_budget_at_step']}"
                   if train["stopped_by_time_budget_at_step"] else "")
        params = f"{train['num_params'] / 1e6:.1f}M params, " if train["num_params"] else ""
        lines.append(
            f"- {MODELS[name]}: {params}{train['steps']}/{train['planned_steps']} steps, "
            f"{train['tokens'] / 1e6:.1f}M tokens{stopped}; loss {train['first_loss']:.2f} -> "
            f"{train['final_loss_mean_last_20']:.3f} (mean of the last 20 steps); "
            f"median {train['median_tok_per_s']:,.0f} tok/s; train wall {train['wall_s']} s"
        )
    for name, model in summary["models"].items():
        check = model.get("eme_inert_at_train_length")
        if check:
            lines.append(f"- {MODELS[name]} at L = {check['length']}: plain and EME give the same prediction for "
                         f"{check['same_prediction']} of {check['num_samples']} samples (EME is inert there)")
    mix = summary.get("mix")
    if mix:
        lines.append(
            f"- Mix: {mix['num_retrieval_docs']} synthetic SK1-like documents in "
            f"{mix['retrieval_share_of_sequences']:.0%} of the sequences ({mix['retrieval_share_of_tokens']:.0%} of "
            f"tokens, {mix['retrieval_doc_tokens']['min']}..{mix['retrieval_doc_tokens']['max']} tokens each), "
            f"{mix.get('num_copy_docs', 0)} copy documents ({mix.get('copy_share_of_tokens', 0):.0%} of tokens), "
            f"{mix['corpus_tokens'] / 1e6:.1f}M corpus tokens ({mix['corpus_passes']:.2f} passes); evaluation keys / "
            f"values drawn for training: {mix['exclusions']['overlapping_keys']} / "
            f"{mix['exclusions']['overlapping_values']}"
        )
    overlaps = [mode["training_overlap"] for model in summary["models"].values() for mode in model["niah"].values()]
    if overlaps and all(o["checked"] for o in overlaps):
        lines.append(
            f"- Evaluated samples sharing a key / a value with a training SK1-like document (checked on the "
            f"predictions; copy lists exclude them by construction): "
            f"{sum(o['samples_with_training_key'] or 0 for o in overlaps)} / "
            f"{sum(o['samples_with_training_value'] for o in overlaps)} of {sum(o['num_samples'] for o in overlaps)}"
        )
    if summary["missing"]:
        lines.append(f"- Missing: {', '.join(summary['missing'])}")
    lines.append(f"- Total wall: {summary['total_wall_s']} s (the two models' steps run side by side)")
    lines.append("- Seed 003, Table 1 (776M, trained at 4K on 50B tokens, SK1 at 64K = 16x): GLA-NoPE-LH 0% direct, "
                 "100% with EME (97% SWLA alone, 0% Log alone); GDN-NoPE-LH 99% / 100%; no SWA-NoPE row")
    return "\n".join(lines) + "\n"


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    lengths = sorted({row["length"] for row in summary["table"]})
    series = [(name, mode) for name in MODELS for mode in MODES]
    width = 0.8 / len(series)
    figure, axis = plt.subplots(figsize=(7, 3.6))
    for index, (name, mode) in enumerate(series):
        values = []
        for length in lengths:
            row = next(r for r in summary["table"] if r["length"] == length and r["model"] == MODELS[name])
            values.append(row[mode]["accuracy"] if row[mode] else float("nan"))
        positions = [i + (index - (len(series) - 1) / 2) * width for i in range(len(lengths))]
        bars = axis.bar(positions, values, width, label=f"{MODELS[name]} {'+ EME' if mode == 'eme' else 'plain'}",
                 hatch="//" if mode == "eme" else None, color="C0" if name == "gla-nope" else "C1",
                 alpha=1.0 if mode == "eme" else 0.55)
        axis.bar_label(bars, fmt="%.2f", fontsize=6)
    seq_len = summary["settings"]["seq_len"]
    axis.set_xticks(range(len(lengths)), [f"{length} ({length // seq_len}× L)" for length in lengths])
    axis.set_ylim(0, 1.05)
    axis.set_ylabel("NIAH SK1 accuracy")
    axis.set_title(f"Layer-wise hybrids trained at L = {seq_len} ({summary['status']})")
    axis.legend(fontsize=8, loc="upper right")
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def summarize(outdir: Path) -> dict:
    settings = read_json(outdir / "settings.json")
    if settings is None:
        raise SystemExit(f"summarize.py: {outdir} has no settings.json (not a run.sh folder)")
    wall_s, steps = read_steps(outdir / "steps.tsv")
    manifest = read_json(outdir / "data" / "mix" / "manifest.json")
    needles = training_needles(outdir)
    models, missing, table = {}, [], []
    for name in MODELS:
        folder = outdir / name
        model = {"config": settings["models"][name], "train": training_summary(folder, settings, wall_s), "niah": {}}
        for mode in MODES:
            results = read_json(folder / f"eval-{mode}" / "results.json")
            if results is None:
                missing.append(f"{name}/eval-{mode}")
                continue
            model["niah"][mode] = {"cells": niah_cells(results), "command": results["command"],
                                   "records_at_train_length": [
                                       {"index": r["index"], "pred": r["pred"], "score": r["score"]}
                                       for r in results["records"] if r["length"] == settings["seq_len"]],
                                   "applied_overrides": results["settings"].get("applied_overrides", {}),
                                   "training_overlap": overlap_with_training(folder / f"eval-{mode}", results, needles),
                                   "wall_s": wall_s.get(f"{name}/eval-{mode}")}
        model["eme_inert_at_train_length"] = inert_check(model, settings["seq_len"])
        if model["train"] is None:
            missing.append(f"{name}/train")
        models[name] = model
        for length in settings["eval_lengths"]:
            cells = {mode: model["niah"].get(mode, {}).get("cells", {}).get(str(length)) for mode in MODES}
            table.append({"model": MODELS[name], "length": length, "ratio": length // settings["seq_len"], **cells})
    summary = {
        "experiment": "family-lh: layer-wise GLA-NoPE / SWA-NoPE, NIAH SK1 beyond the training length, plain vs EME",
        "status": "complete" if not missing else "partial",
        "missing": missing,
        "settings": settings,
        "mix": manifest["mix"] if manifest else None,
        "mix_sources": manifest["sources"] if manifest else None,
        "models": models,
        "table": table,
        "seed_003_table_1": SEED_003_TABLE_1,
        "steps": steps,
        "total_wall_s": next((row["seconds"] for row in reversed(steps) if row["step"] == "total"), None),
    }
    (outdir / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (outdir / "summary.md").write_text(markdown(summary))
    plot(summary, outdir / "summary.png")
    print(f"summarize.py: {summary['status']}; wrote {outdir}/summary.json, summary.md, summary.png")
    return summary


if __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python bench/family_lh/summarize.py OUTDIR")
    summarize(Path(sys.argv[1]))
