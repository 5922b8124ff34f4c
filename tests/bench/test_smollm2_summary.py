"""bench/smollm2/niah_digits.py (graded NIAH answers) and its place in summarize.py's NIAH cells."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "smollm2"
sys.path.insert(0, str(BENCH))
import niah_digits  # noqa: E402
import summarize  # noqa: E402


def record(pred, needle="1234567", task="SK1", length=4096):
    return {"task": task, "length": length, "outputs": [needle], "pred": pred}


def test_grade_record_by_hand():
    assert niah_digits.grade_record(record(" 1234567.")) == {"exact": True, "digits_right": 1.0, "leading_4": True,
                                                             "number_answer": True}
    near = niah_digits.grade_record(record(" 1234999 and more"))
    assert near == {"exact": False, "digits_right": pytest.approx(4 / 7), "leading_4": True, "number_answer": True}
    shifted = niah_digits.grade_record(record(" 9123456"))  # every digit one place off: none right by position
    assert shifted["digits_right"] == 0.0 and not shifted["leading_4"] and shifted["number_answer"]
    assert niah_digits.grade_record(record(" the key to the key")) == {
        "exact": False, "digits_right": 0.0, "leading_4": False, "number_answer": False}
    # Runs on past the needle: RULER's string match counts it, and the first 7 digits are the needle's.
    assert niah_digits.grade_record(record(" 12345678888"))["exact"]


def test_grade_means_by_cell_and_skips_non_numeric_tasks():
    records = [record(" 1234567"), record(" 1299999"), record(" nothing"), record(" 1234567", length=8192),
               record(" a uuid", needle="3f2a-...", task="SK3")]
    cells = niah_digits.grade(records)
    assert set(cells) == {("SK1", 4096), ("SK1", 8192)}
    cell = cells[("SK1", 4096)]
    assert cell["n"] == 3 and cell["exact"] == pytest.approx(1 / 3) and cell["leading_4"] == pytest.approx(1 / 3)
    assert cell["number_answer"] == pytest.approx(2 / 3) and cell["digits_right"] == pytest.approx((1 + 2 / 7) / 3)


def test_summary_cells_carry_the_graded_scores(tmp_path):
    folder = tmp_path / "evals" / "niah-main-SK1-short"
    folder.mkdir(parents=True)
    records = [record(" 1234567"), record(" 1234000"), record(" no")]
    folder.joinpath("results.json").write_text(json.dumps({
        "kind": "niah", "records": records,
        "tasks": {"SK1": {"by_length": {"4096": 1 / 3}}}}))
    cell = summarize.collect_evals(tmp_path)["niah"]["main"]["SK1"][4096]
    assert cell["accuracy"] == pytest.approx(1 / 3) and cell["num_samples"] == 3
    assert cell["number_answers"] == pytest.approx(2 / 3) and cell["near_misses"] == pytest.approx(2 / 3)


def test_fixed_scaling_evaluations_get_their_own_label_line_and_ablation_table(tmp_path, capsys):
    for name, accuracy in (("niah-main-a500-SK1-long", 0.5), ("niah-abl-halo", 0.0)):
        folder = tmp_path / "evals" / name
        folder.mkdir(parents=True)
        folder.joinpath("results.json").write_text(json.dumps({
            "kind": "niah", "records": [record(" 1234567", length=32768)],
            "tasks": {"SK1": {"by_length": {"32768": accuracy}}}}))
    stage = tmp_path / "abl-halo" / "05-scaling"
    stage.mkdir(parents=True)
    (tmp_path / "abl-halo" / "00-data").mkdir()
    stage.joinpath("manifest.json").write_text(json.dumps({
        "status": "complete", "results": {"chosen_a": None, "loss_by_a": {"None": 2.5, "500": 2.7}, "length": 32768}}))
    summary = summarize.collect_evals(tmp_path)
    assert summary["niah"]["main-a500"]["SK1"][32768]["accuracy"] == 0.5
    summary["conversions"] = {"abl-halo": summarize.collect_conversion(tmp_path / "abl-halo")}
    summarize.print_tables(summary)
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("abl-halo ") and "2.500" in line)
    assert row.split()[1:] == ["0.00", "-", "2.500"]  # NIAH 32K, no CSR, held-out loss with the scaling off
    (tmp_path / "out").mkdir()
    summarize.plot(summary, tmp_path / "out")
    assert (tmp_path / "out" / "niah.png").is_file() and (tmp_path / "out" / "ablations.png").is_file()
