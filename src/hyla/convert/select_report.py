"""The layer-selection report: per-layer R_i, C_i (± standard errors), s_i and the chosen set, as JSON, a terminal
table and a plot.

docs/method.md ("Layer selection") warns that s_i is noise-dominated when the CSR gap C_max − C_i is within the
metric's standard error. The report flags those layers: gap ≤ √(se_i² + se_m²), with m the layer of C_max. Both
estimates come from the same documents, so the paired error of the difference is smaller; this marginal one errs on
the side of flagging.

With a noise threshold z (`noise_z`, the conversion's default 2), "halo" selects by the noise-aware rule of
`hyla.convert.noise_select` (gaps below z standard errors count as zero), and the report shows each gap with its
standard error, whether it counted, the tie-break that ordered the layers the scores could not, and the layers chosen
by noise.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hyla.convert.noise_select import NoiseAwareChoice, noise_aware_select
from hyla.convert.selection import (
    HALO_EPSILON,
    SelectionScores,
    halo_scores,
    halo_select,
    normalize_method,
    select_layers,
)


@dataclass
class SelectionReport:
    scores: SelectionScores
    method: str
    k: int
    chosen: list[int]
    # s_i and the full HALO ranking over the scored layers (empty when none were scored).
    halo_scores: dict[int, float] = field(default_factory=dict)
    halo_ranking: list[int] = field(default_factory=list)
    csr_gap_within_stderr: list[int] = field(default_factory=list)
    kl_by_layer: dict[int, float] | None = None
    notes: list[str] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)
    # The noise-aware rule's view (set when a noise threshold is given and recall was scored).
    noise: NoiseAwareChoice | None = None

    def to_json(self) -> dict[str, Any]:
        """The scores' own JSON (so `SelectionScores.from_dict` reads it back), each row extended with s_i, its
        HALO rank and flags, plus the method, k, chosen layers, notes and settings."""
        payload = self.scores.to_dict()
        rank = {layer: position + 1 for position, layer in enumerate(self.halo_ranking)}
        for row in payload["layers"]:
            layer = row["layer"]
            row["halo_score"] = self.halo_scores.get(layer)
            row["halo_rank"] = rank.get(layer)
            row["chosen"] = layer in self.chosen
            row["csr_gap_within_stderr"] = layer in self.csr_gap_within_stderr
            if self.kl_by_layer is not None:
                row["kl"] = self.kl_by_layer.get(layer)
            if self.noise is not None:
                row.update(_noise_row(self.noise, layer))
        header = {"method": self.method, "k": self.k, "chosen": self.chosen, "epsilon": HALO_EPSILON}
        extra = {"halo_ranking": self.halo_ranking, "notes": self.notes, "settings": self.settings}
        if self.noise is not None:
            extra["noise"] = _noise_summary(self.noise)
        return {**header, **payload, **extra}

    def write_json(self, path: str | Path) -> Path:
        from hyla.outputs import write_atomic

        path = Path(path)
        write_atomic(path, (json.dumps(self.to_json(), indent=2, allow_nan=False) + "\n").encode())
        return path

    def print_table(self, console: Any = None) -> None:
        """A rich table (T_R: the teacher's recall), teacher first, one row per scored layer; then the notes."""
        from rich.console import Console

        console = console or Console()
        console.print(selection_table(self))
        for note in self.notes:
            console.print(f"note: {note}", highlight=False)

    def plot(self, path: str | Path) -> Path:
        """PNG (written atomically): R_i and C_i bars with ±1 standard error, s_i below; kept layers shaded."""
        path = Path(path)
        plot_selection(self, path)
        return path


def _noise_row(noise: NoiseAwareChoice, layer: int) -> dict[str, Any]:
    recall, csr = noise.recall_gaps[layer], noise.csr_gaps[layer]
    return {
        "recall_gap": recall.value, "recall_gap_stderr": recall.stderr, "recall_gap_counted": recall.counted,
        "csr_gap": csr.value, "csr_gap_stderr": csr.stderr, "csr_gap_counted": csr.counted,
        "noise_aware_score": noise.scores[layer], "noise_aware_rank": noise.ranking.index(layer) + 1,
        "alignment_error": noise.tie_break_values.get(layer),
        "chosen_by_noise": layer in noise.chosen_by_noise, "near_miss": layer in noise.near_misses,
    }


def _noise_summary(noise: NoiseAwareChoice) -> dict[str, Any]:
    return {"z": noise.z, "tie_break": noise.tie_break, "ranking": noise.ranking, "cutoff": noise.cutoff,
            "num_resolved": noise.num_resolved, "chosen_by_noise": noise.chosen_by_noise,
            "near_misses": noise.near_misses}


def csr_gap_within_stderr(scores: SelectionScores) -> list[int]:
    """Layers whose gap C_max − C_i is at most the standard error of that difference; [] when errors are unknown."""
    if not scores.csr:
        return []
    best = min(scores.csr, key=lambda layer: (-scores.csr[layer], layer))
    flagged = []
    for layer in scores.layers:
        errors = (scores.csr_stderr.get(layer), scores.csr_stderr.get(best))
        if None in errors:
            continue
        if scores.csr[best] - scores.csr[layer] <= math.hypot(*errors):
            flagged.append(layer)
    return flagged


def _notes(scores: SelectionScores, report: SelectionReport) -> list[str]:
    notes = []
    if scores.csr and any(scores.csr_stderr.get(layer) is None for layer in scores.layers):
        notes.append("Some CSR standard errors are unknown: whether s_i is noise-dominated cannot be judged.")
    flagged = report.csr_gap_within_stderr
    if flagged:
        notes.append(
            f"C_max − C_i is within one standard error for {len(flagged)} of {len(scores.layers)} layers {flagged}: "
            "their HALO scores are dominated by noise (docs/method.md, 'Layer selection'); more CSR documents would "
            "separate them."
        )
    noisy_chosen = [layer for layer in report.chosen if layer in flagged]
    if report.method == "halo" and noisy_chosen and report.noise is None:
        notes.append(f"Chosen layers with a CSR gap within the noise: {noisy_chosen}.")
    if report.noise is not None:
        notes.extend(_noise_notes(report))
    return notes


def _noise_notes(report: SelectionReport) -> list[str]:
    noise, notes = report.noise, []
    tie_break = ("their stage-1 alignment error (worst aligned first)" if noise.tie_break == "alignment"
                 else "HALO's raw s_i (no alignment errors were given)")
    notes.append(f"Gaps below {noise.z:g} standard errors count as zero: {noise.num_resolved} of "
                 f"{len(noise.ranking)} layers have a recall cost beyond the noise; layers of equal s_i are "
                 f"ordered by {tie_break}.")
    if report.method == "halo" and noise.chosen_by_noise:
        notes.append(f"Chosen by noise (kept only by the tie-break, or not distinguishable from the cut-off layer "
                     f"{noise.cutoff}): {noise.chosen_by_noise}; near misses: {noise.near_misses}.")
    return notes


def build_report(
    scores: SelectionScores,
    method: str = "halo",
    k: int | None = None,
    *,
    kl_by_layer: Mapping[int, float] | None = None,
    layers: Sequence[int] | None = None,
    settings: Mapping[str, Any] | None = None,
    noise_z: float | None = None,
    alignment_errors: Mapping[int, float] | None = None,
) -> SelectionReport:
    """Select by `method` (see `select_layers`) from `scores`, and gather what the report shows. With `noise_z`
    (> 0) and recall scores, "halo" selects by the noise-aware rule (`noise_select.noise_aware_select`, equal scores
    ordered by `alignment_errors` when given) and the report shows its view whatever the method."""
    method = normalize_method(method)
    noise = None
    if noise_z and scores.recall:
        num_kept = k if k is not None else scores.num_layers // 4
        noise = noise_aware_select(scores, min(num_kept, len(scores.layers)), z=noise_z,
                                   alignment_errors=alignment_errors)
    chosen = select_layers(
        method,
        num_layers=scores.num_layers,
        k=k,
        recall=scores.recall or None,
        csr=scores.csr or None,
        teacher_recall=scores.teacher_recall,
        kl_by_layer=kl_by_layer,
        layers=layers,
    )
    if method == "halo" and noise is not None:
        chosen = noise.chosen
    report = SelectionReport(
        scores=scores,
        method=method,
        k=len(chosen),
        chosen=chosen,
        kl_by_layer=None if kl_by_layer is None else {int(i): float(kl) for i, kl in kl_by_layer.items()},
        settings=dict(settings or {}),
        noise=noise,
    )
    if scores.recall:
        report.halo_scores = halo_scores(scores.recall, scores.csr)
        report.halo_ranking = halo_select(scores.recall, scores.csr, len(scores.recall))
    report.csr_gap_within_stderr = csr_gap_within_stderr(scores)
    report.notes = _notes(scores, report)
    return report


def _with_error(value: float | None, stderr: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.3f}" + (f"±{stderr:.3f}" if stderr is not None else "")


def selection_table(report: SelectionReport) -> Any:
    if report.noise is not None:
        return noise_table(report)
    from rich.table import Table

    scores = report.scores
    title = f"Layer selection: {report.method}, k={report.k}, keep {report.chosen}"
    caption = "* CSR gap within one standard error: s is noise-dominated" if report.csr_gap_within_stderr else None
    # No borders: eight columns fit an 80-column terminal.
    table = Table(title=title, caption=caption, box=None, pad_edge=False, header_style="bold")
    for column in ("layer", "R±se", "C±se", "T_R−R", "C_max−C", "s", "rank", "kept"):
        table.add_column(column, justify="right", no_wrap=True)
    if scores.teacher_recall is not None:
        teacher_recall = _with_error(scores.teacher_recall, scores.teacher_recall_stderr)
        table.add_row("teacher", teacher_recall, _with_error(scores.teacher_csr, scores.teacher_csr_stderr))
    csr_max = max(scores.csr.values(), default=0.0)
    rank = {layer: position + 1 for position, layer in enumerate(report.halo_ranking)}
    chosen_rank = {layer: position + 1 for position, layer in enumerate(report.chosen)}
    for layer in scores.layers:
        drop = "—" if scores.teacher_recall is None else f"{scores.teacher_recall - scores.recall[layer]:+.3f}"
        noisy = "*" if layer in report.csr_gap_within_stderr else ""
        table.add_row(
            str(layer),
            _with_error(scores.recall[layer], scores.recall_stderr.get(layer)),
            _with_error(scores.csr[layer], scores.csr_stderr.get(layer)),
            drop,
            f"{csr_max - scores.csr[layer]:.3f}{noisy}",
            f"{report.halo_scores[layer]:.3g}" if layer in report.halo_scores else "—",
            str(rank.get(layer, "—")),
            f"#{chosen_rank[layer]}" if layer in chosen_rank else "",
            style="bold" if layer in chosen_rank else None,
        )
    return table


def _gap_text(gap) -> str:
    # A gap that does not count (below z standard errors) is shown in brackets.
    return f"{gap.value:.3f}" if gap.counted or gap.value == 0 else f"({gap.value:.3f})"


def noise_table(report: SelectionReport) -> Any:
    """The table of the noise-aware rule: gaps (bracketed when within the noise), s_i from the counted gaps, the
    tie-break's alignment error, rank; kept layers bold, `~` marks a layer chosen by noise."""
    from rich.table import Table

    scores, noise = report.scores, report.noise
    title = f"Layer selection: {report.method}, k={report.k}, keep {report.chosen}"
    caption = (f"(gap): below {noise.z:g} standard errors, counted as 0; ~ chosen by noise; "
               f"{noise.num_resolved} layers resolved")
    table = Table(title=title, caption=caption, box=None, pad_edge=False, header_style="bold")
    columns = ["layer", "R±se", "C±se", "ΔR", "ΔC", "s"]
    columns += ["align"] if noise.tie_break == "alignment" else []
    for column in columns + ["rank", "kept"]:
        table.add_column(column, justify="right", no_wrap=True)
    if scores.teacher_recall is not None:
        table.add_row("teacher", _with_error(scores.teacher_recall, scores.teacher_recall_stderr),
                      _with_error(scores.teacher_csr, scores.teacher_csr_stderr))
    chosen_rank = {layer: position + 1 for position, layer in enumerate(report.chosen)}
    for layer in scores.layers:
        kept = ""
        if layer in chosen_rank:
            kept = f"#{chosen_rank[layer]}" + ("~" if layer in noise.chosen_by_noise else "")
        cells = [str(layer), _with_error(scores.recall[layer], scores.recall_stderr.get(layer)),
                 _with_error(scores.csr[layer], scores.csr_stderr.get(layer)), _gap_text(noise.recall_gaps[layer]),
                 _gap_text(noise.csr_gaps[layer]), f"{noise.scores[layer]:.3g}"]
        if noise.tie_break == "alignment":
            cells.append(f"{noise.tie_break_values[layer]:.3f}")
        cells += [str(noise.ranking.index(layer) + 1), kept]
        table.add_row(*cells, style="bold" if layer in chosen_rank else None)
    return table


def _error_bars(stderrs: Mapping[int, float | None], layers: list[int]) -> list[float]:
    # Unknown errors draw no bar.
    return [stderrs.get(layer) or 0.0 for layer in layers]


def plot_selection(report: SelectionReport, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hyla.outputs import save_figure

    scores, layers = report.scores, report.scores.layers
    figure, (score_axes, halo_axes) = plt.subplots(
        2, 1, sharex=True, figsize=(max(6.0, 0.3 * scores.num_layers + 2.0), 6.0)
    )
    for axes in (score_axes, halo_axes):
        for layer in report.chosen:
            axes.axvspan(layer - 0.5, layer + 0.5, color="gold", alpha=0.35, linewidth=0)
    recall_values = [scores.recall[layer] for layer in layers]
    csr_values = [scores.csr[layer] for layer in layers]
    recall_errors, csr_errors = _error_bars(scores.recall_stderr, layers), _error_bars(scores.csr_stderr, layers)
    score_axes.bar([x - 0.2 for x in layers], recall_values, 0.4, yerr=recall_errors, capsize=2, label="R (recall)")
    score_axes.bar([x + 0.2 for x in layers], csr_values, 0.4, yerr=csr_errors, capsize=2, label="C (CSR)")
    if scores.teacher_recall is not None:
        score_axes.axhline(scores.teacher_recall, color="C0", linestyle="--", linewidth=1, label="teacher R")
        score_axes.axhline(scores.teacher_csr, color="C1", linestyle="--", linewidth=1, label="teacher C")
    score_axes.set_ylabel("accuracy of M(i)")
    # Headroom above accuracy 1 keeps the legend off the bars.
    score_axes.set_ylim(0.0, 1.25)
    score_axes.legend(fontsize="small", ncol=4, loc="upper center")
    score_axes.set_title(f"Layer selection: {report.method}, k={report.k}, keep {report.chosen} (shaded)")
    colors = ["C3" if layer in report.chosen else "C7" for layer in layers]
    if report.noise is None:
        halo_values = [report.halo_scores.get(layer, 0.0) for layer in layers]
        hatches = ["//" if layer in report.csr_gap_within_stderr else "" for layer in layers]
        label = "HALO score s_i\n(hatched: CSR gap within noise)"
    else:
        halo_values = [report.noise.scores[layer] for layer in layers]
        hatches = ["//" if layer in report.noise.chosen_by_noise else "" for layer in layers]
        label = (f"s_i, gaps < {report.noise.z:g} se = 0\n(dots: raw s_i;\nhatched: chosen by noise)")
        halo_axes.plot(layers, [report.halo_scores.get(layer, 0.0) for layer in layers], "k.", markersize=4)
    halo_axes.bar(layers, halo_values, 0.6, color=colors, hatch=hatches, edgecolor="white")
    # s_i spans 0 to ΔR/ε ≈ 1e6: linear near zero, logarithmic above 1.
    halo_axes.set_yscale("symlog", linthresh=1.0)
    halo_axes.set_ylabel(label)
    halo_axes.set_xlabel("layer i (replaced by its RNN twin)")
    halo_axes.set_xticks(range(scores.num_layers))
    halo_axes.set_xlim(-0.6, scores.num_layers - 0.4)
    save_figure(figure, path)
