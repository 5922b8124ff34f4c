"""NIAH answers by the needle's distance to the question and by its position (`hyla.experiment.niah_distance`), in
`hyla experiment report` and on sitting N's published records (the numbers its log quotes)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from hyla.experiment import report
from hyla.experiment.niah_distance import BINS, bin_of, by_distance, by_length_and_depth

REPO = Path(__file__).resolve().parents[2]
SITTING_N = REPO / "docs" / "results" / "smollm2-135m" / "halo-sitting-n" / "results.tar.xz"


def record(depth, score, tokens=32000, task="SK2"):
    return {"task": task, "depth_percent": depth, "num_prompt_tokens": tokens, "score": score}


def test_bins_by_hand():
    assert [bin_of(n) for n in (0, 1023, 1024, 4095, 4096, 8192, 16383, 16384, 32767, 32768, 10**6)] == [
        "0-1K", "0-1K", "1-4K", "1-4K", "4-8K", "8-16K", "8-16K", "16-32K", "16-32K", "32K+", "32K+"]
    assert BINS == ("0-1K", "1-4K", "4-8K", "8-16K", "16-32K", "32K+")
    # 32,000 tokens: depth 100 leaves 0 after the needle, 50 leaves 16,000, 0 leaves 32,000; a RULER row without
    # depths is left out; MK-style partial scores add as they are
    records = [record(100, 1.0), record(50, 0.0), record(0, 1.0), record(0, 0.5), {"task": "SK2", "score": 1.0}]
    distance = by_distance(records)["SK2"]
    assert distance["0-1K"] == [1.0, 1] and distance["8-16K"] == [0.0, 1] and distance["16-32K"] == [1.5, 2]
    position = by_distance(records, measure="position")["SK2"]
    assert position["0-1K"] == [1.5, 2] and position["8-16K"] == [0.0, 1] and position["16-32K"] == [1.0, 1]
    with pytest.raises(ValueError, match="measure"):
        by_distance(records, measure="depth")


def test_length_and_depth_cells_by_hand():
    records = [{**record(30, 1.0), "length": 16384}, {**record(30, 0.0), "length": 16384},
               {**record(30, 1.0), "length": 32768}, {**record(70, 0.5, task="SK3"), "length": 16384},
               {"task": "SK2", "depth_percent": 10, "score": 1.0}]  # no length: left out
    cells = by_length_and_depth(records)
    assert cells == {"SK2": {(16384, 30): [1.0, 2], (32768, 30): [1.0, 1]}, "SK3": {(16384, 70): [0.5, 1]}}


def test_the_report_tables_each_models_answers_by_distance(tmp_path):
    for label, scores in (("main", (1.0, 0.0)), ("other", (1.0, 1.0))):
        folder = tmp_path / "evals" / f"niah-{label}-SK2-long"
        folder.mkdir(parents=True)
        records = [{**record(100, scores[0], tokens=40000), "length": 40960, "outputs": ["1"], "pred": "1",
                    "index": 0},
                   {**record(0, scores[1], tokens=40000), "length": 40960, "outputs": ["2"], "pred": "2", "index": 1}]
        (folder / "results.json").write_text(json.dumps({"kind": "niah", "records": records,
                                                         "tasks": {"SK2": {"by_length": {"32768": 0.5}}}}))
    evals = report.collect_evals(tmp_path)
    assert evals["niah_distance"]["main"]["SK2"]["32K+"] == [0.0, 1]
    text = report.markdown({**evals, "plan": {}, "status": None, "conversions": {}, "alignment": {}, "selection": {},
                            "trainings": {}})
    assert "| main | SK2 | 1.00 (1) |  |  |  |  | 0.00 (1) |" in text
    assert "| other | SK2 | 1.00 (1) |  |  |  |  | 1.00 (1) |" in text


def test_sitting_n_log_numbers():
    """N's log: its main finds 12 of 12 SK2 needles within 1K of the question and 31 of 63 beyond 4K."""
    sys.path.insert(0, str(REPO / "scripts"))
    from niah_paired import read_records

    records = [r for span in ("long", "short")
               for r in read_records(f"{SITTING_N}:evals/niah-main-SK2-{span}/results.json")]
    cells = by_distance(records)["SK2"]
    assert cells["0-1K"] == [12.0, 12]
    beyond = [cells[label] for label in ("4-8K", "8-16K", "16-32K", "32K+")]
    assert (sum(total for total, _ in beyond), sum(count for _, count in beyond)) == (31.0, 63)
