"""bench/smollm2/probe.py's CPU plumbing run (distillation tokens from its throughput: tests/experiment)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "smollm2"


@pytest.mark.slow
def test_probe_runs_every_stage_on_cpu(tmp_path):
    out = tmp_path / "probe.json"
    done = subprocess.run([sys.executable, str(BENCH / "probe.py"), "--out", str(out), "--smoke", "--steps", "1",
                           "--warmup", "1"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    cases = json.loads(out.read_text())["cases"]
    assert [(c["stage"], c["batch"], c["seq_len"], c["compiled"], c["checkpointed"]) for c in cases] == [
        ("align", 8, 8, False, False), ("distill", 8, 8, False, False), ("distill", 2, 32, False, False),
        ("distill", 1, 64, False, False), ("distill", 2, 64, False, False), ("distill", 4, 64, False, False),
        ("finetune", 1, 256, False, False),
        ("distill", 1, 64, True, False), ("finetune", 1, 256, True, False),  # then the compiled A/B cases
        ("distill", 4, 64, False, True), ("distill", 8, 64, False, True), ("finetune", 1, 256, False, True)]
    assert all(c["tok_per_s"] > 0 for c in cases)


def test_probe_refuses_alignment_with_checkpointing(tmp_path):
    done = subprocess.run([sys.executable, str(BENCH / "probe.py"), "--out", str(tmp_path / "p.json"), "--smoke",
                           "--checkpointed", "align:8x512"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "cannot run this way" in done.stderr.strip().splitlines()[-1]
