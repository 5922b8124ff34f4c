"""`hyla experiment report RUN`: one summary of a run's results, as JSON, markdown tables, plots and a tarball.

It reads what the jobs wrote, by convention of the hyla commands: evaluations in `RUN/evals/<kind>-<label>[-<task>]
[-long|-short]/results.json` (NIAH, CSR, PPL; the label names the model, e.g. `teacher`, `main-off`, `abl-uniform`),
conversions as folders of `RUN` holding `00-data/` (their stage manifests; their stage-1 alignment curves:
`hyla.experiment.alignment`), trainings as folders holding
`metrics.jsonl` and `model/` (`hyla train`), the teacher check's `teacher-check.json`, the corpus manifest, the run's
`status.json`, and the plan's `report.reference` (published numbers to read beside the measured ones) and
`report.niah_table` ("wide": NIAH as one table, a row per label, a column per task and length). Works on a
partial run: what is missing is missing, never filled in; and on any folder of `hyla convert` run folders (e.g.
`runs/init/none` and `runs/init/lstsq`: `hyla experiment report runs/init` compares their alignment).
"""

from __future__ import annotations

import json
import tarfile
from collections import defaultdict
from pathlib import Path
from typing import Any

from hyla.experiment.alignment import alignment_lines, collect_alignment, plot_alignment
from hyla.experiment.selection import SELECT_STAGE, collect_selection, selection_lines
from hyla.experiment.niah_answers import KINDS as ANSWER_KINDS
from hyla.experiment.niah_answers import miss_kinds
from hyla.experiment.niah_grading import grade
from hyla.experiment.niah_distance import BINS as DISTANCE_BINS
from hyla.experiment.niah_distance import by_distance
from hyla.experiment.niah_pairs import pair_records
from hyla.outputs import write_atomic, write_json

CSR_METRIC = {"hellaswag": "acc_norm", "arc_easy": "acc_norm", "arc_challenge": "acc_norm", "piqa": "acc_norm",
              "winogrande": "acc", "lambada": "acc"}
# The settings of `hyla eval` that change how a hybrid runs (hyla.evals.cli's inference options).
INFERENCE_SETTINGS = ("logit_scaling", "logit_scaling_a", "logit_scaling_train_length", "eme_window", "eme_stride")
STAGES = ["00-data", "01-align", "02-select", "03-distill", "04-finetune", "05-scaling", "06-export"]
# The small files of a run that the tarball keeps (no weights, no corpora).
TARBALL_PATTERNS = [
    "evals/*/*.json", "evals/*/*.png", "*/0*-*/manifest.json", "*/0*-*.stage/manifest.json", "*/0*-*/metrics.jsonl",
    "*/02-select/selection.json", "*/02-select/scores.partial.json", "*/02-select/selection.png", "*/05-scaling/scaling.png", "*/06-export/conversion.json", "*/06-export/config.json",
    "*/snapshot.json",
    "*/teacher-check.json", "*/metrics.jsonl", "*/*/metrics.jsonl", "*/model/training.json", "*/*/model/training.json",
    "*/model/config.json", "*/*/model/config.json", "*/manifest.json", "*/*/manifest.json", "plan.json",
    "status.json", "runner.log", "logs/*.log"]
TARBALL_MAX_BYTES = 4_000_000


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None


def label_of(folder: str) -> str:
    """niah-main-off-SK1-long -> main-off; csr-abl-halo -> abl-halo; niah-gla-nope-eme -> gla-nope-eme."""
    name = folder.split("-", 1)[1] if "-" in folder else folder
    for suffix in ("-long", "-short"):
        name = name.removesuffix(suffix)
    for task in ("-SK1", "-SK2", "-SK3", "-MK1", "-MK2", "-MK3", "-MV", "-MQ"):
        name = name.removesuffix(task)
    return name


def niah_options(result: dict) -> dict:
    """The inference options a NIAH result was run under, as its settings record them (`hyla eval niah`'s
    --logit-scaling* and --eme-* flags; {}: none given, the model as saved)."""
    settings = result.get("settings") or {}
    return {name: settings[name] for name in INFERENCE_SETTINGS if settings.get(name) is not None}


