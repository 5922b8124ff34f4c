"""`hyla convert reselect`: the noise-aware rule applied again to a conversion's recorded selection, no scoring."""

from __future__ import annotations

import json

import pytest

from hyla.cli import main
from hyla.convert.select_report import build_report
from test_noise_select import run1_like


def recorded_conversion(root, *, energies: bool = True):
    """A conversion folder past its select stage: run 1-like scores chosen by HALO as published, and stage-1
    metrics in which layer 7 aligns worst."""
    scores = run1_like()
    (root / "02-select").mkdir(parents=True)
    build_report(scores, "halo", 2).write_json(root / "02-select" / "selection.json")
    (root / "01-align").mkdir()
    rows = []
    for step in (1, 2):
        row = {"step": step, "loss": 1.0}
        for layer in range(scores.num_layers):
            row[f"mse_{layer:02d}"] = 0.5 if layer == 7 else 0.1
            if energies:
                row[f"energy_{layer:02d}"] = 1.0
        rows.append(row)
    (root / "01-align" / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return root


def test_reselect_applies_the_noise_aware_rule_to_the_recorded_scores(tmp_path, capsys):
    run = recorded_conversion(tmp_path / "run")
    assert main(["convert", "reselect", "--out", str(run)]) == 0
    assert "noise-aware (alignment tie-break) [6, 5]" in capsys.readouterr().out
    comparison = json.loads((run / "reselect" / "comparison.json").read_text())
    # HALO as published keeps layer 1 (two missed prompts in 32) and leaves out layer 6 (all missed, but a CSR gap
    # of noise divides it); the rule keeps the two layers with a recall cost beyond the noise.
    assert comparison["recorded_chosen"] == comparison["halo_recomputed"] == [5, 1]
    assert comparison["noise_aware_alignment_tie_break"] == [6, 5]
    assert comparison["alignment_errors"]["7"] == pytest.approx(0.5)
    assert (run / "reselect" / "selection.png").is_file()
    assert json.loads((run / "reselect" / "selection.json").read_text())["noise"]["z"] == 2.0


def test_the_tie_break_orders_the_layers_the_scores_cannot(tmp_path):
    run = recorded_conversion(tmp_path / "run")
    assert main(["convert", "reselect", "--out", str(run), "--k", "3", "--report-dir", str(tmp_path / "r")]) == 0
    comparison = json.loads((tmp_path / "r" / "comparison.json").read_text())
    assert comparison["noise_aware_alignment_tie_break"] == [6, 5, 7]  # layer 7 aligns worst
    assert 7 in comparison["chosen_by_noise"]


@pytest.mark.parametrize("extra, message", [
    (["--noise-z", "0"], "--noise-z must be > 0"),
    (["--teacher", "smollm2-135m"], "--teacher and --energy-data go together"),
    (["--energy-shape", "4by512"], "--energy-shape: expected BATCHxSEQ"),
])
def test_bad_reselect_options_are_one_clear_error(tmp_path, capsys, extra, message):
    run = recorded_conversion(tmp_path / "run")
    assert main(["convert", "reselect", "--out", str(run), *extra]) == 2
    assert message in capsys.readouterr().err


def test_reselect_of_a_folder_without_a_selection_names_the_file(tmp_path, capsys):
    assert main(["convert", "reselect", "--out", str(tmp_path)]) == 2
    assert "02-select/selection.json is missing" in capsys.readouterr().err


def test_a_run_whose_metrics_lack_energies_has_no_alignment_tie_break_without_the_teacher(tmp_path):
    run = recorded_conversion(tmp_path / "run", energies=False)
    assert main(["convert", "reselect", "--out", str(run)]) == 0
    assert json.loads((run / "reselect" / "comparison.json").read_text())["alignment_errors"] is None
