"""Noise-aware HALO selection: the score s_i with every gap below z standard errors counted as zero.

HALO's score (docs/method.md, "Layer selection"; `hyla.convert.selection.halo_scores`) divides a recall gap by a CSR
gap, both measured on a few hundred prompts. A gap of one missed prompt in 32 (R = 31/32 against 32/32) is no
evidence of a recall cost, yet it gives s_i = 0.03 / (C_max − C_i + ε), which ranks the layer above every layer that
scored 32/32. So here

    ΔR_i = R_best − R_i,  se(ΔR_i) = √(se_i² + se_best²),  ΔR_i counts as 0 when ΔR_i < z · se(ΔR_i)

(the same for ΔC_i), and s_i = ΔR_i / (ΔC_i + ε) from the counted gaps. z = 2 by default. The variance estimate is
the marginal one: both scores come from the same prompts, so the paired error is smaller or equal, and the rule errs
toward calling a gap noise. A gap whose standard error is unknown counts as measured.

Layers left at s_i = 0 are interchangeable by the scores. When more than k layers have s_i > 0, the ranking decides;
when fewer do, the remaining places go by a tie-break that is itself measured on far more data than the selection's
prompts: by default the layer's stage-1 alignment error (the fraction of the teacher's output energy its Lightning
twin misses, over millions of tokens), worst first. Without it the tie-break is the raw HALO score (the old rule).

A layer is *chosen by noise* when it is kept only by the tie-break (s_i = 0) or when its scores cannot be told apart
from those of the first layer left out (the cut-off): both its recall and its CSR differ from the cut-off's by less
than z standard errors of the difference. The layers left out that cannot be told apart from the last kept layer are
the *near misses*.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from hyla.convert.selection import HALO_EPSILON, SelectionScores, _check_k, halo_scores

DEFAULT_Z = 2.0
TIE_BREAKS = ("alignment", "halo")


@dataclass(frozen=True)
class Gap:
    """best − this layer's score, its standard error (None: unknown), and whether it counts in s_i."""

    value: float
    stderr: float | None
    counted: bool

    @property
    def counted_value(self) -> float:
        return self.value if self.counted else 0.0


def _best_layer(values: Mapping[int, float], stderrs: Mapping[int, float | None]) -> int:
    # Among equal maxima, the best-measured one (smallest known standard error), then the lowest index.
    def key(layer: int):
        stderr = stderrs.get(layer)
        return (-values[layer], math.inf if stderr is None else stderr, layer)

    return min(values, key=key)


def score_gaps(values: Mapping[int, float], stderrs: Mapping[int, float | None], z: float) -> dict[int, Gap]:
    """The gap of every layer to the best one, counted only when it is at least z standard errors."""
    best = _best_layer(values, stderrs)
    gaps = {}
    for layer in sorted(values):
        value = values[best] - values[layer]
        stderr = _difference_stderr(stderrs.get(layer), stderrs.get(best))
        counted = value > 0 and (stderr is None or value >= z * stderr)
        gaps[layer] = Gap(value, stderr, counted)
    return gaps


def _difference_stderr(first: float | None, second: float | None) -> float | None:
    return None if first is None or second is None else math.hypot(first, second)


def noise_aware_scores(scores: SelectionScores, z: float = DEFAULT_Z, eps: float = HALO_EPSILON) -> dict[int, float]:
    """s_i = ΔR_i / (ΔC_i + eps) with the gaps below z standard errors counted as zero; z = 0 is HALO's own s_i."""
    recall_gaps = score_gaps(scores.recall, scores.recall_stderr, z)
    csr_gaps = score_gaps(scores.csr, scores.csr_stderr, z)
    return {layer: recall_gaps[layer].counted_value / (csr_gaps[layer].counted_value + eps)
            for layer in scores.layers}