def _niah_cells(result: dict, niah: dict, label: str) -> None:
    records = result.get("records", [])
    graded = grade(records)
    for task, task_result in result["tasks"].items():
        for length, accuracy in task_result["by_length"].items():
            length = int(length)
            count = sum(1 for r in records if r["task"] == task and r["length"] == length)
            cell = {"accuracy": accuracy, "num_samples": count or None}
            if (task, length) in graded:
                g = graded[(task, length)]
                cell |= {"number_answers": g["number_answer"], "near_misses": g["leading_4"],
                         "digits_right": g["digits_right"], "needle_prefix": g["prefix_4"]}
            niah[label][task][length] = cell


def _graded_cell(cell: dict) -> str:
    # Summaries written before `needle_prefix` existed show two grades.
    text = f"{cell['number_answers']:.2f} / {cell['near_misses']:.2f}"
    return text + (f" / {cell['needle_prefix']:.2f}" if "needle_prefix" in cell else "")


# The model every other one is compared with prompt by prompt (`niah_pairs`), when the run has it.
PAIRS_BASELINE = "main"


def niah_pairs(records: dict[str, list[dict]], baseline: str = PAIRS_BASELINE) -> dict:
    """Each label's NIAH answers against `baseline`'s on the prompts both answered (hyla.experiment.niah_pairs), by
    task: {label: {task: {prompts, right_a, right_b, only_a, only_b, p}, "unmatched": n}}; a: the baseline. Labels
    that share no prompt with it are left out."""
    if baseline not in records:
        return {}
    pairs = {}
    for label in sorted(set(records) - {baseline}):
        try:
            pairing = pair_records(records[baseline], records[label], names=(baseline, label))
        except ValueError as err:  # two result folders of one label holding the same prompts: no pairing
            print(f"NIAH pairs: {label} left out: {err}")
            continue
        if not pairing.by_cell:
            continue
        tasks = sorted({task for task, _ in pairing.by_cell})
        pairs[label] = {task: {**vars(c), "p": c.p} for task in tasks for c in [pairing.total(task)]}
        pairs[label]["unmatched"] = pairing.unmatched
    return pairs


def niah_misses(records: dict[str, list[dict]]) -> dict:
    """Each label's NIAH misses by kind and task (hyla.experiment.niah_answers); labels without a miss left out."""
    misses = {label: miss_kinds(found) for label, found in sorted(records.items())}
    return {label: kinds for label, kinds in misses.items() if kinds}


def collect_evals(run: Path) -> dict:
    niah: dict = defaultdict(lambda: defaultdict(dict))
    records: dict = defaultdict(list)
    options: dict = defaultdict(list)
    csr, ppl, heads = {}, {}, {}
    for path in sorted((run / "evals").glob("*/results.json")):
        result = read_json(path)
        if result is None:
            continue
        label = label_of(path.parent.name)
        if result.get("kind") == "niah":
            _niah_cells(result, niah, label)
            records[label] += result.get("records", [])
            if niah_options(result) not in options[label]:
                options[label].append(niah_options(result))
        elif result.get("kind") == "csr":
            tasks = {}
            for task, values in result["tasks"].items():
                metric = CSR_METRIC.get(task, "acc")
                tasks[task] = {"metric": metric, "value": values.get(metric), "stderr": values.get(f"{metric}_stderr"),
                               "num_docs": values.get("num_docs")}
            present = [t["value"] for t in tasks.values() if t["value"] is not None]
            csr[label] = {"tasks": tasks, "average": sum(present) / len(present) if present else None,
                          "limit": result.get("settings", {}).get("limit")}
        elif result.get("kind") == "ppl":
            ppl[label] = {"summary": result["summary"], "buckets": result.get("buckets")}
        elif result.get("kind") == "analysis/hitrate":
            heads[label] = head_analysis(result)
    return {"niah": {k: dict(v) for k, v in niah.items()}, "niah_options": dict(options), "csr": csr, "ppl": ppl,
            "heads": heads,
            "niah_pairs": niah_pairs(records),
            "niah_misses": niah_misses(records),
            "niah_distance": {label: cells for label, found in sorted(records.items())
                              if (cells := by_distance(found))}}


# A head "finds" the needle when this share of its top-k keys at the answer position are the needle's value tokens,
# on average over the prompts.
FINDS_NEEDLE = 0.5


