"""bench/run_breakdown.py on sitting D's files: the numbers docs/log/2026-12-02-device-overhead.md quotes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SITTING_D = REPO / "docs" / "results" / "smollm2-135m" / "halo-sitting-d"


def test_sitting_d_breakdown_reads_the_runs_own_records():
    sys.path.insert(0, str(REPO / "bench"))
    from run_breakdown import breakdown

    rows = {item: seconds for item, seconds, _ in breakdown(SITTING_D)}
    assert rows["before convert (the jobs it waited for)"] == 44.0
    assert rows["convert: start-up (imports, teacher, plan)"] == pytest.approx(39.8, abs=0.1)
    assert rows["convert: 05-scaling (not training)"] == 129.1
    training = sum(seconds for item, seconds in rows.items() if "(training)" in item)
    assert training == pytest.approx(707.6, abs=0.1)
    assert rows["evaluations of main side by side (slowest: niah-main-SK2-long)"] == 120.0
    assert rows["  csr-main"] == 112.0
