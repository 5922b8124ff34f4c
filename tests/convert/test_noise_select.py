"""Noise-aware HALO selection (hyla.convert.noise_select) and its report, on synthetic scores."""

import json
import math

import pytest

from hyla.convert.noise_select import (
    alignment_errors_from_metrics, indistinguishable, noise_aware_scores, noise_aware_select, score_gaps,
)
from hyla.convert.select_report import build_report
from hyla.convert.selection import HALO_EPSILON as EPS
from hyla.convert.selection import SelectionScores, halo_scores, mean_and_stderr


def proportion(correct: int, total: int) -> tuple[float, float | None]:
    """The mean and standard error of `correct` 1s among `total` prompts, as the recall scorer reports them."""
    return mean_and_stderr([1.0] * correct + [0.0] * (total - correct))


def run1_like(num_layers: int = 8) -> SelectionScores:
    """32 prompts per variant; layer 0 misses 1, layer 1 misses 2, layer 5 misses 8, layer 6 all; every CSR gap
    within noise (se 0.035)."""
    scores = SelectionScores(num_layers)
    missed = {0: 1, 1: 2, 5: 8, 6: 32}
    for layer in range(num_layers):
        csr = 0.40 + 0.005 * ((layer * 3) % 4)
        scores.add(layer, proportion(32 - missed.get(layer, 0), 32), (csr, 0.035), 1.0)
    return scores


def test_gaps_below_two_standard_errors_count_as_zero_by_hand():
    scores = run1_like()
    gaps = score_gaps(scores.recall, scores.recall_stderr, z=2.0)
    # 31/32: gap 1/32, se √((31/32)(1/32)/31)... = 0.03125 (the best layer has se 0): 0.031 < 0.0625 -> 0.
    assert gaps[0].value == pytest.approx(1 / 32) and gaps[0].stderr == pytest.approx(0.03125)
    assert not gaps[0].counted and gaps[0].counted_value == 0
    # 30/32: 0.0625 < 2 x 0.0435; 24/32: 0.25 >= 2 x 0.0777; 0/32: gap 1, se 0 -> counts.
    assert not gaps[1].counted and gaps[5].counted and gaps[6].counted
    assert gaps[2].value == 0 and not gaps[2].counted
    # z = 0 is HALO's own s_i
    assert noise_aware_scores(scores, z=0) == pytest.approx(halo_scores(scores.recall, scores.csr))


def test_noise_aware_scores_by_hand():
    scores = run1_like()
    s = noise_aware_scores(scores)
    # All CSR gaps within noise: every denominator is ε; only layers 5 and 6 have a recall cost.
    assert s[5] == pytest.approx(0.25 / EPS) and s[6] == pytest.approx(1.0 / EPS)
    assert all(s[layer] == 0 for layer in (0, 1, 2, 3, 4, 7))
    # A CSR gap beyond the noise divides: layer 5 with C 0.30 (gap 0.115 > 2 x 0.0495).
    scores.csr[5] = 0.30
    best_csr = max(scores.csr.values())
    assert noise_aware_scores(scores)[5] == pytest.approx(0.25 / (best_csr - 0.30 + EPS))


def test_misses_within_noise_no_longer_rank_above_a_perfect_layer():
    scores = run1_like()
    old = build_report(scores, "halo", 3)
    # HALO as published: CSR noise of 0.005 puts layer 6 (recall 0) behind layer 1 (two missed prompts in 32).
    assert old.chosen == [5, 1, 6]
    errors = {layer: 0.1 for layer in range(8)} | {0: 0.02, 1: 0.03, 3: 0.3, 4: 0.2}
    choice = noise_aware_select(scores, 3, alignment_errors=errors)
    assert choice.chosen == [6, 5, 3] and choice.tie_break == "alignment"
    assert choice.num_resolved == 2 and choice.cutoff == 4
    # Layer 3 is kept only by the tie-break; layer 4 (next by alignment error) and every other full-recall layer
    # cannot be told apart from it.
    assert choice.chosen_by_noise == [3]
    assert choice.near_misses == [4, 2, 7, 1, 0]


def test_without_alignment_errors_the_tie_break_is_the_raw_halo_score():
    scores = run1_like()
    choice = noise_aware_select(scores, 3)
    assert choice.tie_break == "halo" and choice.chosen == [6, 5, 1] and choice.chosen_by_noise == [1]
    partial = {0: 0.5}  # not every layer: not used
    assert noise_aware_select(scores, 3, alignment_errors=partial).tie_break == "halo"