def head_analysis(result: dict) -> dict:
    """A `hyla analyze hitrate` result in brief: its prompts and options, and per head group (layer type) the heads,
    the mean top-k hit rate and answer entropy, the heads that find the needle (>= FINDS_NEEDLE) and the best."""
    settings = result.get("settings") or {}
    groups = {}
    for group, means in (result.get("summary") or {}).items():
        members = [r for r in result.get("heads") or [] if r.get("group") == group and r.get("hit_rate") is not None]
        best = max(members, key=lambda r: r["hit_rate"], default=None)
        groups[group] = {"num_heads": means.get("num_heads"), "hit_rate": means.get("hit_rate"),
                         "answer_entropy": means.get("answer_entropy"),
                         "finding": sum(r["hit_rate"] >= FINDS_NEEDLE for r in members),
                         "best": None if best is None else {"layer": best["layer"], "head": best["head"],
                                                            "hit_rate": best["hit_rate"]}}
    return {"task": settings.get("task"), "length": settings.get("length"),
            "num_samples": settings.get("num_samples"), "top_k": settings.get("top_k"),
            "options": settings.get("inference_options") or {}, "groups": groups}


def _heads_lines(heads: dict) -> list[str]:
    if not heads:
        return []
    rows = []
    for label, found in sorted(heads.items()):
        options = ", ".join(f"{k}={v}" for k, v in sorted(found["options"].items())) or "as saved"
        for group, cell in sorted(found["groups"].items()):
            best = cell["best"]
            rows.append([label, f"{found['task']} {_length(found['length']) if found['length'] else '-'} "
                                f"x{found['num_samples']}", options, group, str(cell["num_heads"]),
                         _cell(cell["hit_rate"]), _cell(cell["answer_entropy"]), str(cell["finding"]),
                         "-" if best is None else f"{best['layer']}.{best['head']}: {best['hit_rate']:.2f}"])
    top_k = next((found["top_k"] for found in heads.values() if found.get("top_k")), 64)
    return ["## Head analysis (`hyla analyze hitrate`)", "",
            f"Each head's Jacobian concentration at the answer position: the share of its top-{top_k} keys that are "
            f"the needle's value tokens (hit rate) and its normalized entropy, means over the group's heads and the "
            f"prompts; heads that find the needle: hit rate >= {FINDS_NEEDLE}. Plots: each job's "
            "entropy_vs_hitrate.png.", "",
            *_table(["job", "prompts", "inference options", "layer type", "heads", "hit rate", "entropy",
                     "heads that find the needle", "best head (layer.head)"], rows), ""]


def collect_conversion(folder: Path) -> dict | None:
    """The completed stages of a `hyla convert` folder: tokens, steps, seconds, losses, choices."""
    if not folder.is_dir():
        return None
    stages = {}
    for stage in STAGES:
        # A published stage (the HF export folder) keeps its manifest beside it, in NN-name.stage/.
        manifest = (read_json(folder / stage / "manifest.json")
                    or read_json(folder / f"{stage}.stage" / "manifest.json"))
        if manifest is None or manifest.get("status") != "complete":
            continue
        results = manifest["results"]
        keep = {k: results[k] for k in ("tokens", "steps", "seconds", "chosen", "method", "chosen_a", "loss_by_a",
                                        "criterion", "recall_loss_by_a", "recall_exact_by_a", "num_tokens", "length")
                if k in results}
        for end in ("first", "last"):
            if end in results:
                keep[f"loss_{end}"] = results[end].get("loss")
        stages[stage] = keep
    tokens = sum(stages.get(s, {}).get("tokens", 0) for s in ("01-align", "03-distill", "04-finetune"))
    return {"stages": stages, "training_tokens": tokens, "chosen": stages.get("02-select", {}).get("chosen"),
            "chosen_a": stages.get("05-scaling", {}).get("chosen_a")}