def indistinguishable(scores: SelectionScores, first: int, second: int, z: float = DEFAULT_Z) -> bool:
    """True when both the recall and the CSR of two variants differ by less than z standard errors of the
    difference (an unknown error makes any difference count)."""
    for values, stderrs in ((scores.recall, scores.recall_stderr), (scores.csr, scores.csr_stderr)):
        difference = abs(values[first] - values[second])
        stderr = _difference_stderr(stderrs.get(first), stderrs.get(second))
        if difference > 0 and (stderr is None or difference >= z * stderr):
            return False
    return True


@dataclass
class NoiseAwareChoice:
    """What the noise-aware rule chose and why (see the module docstring)."""

    z: float
    chosen: list[int]  # best first
    ranking: list[int]  # every scored layer, best first
    scores: dict[int, float]  # s_i from the counted gaps
    recall_gaps: dict[int, Gap]
    csr_gaps: dict[int, Gap]
    tie_break: str  # "alignment" or "halo": what ordered the layers the scores could not
    tie_break_values: dict[int, float] = field(default_factory=dict)
    cutoff: int | None = None  # the best-ranked layer left out
    chosen_by_noise: list[int] = field(default_factory=list)
    near_misses: list[int] = field(default_factory=list)

    @property
    def num_resolved(self) -> int:
        """How many layers have a recall cost beyond the noise (s_i > 0)."""
        return sum(1 for value in self.scores.values() if value > 0)


def noise_aware_select(scores: SelectionScores, k: int, *, z: float = DEFAULT_Z,
                       alignment_errors: Mapping[int, float] | None = None) -> NoiseAwareChoice:
    """The k layers of highest noise-aware s_i; equal s_i (above all the zeros) ordered by the stage-1 alignment
    error, highest first, when `alignment_errors` covers every scored layer, else by HALO's raw s_i; then by the
    lower recall, then the lower index."""
    if not isinstance(z, (int, float)) or not z >= 0:
        raise ValueError(f"the noise threshold z must be a number ≥ 0, got {z!r}")
    layers = scores.layers
    k = _check_k(k, len(layers), "scored layers")
    counted = noise_aware_scores(scores, z)
    raw = halo_scores(scores.recall, scores.csr)
    use_alignment = alignment_errors is not None and all(layer in alignment_errors for layer in layers)
    tie_values = {layer: float(alignment_errors[layer]) for layer in layers} if use_alignment else raw

    def key(layer: int):
        return (-counted[layer], -tie_values[layer], scores.recall[layer], layer)

    ranking = sorted(layers, key=key)
    chosen = ranking[:k]
    choice = NoiseAwareChoice(
        z=float(z), chosen=chosen, ranking=ranking, scores=counted,
        recall_gaps=score_gaps(scores.recall, scores.recall_stderr, z),
        csr_gaps=score_gaps(scores.csr, scores.csr_stderr, z),
        tie_break="alignment" if use_alignment else "halo",
        tie_break_values=dict(alignment_errors) if use_alignment else {},
        cutoff=ranking[k] if k < len(ranking) else None,
    )
    if choice.cutoff is not None and chosen:
        choice.chosen_by_noise = [layer for layer in chosen if counted[layer] == 0
                                  or indistinguishable(scores, layer, choice.cutoff, z)]
        choice.near_misses = [layer for layer in ranking[k:] if indistinguishable(scores, layer, chosen[-1], z)]
    return choice


def alignment_errors_from_metrics(metrics: list[dict], num_layers: int, tail: float = 0.1) -> dict[int, float] | None:
    """Per layer, the fraction of the teacher's output energy its twin missed over the last `tail` of stage 1's
    steps (Σ mse_i / Σ energy_i, from the stage's metrics.jsonl rows); None when the rows lack the energies (runs
    made before they were logged)."""
    rows = [row for row in metrics if all(f"mse_{i:02d}" in row and f"energy_{i:02d}" in row
                                          for i in range(num_layers))]
    if not rows:
        return None
    rows = rows[-max(1, int(len(rows) * tail)):]
    return {i: sum(row[f"mse_{i:02d}"] for row in rows) / max(sum(row[f"energy_{i:02d}"] for row in rows), 1e-30)
            for i in range(num_layers)}
