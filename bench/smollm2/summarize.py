"""Collect the results of bench/smollm2/driver.py into one JSON, three plots and a tarball of every small file.

    python bench/smollm2/summarize.py RUN OUT

Writes OUT/summary.json, OUT/niah.png, OUT/ppl.png, OUT/ablations.png and OUT/results.tar.gz (result JSONs,
plots, stage manifests, metrics, logs); prints the headline tables. Works on a partial run: what is missing is
reported as missing.
"""

from __future__ import annotations

import json
import sys
import tarfile
from collections import defaultdict
from pathlib import Path

from niah_digits import grade

from hyla.outputs import write_json

CSR_METRIC = {"hellaswag": "acc_norm", "arc_easy": "acc_norm", "arc_challenge": "acc_norm", "piqa": "acc_norm",
              "winogrande": "acc", "lambada": "acc"}
STAGES = ["00-data", "01-align", "02-select", "03-distill", "04-finetune", "05-scaling", "06-export"]


def read_json(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def label_of(folder: str) -> str:
    """niah-main-off-SK1-long -> main-off; csr-abl-halo -> abl-halo."""
    name = folder.split("-", 1)[1]
    for suffix in ("-long", "-short"):
        name = name.removesuffix(suffix)
    for task in ("-SK1", "-SK2", "-SK3"):
        name = name.removesuffix(task)
    return name


def collect_evals(run: Path) -> dict:
    niah: dict = defaultdict(lambda: defaultdict(dict))
    csr, ppl = {}, {}
    for path in sorted((run / "evals").glob("*/results.json")):
        result = read_json(path)
        if result is None:
            continue
        folder = path.parent.name
        label = label_of(folder)
        if result["kind"] == "niah":
            graded = grade(result.get("records", []))  # numeric needles: how close the answers came
            for task, task_result in result["tasks"].items():
                for length, accuracy in task_result["by_length"].items():
                    count = sum(1 for r in result.get("records", []) if r["task"] == task and r["length"] == int(length))
                    cell = {"accuracy": accuracy, "num_samples": count or None}
                    if (task, int(length)) in graded:
                        g = graded[(task, int(length))]
                        cell |= {"number_answers": g["number_answer"], "near_misses": g["leading_4"],
                                 "digits_right": g["digits_right"]}
                    niah[label][task][int(length)] = cell
        elif result["kind"] == "csr":
            tasks = {task: {"metric": CSR_METRIC.get(task, "acc"), "value": values.get(CSR_METRIC.get(task, "acc")),
                            "stderr": values.get(f"{CSR_METRIC.get(task, 'acc')}_stderr"),
                            "num_docs": values.get("num_docs")}
                     for task, values in result["tasks"].items()}
            present = [t["value"] for t in tasks.values() if t["value"] is not None]
            csr[label] = {"tasks": tasks, "average": sum(present) / len(present) if present else None,
                          "limit": result.get("settings", {}).get("limit")}
        elif result["kind"] == "ppl":
            ppl[label] = {"summary": result["summary"], "buckets": result.get("buckets")}
    return {"niah": {k: dict(v) for k, v in niah.items()}, "csr": csr, "ppl": ppl}


def collect_conversion(folder: Path) -> dict | None:
    if not folder.is_dir():
        return None
    stages = {}
    for stage in STAGES:
        manifest = read_json(folder / stage / "manifest.json")
        if manifest is None or manifest.get("status") != "complete":
            continue
        results = manifest["results"]
        keep = {k: results[k] for k in ("tokens", "steps", "seconds", "chosen", "method", "chosen_a", "loss_by_a",
                                        "num_tokens", "length") if k in results}
        for end in ("first", "last"):
            if end in results:
                keep[f"loss_{end}"] = results[end].get("loss")
        stages[stage] = keep
    tokens = sum(stages.get(s, {}).get("tokens", 0) for s in ("01-align", "03-distill", "04-finetune"))
    return {"stages": stages, "training_tokens": tokens,
            "chosen": stages.get("02-select", {}).get("chosen"), "chosen_a": stages.get("05-scaling", {}).get("chosen_a")}


def plot(summary: dict, out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    niah = summary["niah"]
    if any(label == "teacher" or label.startswith("main") for label in niah):
        _plot_niah(plt, niah, out)
    if any(result.get("buckets") for result in summary["ppl"].values()):
        _plot_ppl(plt, summary["ppl"], out)
    _plot_ablations(plt, summary, out)


def _plot_niah(plt, niah: dict, out: Path) -> None:
    figure, axes = plt.subplots(1, 3, figsize=(13, 3.6), sharey=True)
    for axis, task in zip(axes, ("SK1", "SK2", "SK3")):
        fixed_a = sorted((label for label in niah if label.startswith("main-a")), key=lambda l: float(l[6:]))
        for label in ("teacher", "main", "main-off", *fixed_a):
            cells = niah.get(label, {}).get(task, {})
            if cells:
                lengths = sorted(cells)
                axis.plot(lengths, [cells[n]["accuracy"] for n in lengths], marker="o", label=label)
        axis.set_xscale("log", base=2)
        axis.set_title(f"NIAH {task}")
        axis.set_xlabel("context length (tokens)")
        axis.axvline(8192, color="grey", linestyle=":", linewidth=1)
    axes[0].set_ylabel("accuracy")
    axes[0].legend()
    figure.tight_layout()
    figure.savefig(out / "niah.png", dpi=120)
    plt.close(figure)


def _plot_ppl(plt, ppl: dict, out: Path) -> None:
    figure, axis = plt.subplots(figsize=(6, 3.6))
    for label, result in ppl.items():
        buckets = result.get("buckets") or []
        if buckets:
            axis.plot([b["end"] for b in buckets], [b["loss"] for b in buckets], marker="o", label=label)
    axis.set_xscale("log", base=2)
    axis.set_xlabel("position (bucket end)")
    axis.set_ylabel("mean loss")
    axis.axvline(8192, color="grey", linestyle=":", linewidth=1)
    axis.legend()
    figure.tight_layout()
    figure.savefig(out / "ppl.png", dpi=120)
    plt.close(figure)


def ablation_rows(summary: dict) -> tuple[list[str], list[int]]:
    """The ablation conversions' labels and every NIAH length measured for them."""
    labels = sorted(label for label in summary["conversions"] if label.startswith("abl-"))
    niah = summary["niah"]
    return labels, sorted({n for l in labels for cells in niah.get(l, {}).values() for n in cells})


def _plot_ablations(plt, summary: dict, out: Path) -> None:
    niah = summary["niah"]
    labels, lengths = ablation_rows(summary)
    if labels:
        series = [(f"NIAH {_length(n)} (mean SK1-3)", [mean_at(niah.get(l, {}), n) for l in labels]) for n in lengths]
        series.append(("CSR average", [summary["csr"].get(l, {}).get("average") for l in labels]))
        figure, (axis, loss_axis) = plt.subplots(1, 2, figsize=(13, 3.8), gridspec_kw={"width_ratios": [2, 1]})
        width = 0.8 / len(series)
        for offset, (name, values) in enumerate(series):
            axis.bar([i + (offset - (len(series) - 1) / 2) * width for i in range(len(labels))],
                     [v if v is not None else 0.0 for v in values], width=width, label=name)
        axis.set_xticks(range(len(labels)), [l.removeprefix("abl-") for l in labels], rotation=15)
        axis.set_ylim(0, 1)
        axis.set_title("retrieval and CSR (a missing bar: not measured or 0)", fontsize=9)
        axis.legend(fontsize=8)
        held_out = [heldout_loss(summary["conversions"][l]) for l in labels]
        loss_axis.bar(range(len(labels)), [v if v is not None else 0.0 for v in held_out], color="grey")
        loss_axis.set_xticks(range(len(labels)), [l.removeprefix("abl-") for l in labels], rotation=15)
        scaling = next((c["stages"].get("05-scaling", {}) for c in summary["conversions"].values()
                        if c and c["stages"].get("05-scaling", {}).get("length")), {})
        loss_axis.set_title(f"held-out loss at {_length(scaling.get('length', 0))} tokens, scaling off", fontsize=9)
        figure.tight_layout()
        figure.savefig(out / "ablations.png", dpi=120)
        plt.close(figure)


def heldout_loss(conversion: dict | None) -> float | None:
    """The scaling stage's held-out loss with the logit scaling off (its long documents), or None."""
    losses = ((conversion or {}).get("stages", {}).get("05-scaling") or {}).get("loss_by_a") or {}
    return losses.get("None")


def mean_at(by_task: dict, length: int) -> float | None:
    values = [cells[length]["accuracy"] for cells in by_task.values() if length in cells]
    return sum(values) / len(values) if values else None


def _length(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def print_tables(summary: dict) -> None:
    niah = summary["niah"]
    lengths = sorted({n for by_task in niah.values() for cells in by_task.values() for n in cells})
    print("NIAH accuracy")
    print(f"{'model':22s} {'task':5s} " + " ".join(f"{_length(n):>6s}" for n in lengths))
    for label in sorted(niah):
        for task in sorted(niah[label]):
            cells = niah[label][task]
            row = " ".join(f"{cells[n]['accuracy']:6.2f}" if n in cells else "     -" for n in lengths)
            print(f"{label:22s} {task:5s} {row}")
    print("NIAH graded (SK1, SK2): answers holding a 7-digit number / with >= 4 leading digits of the needle")
    for label in sorted(niah):
        for task in sorted(niah[label]):
            cells = niah[label][task]
            if not any("number_answers" in c for c in cells.values()):
                continue
            row = " ".join(f"{cells[n]['number_answers']:4.2f}/{cells[n]['near_misses']:4.2f}"
                           if "number_answers" in cells.get(n, {}) else "        -" for n in lengths)
            print(f"{label:22s} {task:5s} {row}")
    print("CSR (acc_norm; winogrande, lambada: acc)")
    for label, result in sorted(summary["csr"].items()):
        tasks = " ".join(f"{t}={v['value']:.3f}" for t, v in result["tasks"].items() if v["value"] is not None)
        print(f"{label:22s} avg={result['average']:.4f} {tasks}")
    labels, lengths = ablation_rows(summary)
    if labels:
        print("Ablations: NIAH mean of SK1-3, CSR average, held-out loss of the scaling stage (scaling off)")
        print(f"{'variant':22s} " + " ".join(f"{_length(n):>6s}" for n in lengths) + "    CSR   loss")
        for label in labels:
            cells = [mean_at(niah.get(label, {}), n) for n in lengths]
            csr, loss = summary["csr"].get(label, {}).get("average"), heldout_loss(summary["conversions"][label])
            print(f"{label:22s} " + " ".join(f"{v:6.2f}" if v is not None else "     -" for v in cells)
                  + (f" {csr:6.3f}" if csr is not None else "      -") + (f" {loss:6.3f}" if loss is not None else "      -"))
    for name, conversion in summary["conversions"].items():
        if conversion:
            print(f"{name:22s} tokens={conversion['training_tokens']:,} chosen={conversion['chosen']} "
                  f"a={conversion['chosen_a']}")


def tarball(run: Path, out: Path) -> None:
    patterns = ["evals/*/*.json", "evals/*/*.png", "*/0*-*/manifest.json", "*/0*-*/metrics.jsonl",
                "*/02-select/selection.json", "*/02-select/selection.png", "*/05-scaling/scaling.png",
                "*/06-export/conversion.json", "*/06-export/config.json", "teacher-check.json", "driver.log",
                "status.json", "logs/*.log", "family-lh/*.json", "family-lh/*.png", "corpus/manifest.json"]
    with tarfile.open(out / "results.tar.gz", "w:gz") as archive:
        for pattern in patterns:
            for path in sorted(run.glob(pattern)):
                if path.is_file() and path.stat().st_size < 4_000_000:
                    archive.add(path, arcname=str(path.relative_to(run)))


def main() -> int:
    run, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    summary = collect_evals(run)
    summary["conversions"] = {folder.name: collect_conversion(folder) for folder in sorted(run.iterdir())
                              if (folder / "00-data").is_dir()}
    summary["teacher_check"] = read_json(run / "teacher-check.json")
    summary["status"] = read_json(run / "status.json")
    summary["corpus"] = {k: v for k, v in (read_json(run / "corpus" / "manifest.json") or {}).items()
                         if k in ("num_tokens", "counts", "sources", "num_documents")}
    write_json(out / "summary.json", summary)
    try:
        plot(summary, out)
    except Exception as err:  # noqa: BLE001 - the JSON matters more than the plots
        print(f"plots failed: {type(err).__name__}: {err}")
    tarball(run, out)
    print_tables(summary)
    return 0


if __name__ == "__main__":
    sys.exit(main())