def collect_training(folder: Path) -> dict | None:
    """A `hyla train` folder's steps, losses and speed, from its metrics.jsonl."""
    metrics = []
    for line in (folder / "metrics.jsonl").read_text().splitlines():
        if line.strip():
            metrics.append(json.loads(line))
    if not metrics:
        return None
    last = metrics[-min(20, len(metrics)):]
    speeds = sorted(m["tok_per_s"] for m in (metrics[1:] or metrics) if "tok_per_s" in m)
    training = read_json(folder / "model" / "training.json") or {}
    return {"steps": metrics[-1].get("step"), "first_loss": metrics[0].get("loss"),
            "final_loss_mean_last_20": sum(m["loss"] for m in last) / len(last),
            "median_tok_per_s": speeds[len(speeds) // 2] if speeds else None,
            "exported": (folder / "model").is_dir(), "tokens": training.get("tokens")}


def summarize(run: Path) -> dict:
    summary = collect_evals(run)
    folders = [folder for folder in sorted(run.iterdir()) if folder.is_dir()]
    conversions = [folder for folder in folders if (folder / "00-data").is_dir()]
    summary["conversions"] = {folder.name: collect_conversion(folder) for folder in conversions}
    alignment = {folder.name: collect_alignment(folder) for folder in conversions}
    summary["alignment"] = {name: record for name, record in alignment.items() if record is not None}
    selection = {folder.name: collect_selection(folder) for folder in conversions}
    summary["selection"] = {name: record for name, record in selection.items() if record is not None}
    trainings = {}
    for folder in [*folders, *(sub for folder in folders for sub in sorted(folder.iterdir()) if sub.is_dir())]:
        if (folder / "metrics.jsonl").is_file() and not folder.name[:3].rstrip("-").isdigit():
            trainings[str(folder.relative_to(run))] = collect_training(folder)
    summary["trainings"] = trainings
    checks = sorted(run.glob("*/teacher-check.json")) + sorted(run.glob("teacher-check.json"))
    summary["teacher_check"] = read_json(checks[0]) if checks else None
    summary["corpus"] = {k: v for k, v in (read_json(run / "corpus" / "manifest.json") or {}).items()
                         if k in ("num_tokens", "counts", "sources", "num_documents")}
    plan = read_json(run / "plan.json") or {}
    summary["plan"] = {k: plan.get(k) for k in ("name", "source", "profile", "command", "git_sha")}
    summary["reference"] = (plan.get("report") or {}).get("reference")
    summary["niah_table"] = (plan.get("report") or {}).get("niah_table")
    # The plan's NIAH jobs are named as their result folders: their order is the rows' order.
    order = [label_of(job["name"]) for job in plan.get("jobs") or [] if job.get("name", "").startswith("niah-")]
    summary["niah_order"] = list(dict.fromkeys(order))
    summary["status"] = read_json(run / "status.json")
    return summary


def _length(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 and n >= 1024 else str(n)


def mean_at(by_task: dict, length: int) -> float | None:
    values = [cells[length]["accuracy"] for cells in by_task.values() if length in cells]
    return sum(values) / len(values) if values else None


def heldout_loss(conversion: dict | None) -> float | None:
    """The scaling stage's held-out loss with the logit scaling off (its long documents), or None."""
    losses = ((conversion or {}).get("stages", {}).get("05-scaling") or {}).get("loss_by_a") or {}
    return losses.get("None")


def ablation_rows(summary: dict) -> tuple[list[str], list[int]]:
    """The ablation conversions' labels (`abl-*`) and every NIAH length measured for them."""
    labels = sorted(label for label in summary["conversions"] if label.startswith("abl-"))
    niah = summary["niah"]
    return labels, sorted({n for label in labels for cells in niah.get(label, {}).values() for n in cells})


def _cell(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *("| " + " | ".join(r) + " |" for r in rows)]


def markdown(summary: dict) -> str:
    """The run's tables in markdown: NIAH (plain and graded), CSR, loss by position, ablations, conversions,
    trainings, stage-1 alignment."""
    plan = summary.get("plan") or {}
    lines = [f"# {plan.get('name') or 'experiment'}: results", ""]
    if plan.get("command"):
        lines += [f"`{plan['command']}` (commit {plan.get('git_sha') or 'unknown'})", ""]
    status = summary.get("status") or {}
    if status:
        counts = status["counts"]
        lines += [f"Jobs when this report was written: {counts['done']} done, {counts['failed']} failed, "
                  f"{counts['skipped']} skipped, {counts['waiting'] + counts['running']} running or waiting.", ""]
    niah = summary["niah"]
    lengths = sorted({n for by_task in niah.values() for cells in by_task.values() for n in cells})
    if niah and summary.get("niah_table") == "wide":
        lines += _niah_wide_lines(summary)
    elif niah:
        rows = [[label, task, *(_cell(niah[label][task].get(n, {}).get("accuracy")) for n in lengths)]
                for label in sorted(niah) for task in sorted(niah[label])]
        lines += ["## NIAH accuracy", "", *_table(["model", "task", *map(_length, lengths)], rows), ""]
    if niah:
        graded = [[label, task, *(_graded_cell(c) if "number_answers" in (c := niah[label][task].get(n, {})) else "-"
                                  for n in lengths)]
                  for label in sorted(niah) for task in sorted(niah[label])
                  if any("number_answers" in c for c in niah[label][task].values())]
        if graded:
            lines += ["NIAH graded (SK1, SK2): answers holding a 7-digit number / with >= 4 leading digits of the "
                      "needle / whose first number, of any length, begins with the needle's first 4 digits (copies "
                      "cut short count: the needle was reached)", "",
                      *_table(["model", "task", *map(_length, lengths)], graded), ""]
        lines += _pairs_lines(summary.get("niah_pairs") or {})
        lines += _misses_lines(summary.get("niah_misses") or {})
        lines += _distance_lines(summary.get("niah_distance") or {})
    lines += _heads_lines(summary.get("heads") or {})
    if summary["csr"]:
        tasks = sorted({t for result in summary["csr"].values() for t in result["tasks"]})
        rows = [[label, _cell(result["average"], 4), *(_cell(result["tasks"].get(t, {}).get("value"), 3)
                                                        for t in tasks)]
                for label, result in sorted(summary["csr"].items())]
        lines += ["## CSR (acc_norm; winogrande, lambada: acc)", "", *_table(["model", "average", *tasks], rows), ""]
    if summary["ppl"]:
        buckets = sorted({(b["start"], b["end"]) for r in summary["ppl"].values() for b in r.get("buckets") or []})
        rows = [[label, *(_cell(next((b["loss"] for b in r.get("buckets") or [] if (b["start"], b["end"]) == key),
                                     None)) for key in buckets)] for label, r in sorted(summary["ppl"].items())]
        header = ["model", *(f"{_length(a)}-{_length(b)}" for a, b in buckets)]
        lines += ["## Mean loss by position", "", *_table(header, rows), ""]
    lines += _ablation_lines(summary) + _training_lines(summary) + alignment_lines(summary.get("alignment"), _cell)
    lines += selection_lines(summary.get("selection") or {}, _cell)
    if summary.get("reference"):
        lines += _reference_lines(summary["reference"])
    return "\n".join(lines)


def _p_text(p: float) -> str:
    return f"{p:.4f}" if p >= 1e-4 else "< 0.0001"


def _pairs_lines(pairs: dict) -> list[str]:
    if not pairs:
        return []
    base = PAIRS_BASELINE
    rows = [[label, task, str(c["prompts"]), f"{c['right_a']} / {c['right_b']}", f"{c['only_a']} / {c['only_b']}",
             _p_text(c["p"])]
            for label, by_task in pairs.items() for task, c in by_task.items() if task != "unmatched"]
    unmatched = {label: by_task["unmatched"] for label, by_task in pairs.items() if by_task.get("unmatched")}
    note = (" Prompts only one side answered, left out: " + ", ".join(f"{k} {v}" for k, v in unmatched.items()) + "."
            if unmatched else "")
    return [f"NIAH prompt by prompt against {base} (every length; p: two-sided sign test over the prompts only one "
            f"model got right).{note}", "",
            *_table(["model", "task", "prompts", f"right: {base} / model", f"only {base} / only model", "p"], rows),
            ""]


def _misses_lines(misses: dict) -> list[str]:
    # A summary written before the key kind existed counted those answers in "other": "-" there.
    rows = [[label, task, str(c["misses"]), *(str(c[kind]) if kind in c else "-" for kind in ANSWER_KINDS)]
            for label, by_task in misses.items() for task, c in sorted(by_task.items())]
    if not rows:
        return []
    return ["NIAH misses by kind (every length; hyla.experiment.niah_answers): needle-shaped, the answer begins with "
            "a value of the needle's kind (a miscopy); key, hyphen-joined words as RULER's keys are (the question's "
            "key named instead of its value); restates, the question again; echo, the prompt's first sentence "
            "continued.", "",
            *_table(["model", "task", "misses", *(kind.replace("_", "-") for kind in ANSWER_KINDS)], rows), ""]


def _distance_lines(distance: dict) -> list[str]:
    rows = [[label, task, *(f"{total / count:.2f} ({count})" if count else "" for total, count in cells.values())]
            for label, by_task in distance.items() for task, cells in by_task.items()]
    if not rows:
        return []
    return ["NIAH by the needle's distance to the question (the prompt's tokens after it; every length pooled; "
            "accuracy (prompts); hyla.experiment.niah_distance): beyond ~2K only the attention layers carry the "
            "needle.", "", *_table(["model", "task", *DISTANCE_BINS], rows), ""]


def _options_text(options: list[dict]) -> str:
    def one(option: dict) -> str:
        return ", ".join(f"{name}={value}" for name, value in option.items()) or "as saved"

    return one(options[0]) if len(options) == 1 else "mixed: " + " / ".join(map(one, options))


def _niah_wide_lines(summary: dict) -> list[str]:
    """The plan's `report.niah_table: "wide"`: one NIAH table, a row per label (in the order of the plan's NIAH
    jobs), a column per task and length, and the inference options the row's results record."""
    niah, options = summary["niah"], summary.get("niah_options") or {}
    order = summary.get("niah_order") or []
    labels = [label for label in order if label in niah] + sorted(set(niah) - set(order))
    columns = sorted({(task, n) for by_task in niah.values() for task, cells in by_task.items() for n in cells})
    rows = [[label, _options_text(options.get(label) or [{}]),
             *(_cell(niah[label].get(task, {}).get(n, {}).get("accuracy")) for task, n in columns)]
            for label in labels]
    header = ["model", "inference options", *(f"{task} {_length(n)}" for task, n in columns)]
    lines = ["## NIAH accuracy", "", *_table(header, rows), ""]
    if any(len(options.get(label) or []) > 1 for label in labels):
        lines += [("A row marked mixed holds results run under different inference options (two evaluations "
                   "wrote to one label): its cells may come from either."), ""]
    return lines


def _reference_lines(reference: dict) -> list[str]:
    """Published numbers the plan quotes: a table of `rows` under `columns`, the tables of other fields under their
    names, then the notes and what else it holds."""
    lines = ["## Reference (published; other scale and training, for direction only)", ""]
    rest = dict(reference)
    for key in ("source", "setting"):
        if key in rest:
            lines.append(f"{key.capitalize()}: {rest.pop(key)}.")
    if isinstance(rest.get("rows"), dict) and isinstance(rest.get("columns"), list):
        columns, rows = rest.pop("columns"), rest.pop("rows")
        lines += ["", *_table(["", *columns], [[name, *map(str, values)] for name, values in rows.items()])]
    # Other tables: {"columns": [...], "row name": [values], ...} under their caption.
    for caption, table in [(key, value) for key, value in rest.items() if isinstance(value, dict)
                           and isinstance(value.get("columns"), list)]:
        rows = {name: values for name, values in rest.pop(caption).items() if name != "columns"}
        lines += ["", f"{caption}:", "", *_table(["", *table["columns"]], [[name, *map(str, values)]
                                                                          for name, values in rows.items()])]
    notes = rest.pop("notes", [])
    lines += ["", *(f"- {note}" for note in notes)]
    if rest:
        lines += ["", "```json", json.dumps(rest), "```"]
    return lines + [""]


def _ablation_lines(summary: dict) -> list[str]:
    labels, lengths = ablation_rows(summary)
    if not labels:
        return []
    rows = [[label, *(_cell(mean_at(summary["niah"].get(label, {}), n)) for n in lengths),
             _cell(summary["csr"].get(label, {}).get("average"), 3),
             _cell(heldout_loss(summary["conversions"][label]), 3)] for label in labels]
    return ["## Ablations: NIAH mean of the tasks, CSR average, held-out loss of the scaling stage (scaling off)",
            "", *_table(["variant", *map(_length, lengths), "CSR", "loss"], rows), ""]


def _scaling_lines(conversions: dict) -> list[str]:
    """The scaling stage's score of each candidate a: held-out loss, and on its recall documents (when it made
    them) the answer tokens' loss and the share answered exactly."""
    rows = []
    for name, conversion in conversions.items():
        scaling = conversion["stages"].get("05-scaling") or {}
        losses, recall = scaling.get("loss_by_a") or {}, scaling.get("recall_loss_by_a") or {}
        exact = scaling.get("recall_exact_by_a") or {}
        for a in losses:
            rows.append([name, "off" if a == "None" else a, _cell(losses[a], 3), _cell(recall.get(a), 3), _cell(exact.get(a)),
                         "chosen" if str(scaling.get("chosen_a")) == a else ""])
    if not rows:
        return []
    return ["## Scaling stage: each candidate a", "",
            *_table(["folder", "a", "held-out loss", "recall answer loss", "recall exact", ""], rows), ""]


def _training_lines(summary: dict) -> list[str]:
    lines = []
    conversions = {name: c for name, c in summary["conversions"].items() if c}
    if conversions:
        rows = [[name, f"{c['training_tokens']:,}", str(c["chosen"]), str(c["chosen_a"]),
                 ", ".join(f"{stage[3:]} {info['seconds']:.0f} s" for stage, info in c["stages"].items()
                           if info.get("seconds"))] for name, c in conversions.items()]
        lines += ["## Conversions", "", *_table(["folder", "training tokens", "attention layers", "a", "stages"], rows),
                  ""]
        lines += _scaling_lines(conversions)
    trainings = {name: t for name, t in summary["trainings"].items() if t}
    if trainings:
        rows = [[name, str(t["steps"]), _cell(t["first_loss"], 3), _cell(t["final_loss_mean_last_20"], 3),
                 "-" if t["median_tok_per_s"] is None else f"{t['median_tok_per_s']:,.0f}"]
                for name, t in trainings.items()]
        lines += ["## Trainings", "", *_table(["folder", "steps", "first loss", "loss (mean of last 20)",
                                               "median tok/s"], rows), ""]
    return lines


def plot(summary: dict, out: Path) -> list[Path]:
    """niah.png (one panel per task, a line per model), ppl.png, ablations.png, align.png: those the results
    allow."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    if summary["niah"]:
        written.append(_plot_niah(plt, summary["niah"], out))
    if any(result.get("buckets") for result in summary["ppl"].values()):
        written.append(_plot_ppl(plt, summary["ppl"], out))
    if ablation_rows(summary)[0]:
        written.append(_plot_ablations(plt, summary, out))
    if summary.get("alignment"):
        written.append(plot_alignment(summary["alignment"], out / "align.png"))
    return written


def _plot_niah(plt, niah: dict, out: Path) -> Path:
    tasks = sorted({task for by_task in niah.values() for task in by_task})
    figure, axes = plt.subplots(1, len(tasks), figsize=(4.4 * len(tasks), 3.6), sharey=True, squeeze=False)
    for axis, task in zip(axes[0], tasks):
        for label in sorted(niah):
            cells = niah[label].get(task, {})
            if cells:
                lengths = sorted(cells)
                axis.plot(lengths, [cells[n]["accuracy"] for n in lengths], marker="o", label=label)
        axis.set_xscale("log", base=2)
        axis.set_title(f"NIAH {task}")
        axis.set_xlabel("context length (tokens)")
    axes[0][0].set_ylabel("accuracy")
    axes[0][0].legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out / "niah.png", dpi=120)
    plt.close(figure)
    return out / "niah.png"


def _plot_ppl(plt, ppl: dict, out: Path) -> Path:
    figure, axis = plt.subplots(figsize=(6, 3.6))
    for label, result in sorted(ppl.items()):
        buckets = result.get("buckets") or []
        if buckets:
            axis.plot([b["end"] for b in buckets], [b["loss"] for b in buckets], marker="o", label=label)
    axis.set_xscale("log", base=2)
    axis.set_xlabel("position (bucket end)")
    axis.set_ylabel("mean loss")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(out / "ppl.png", dpi=120)
    plt.close(figure)
    return out / "ppl.png"


def _plot_ablations(plt, summary: dict, out: Path) -> Path:
    niah = summary["niah"]
    labels, lengths = ablation_rows(summary)
    series = [(f"NIAH {_length(n)} (mean of tasks)", [mean_at(niah.get(label, {}), n) for label in labels])
              for n in lengths]
    series.append(("CSR average", [summary["csr"].get(label, {}).get("average") for label in labels]))
    figure, (axis, loss_axis) = plt.subplots(1, 2, figsize=(13, 3.8), gridspec_kw={"width_ratios": [2, 1]})
    width = 0.8 / len(series)
    names = [label.removeprefix("abl-") for label in labels]
    for offset, (name, values) in enumerate(series):
        axis.bar([i + (offset - (len(series) - 1) / 2) * width for i in range(len(labels))],
                 [v if v is not None else 0.0 for v in values], width=width, label=name)
    axis.set_xticks(range(len(labels)), names, rotation=15)
    axis.set_ylim(0, 1)
    axis.set_title("retrieval and CSR (a missing bar: not measured or 0)", fontsize=9)
    axis.legend(fontsize=8)
    held_out = [heldout_loss(summary["conversions"][label]) for label in labels]
    loss_axis.bar(range(len(labels)), [v if v is not None else 0.0 for v in held_out], color="grey")
    loss_axis.set_xticks(range(len(labels)), names, rotation=15)
    scaling = next((c["stages"].get("05-scaling", {}) for c in summary["conversions"].values()
                    if c and c["stages"].get("05-scaling", {}).get("length")), {})
    loss_axis.set_title(f"held-out loss at {_length(scaling.get('length', 0))} tokens, scaling off", fontsize=9)
    figure.tight_layout()
    figure.savefig(out / "ablations.png", dpi=120)
    plt.close(figure)
    return out / "ablations.png"


def tarball(run: Path, path: Path) -> int:
    """Every small result file of the run (below TARBALL_MAX_BYTES; no weights, no corpora) in one .tar.xz (xz:
    ~25% smaller than gzip on a conversion's metrics and NIAH answers, which every GPU call carries back and the
    repository keeps); returns the number of files."""
    added: set[Path] = set()
    with tarfile.open(path, "w:xz") as archive:
        for pattern in TARBALL_PATTERNS:
            for file in sorted(run.glob(pattern)):
                if file.is_file() and file not in added and file.stat().st_size < TARBALL_MAX_BYTES:
                    archive.add(file, arcname=str(file.relative_to(run)))
                    added.add(file)
    return len(added)


def write_report(run: str | Path, out: str | Path | None = None, *, plots: bool = True,
                 archive: bool = True) -> dict[str, Any]:
    """Write OUT/summary.json, OUT/report.md, the plots and OUT/results.tar.xz (OUT defaults to RUN/report);
    returns the summary with `files` (what was written) and `markdown`."""
    run = Path(run)
    conversions = run.is_dir() and any((folder / "00-data").is_dir() for folder in run.iterdir())
    if not (run / "status.json").is_file() and not (run / "evals").is_dir() and not conversions:
        raise FileNotFoundError(f"{run} holds no experiment run (no status.json, no evals/) and no conversion "
                                f"folders (hyla convert --out {run}/NAME)")
    out = Path(out) if out is not None else run / "report"
    out.mkdir(parents=True, exist_ok=True)
    summary = summarize(run)
    write_json(out / "summary.json", summary)
    text = markdown(summary)
    write_atomic(out / "report.md", text.encode())
    files = [out / "summary.json", out / "report.md"]
    if plots:
        try:
            files += plot(summary, out)
        except Exception as err:  # noqa: BLE001 - the JSON and the tables matter more than the plots
            print(f"plots failed: {type(err).__name__}: {err}")
        for name in sorted(summary["selection"]):  # the selection stage's own plot, beside the others
            picture = run / name / SELECT_STAGE / "selection.png"
            if picture.is_file():
                files.append(out / f"selection-{name}.png")
                write_atomic(files[-1], picture.read_bytes())
    if archive:
        tarball(run, out / "results.tar.xz")
        files.append(out / "results.tar.xz")
    return {**summary, "files": [str(f) for f in files], "markdown": text}
