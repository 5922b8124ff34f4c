"""bench/smollm2/plan_tokens.py: distillation tokens from a time budget and a measured throughput."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "smollm2"
sys.path.insert(0, str(BENCH))
import plan_tokens  # noqa: E402

PROBE = {"cases": [{"stage": "distill", "seq_len": 512, "batch": 32, "tok_per_s": 50_000.0},
                   {"stage": "distill", "seq_len": 4096, "batch": 4, "tok_per_s": 56_535.6},
                   {"stage": "finetune", "seq_len": 16384, "batch": 4, "tok_per_s": 100_000.0}]}


def test_tokens_are_whole_steps_at_the_drivers_shape():
    args = ["--main-set", "distill.seq_len=4096", "--main-set", "distill.batch_size=4"]
    tokens = plan_tokens.plan(PROBE, 420, 80e6, args)
    step = 4096 * 4
    assert tokens % step == 0
    assert tokens == int(56_535.6 * 420 // step) * step  # 23,740,416: what the 2026-11-30 run was given


def test_the_cap_and_the_default_shape():
    assert plan_tokens.plan(PROBE, 10_000, 1e6, []) == int(1e6 // (512 * 32)) * 512 * 32
    assert plan_tokens.plan(PROBE, 0.1, 1e9, []) == 512 * 32  # 5,000 tokens: at least one step


def test_a_compiled_run_is_planned_from_the_compiled_rate():
    probe = {"cases": PROBE["cases"] + [
        {"stage": "distill", "seq_len": 4096, "batch": 4, "compiled": True, "tok_per_s": 90_000.0},
        {"stage": "finetune", "seq_len": 16384, "batch": 4, "compiled": True, "error": "RuntimeError: x"}]}
    shape = ["--main-set", "distill.seq_len=4096", "--main-set", "distill.batch_size=4"]
    step = 4096 * 4
    assert plan_tokens.plan(probe, 100, 1e9, shape) == int(56_535.6 * 100 // step) * step  # eager run: eager rate
    compiled = plan_tokens.plan(probe, 100, 1e9, shape + ["--main-set", "distill.compile=true"])
    assert compiled == int(90_000.0 * 100 // step) * step
    failed = {"cases": PROBE["cases"] + [
        {"stage": "distill", "seq_len": 4096, "batch": 4, "compiled": True, "error": "RuntimeError: x"}]}
    with pytest.raises(SystemExit, match="no compiled distill case at seq_len 4096"):
        plan_tokens.plan(failed, 100, 1e9, shape + ["--main-set", "distill.compile=true"])


def test_a_checkpointed_run_is_planned_from_the_checkpointed_rate():
    probe = {"cases": PROBE["cases"] + [
        {"stage": "distill", "seq_len": 4096, "batch": 16, "checkpointed": True, "tok_per_s": 80_000.0}]}
    shape = ["--main-set", "distill.seq_len=4096", "--main-set", "distill.batch_size=16"]
    step = 4096 * 16
    kept = plan_tokens.plan(probe, 100, 1e9, shape + ["--main-set", "distill.checkpoint_activations=true"])
    assert kept == int(80_000.0 * 100 // step) * step
    assert plan_tokens.plan(probe, 100, 1e9, shape) == int(56_535.6 * 100 // step) * step  # eager: the eager case


def test_the_runs_batch_size_picks_its_rate():
    probe = {"cases": PROBE["cases"] + [
        {"stage": "distill", "seq_len": 4096, "batch": 8, "tok_per_s": 70_000.0},
        {"stage": "distill", "seq_len": 4096, "batch": 16, "error": "OutOfMemoryError: x"}]}
    shape = ["--main-set", "distill.seq_len=4096"]
    step = 4096 * 8
    assert plan_tokens.plan(probe, 100, 1e9, shape + ["--main-set", "distill.batch_size=8"]) == \
        int(70_000.0 * 100 // step) * step
    # a batch size the probe did not measure: the first case at that length
    assert plan_tokens.plan(probe, 100, 1e9, shape + ["--main-set", "distill.batch_size=2"]) == \
        int(56_535.6 * 100 // 8192) * 8192


def test_a_shape_the_probe_did_not_measure_is_refused():
    with pytest.raises(SystemExit, match="no distill case at seq_len 2048"):
        plan_tokens.plan(PROBE, 100, 1e9, ["--main-set", "distill.seq_len=2048"])