def test_a_resolved_layer_within_noise_of_the_cutoff_is_chosen_by_noise():
    scores = SelectionScores(4)
    scores.add(0, (0.50, 0.05), (0.4, 0.01), 1.0)
    scores.add(1, (0.60, 0.05), (0.4, 0.01), 1.0)
    scores.add(2, (1.00, 0.00), (0.4, 0.01), 1.0)
    scores.add(3, (0.95, 0.02), (0.4, 0.01), 1.0)
    choice = noise_aware_select(scores, 1)
    # Both 0 and 1 have a significant cost; 0's lead over 1 (0.1) is below 2 x √(0.05² + 0.05²) = 0.141.
    assert choice.chosen == [0] and choice.cutoff == 1
    assert choice.chosen_by_noise == [0] and choice.near_misses == [1]
    assert indistinguishable(scores, 0, 1) and not indistinguishable(scores, 0, 2)


def test_unknown_standard_errors_count_a_gap_as_measured():
    scores = SelectionScores(3)
    scores.add(0, (1.0, None), (0.4, None), 1.0)
    scores.add(1, (0.97, None), (0.4, None), 1.0)
    scores.add(2, (1.0, None), (0.4, None), 1.0)
    assert noise_aware_scores(scores)[1] == pytest.approx(0.03 / EPS)
    assert not indistinguishable(scores, 0, 1)


def test_bad_threshold_and_k_are_refused():
    with pytest.raises(ValueError, match="noise threshold"):
        noise_aware_select(run1_like(), 2, z=-1)
    with pytest.raises(ValueError, match="k must be"):
        noise_aware_select(run1_like(), 9)


def test_report_shows_standard_errors_and_layers_chosen_by_noise(tmp_path):
    pytest.importorskip("matplotlib")
    from rich.console import Console

    scores = run1_like(num_layers=12)
    scores.teacher_recall, scores.teacher_recall_stderr, scores.teacher_csr, scores.teacher_csr_stderr = (
        1.0, 0.0, 0.41, 0.035)
    errors = {layer: 0.01 * layer for layer in range(12)}
    report = build_report(scores, "halo", None, noise_z=2.0, alignment_errors=errors)
    assert report.k == 3 and report.chosen == [6, 5, 11]
    payload = json.loads(report.write_json(tmp_path / "selection.json").read_text())
    assert payload["noise"]["z"] == 2.0 and payload["noise"]["tie_break"] == "alignment"
    assert payload["noise"]["chosen_by_noise"] == [11] and payload["noise"]["cutoff"] == 10
    row = payload["layers"][1]
    assert row["recall_gap"] == pytest.approx(1 / 16) and not row["recall_gap_counted"]
    assert row["recall_gap_stderr"] == pytest.approx(math.hypot(proportion(30, 32)[1], 0.0))
    assert row["csr_gap_stderr"] == pytest.approx(math.hypot(0.035, 0.035))
    assert payload["layers"][11]["chosen_by_noise"] and payload["layers"][11]["alignment_error"] == 0.11
    assert SelectionScores.from_dict(payload) == scores
    assert any("Chosen by noise" in note for note in payload["notes"])

    console = Console(width=80, record=True)
    report.print_table(console)
    text = console.export_text()
    assert "#3~" in text and "(0.062)" in text and "align" in text
    assert all(len(line) <= 80 for line in text.splitlines())
    assert report.plot(tmp_path / "selection.png").read_bytes()[:4] == b"\x89PNG"


def test_a_baseline_rule_still_chooses_by_its_own_rule_beside_the_noise_view():
    report = build_report(run1_like(), "uniform", 2, noise_z=2.0)
    assert report.chosen == [2, 6] and report.noise is not None
    assert not any("Chosen by noise" in note for note in report.notes)


def test_alignment_errors_from_the_last_tenth_of_the_metrics():
    rows = [{"step": step, "mse_00": 1.0, "energy_00": 10.0, "mse_01": 0.5, "energy_01": 1.0} for step in range(18)]
    rows += [{"step": 18 + step, "mse_00": 0.1, "energy_00": 10.0, "mse_01": 0.2, "energy_01": 2.0}
             for step in range(2)]
    assert alignment_errors_from_metrics(rows, 2) == pytest.approx({0: 0.01, 1: 0.1})
    assert alignment_errors_from_metrics([{"mse_00": 1.0, "mse_01": 1.0}], 2) is None
