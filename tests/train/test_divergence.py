"""Divergence: a non-finite loss or gradient, or a collapse, stops training with one line; no update is applied from
a non-finite gradient and no checkpoint is written from non-finite weights; a resume refuses other settings."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hyla.cli import main
from hyla.train import LoopSettings, OptimSettings, TrainingDiverged, run_training
from hyla.train.checkpoint import save_checkpoint
from hyla.train.distributed import Distributed
from hyla.train.divergence import DivergenceMonitor

from test_train import corpus, train_args  # noqa: F401  (the module's corpus fixture)


def test_non_finite_loss_or_gradient_norm_stops_at_once():
    monitor = DivergenceMonitor(None, 3, description="distill", lr=1e6)
    monitor.check(1, 1.0, 0.5)
    with pytest.raises(TrainingDiverged, match=r"^distill: loss is nan at step 2, no update applied: .*\(1e\+06\)"):
        monitor.check(2, math.nan, 0.5)
    with pytest.raises(TrainingDiverged, match="gradient norm is inf at step 3"):
        DivergenceMonitor(None).check(3, 1.0, math.inf)


def test_zero_gradient_norm_for_patience_steps_is_a_collapse():
    monitor = DivergenceMonitor(None, 3)
    monitor.check(1, 10.8, 0.0)
    monitor.check(2, 10.8, 0.0)
    monitor.check(3, 10.8, 0.2)  # the count restarts
    monitor.check(4, 10.8, 0.0)
    monitor.check(5, 10.8, 0.0)
    with pytest.raises(TrainingDiverged, match=r"gradient norm has been 0 for 3 steps \(to step 6\)"):
        monitor.check(6, 10.8, 0.0)


def test_loss_at_ln_vocab_after_learning_is_a_collapse_but_a_fresh_model_near_it_is_not():
    uniform = math.log(49152)
    fresh = DivergenceMonitor(49152, 3)
    for step in range(1, 10):  # a fresh model starts near ln V: no stop before it has learned anything
        fresh.check(step, uniform, 1.0)
    monitor = DivergenceMonitor(49152, 3)
    monitor.check(1, 4.0, 1.0)
    monitor.check(2, uniform + 1e-4, 1.0)
    monitor.check(3, uniform, 1.0)
    with pytest.raises(TrainingDiverged, match=r"= ln\(vocabulary 49152\) for 3 steps \(to step 4\).*uniform"):
        monitor.check(4, uniform - 1e-4, 1.0)


class _Batches:
    """A resumable loader of fixed random batches for a tiny linear model."""

    def __init__(self):
        self.position = 0

    def __next__(self):
        self.position += 1
        generator = torch.Generator().manual_seed(self.position)
        return {"input_ids": torch.randn(4, 3, generator=generator), "labels": torch.randn(4, 1, generator=generator)}

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def _mse(model, batch):
    return torch.nn.functional.mse_loss(model(batch["input_ids"]), batch["labels"]), {}


def test_no_update_is_applied_from_a_non_finite_gradient(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    snapshots = []

    def loss_fn(model, batch):
        snapshots.append({k: v.detach().clone() for k, v in model.state_dict().items()})
        loss, metrics = _mse(model, batch)
        # A finite loss whose gradient is NaN at the third step (the case `hyla train --lr 1e6` showed).
        return (loss * torch.tensor(math.nan) if len(snapshots) == 3 else loss), metrics

    loop = LoopSettings(steps=6, checkpoint_every=1)
    with pytest.raises(TrainingDiverged, match="at step 3, no update applied"):
        run_training(model, loss_fn, _Batches(), OptimSettings(lr=1e-2, warmup_steps=0), loop, tmp_path)
    after = model.state_dict()
    assert all(torch.equal(after[k], snapshots[2][k]) for k in after)
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-1", "step-2"]
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [1, 2]


def test_a_checkpoint_is_never_written_from_non_finite_weights(tmp_path):
    model = torch.nn.Linear(3, 1)
    with torch.no_grad():
        model.weight[0, 1] = math.inf
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    with pytest.raises(TrainingDiverged, match="step-4 not written: 1 of 2 weight tensors hold NaN or inf"):
        save_checkpoint(tmp_path, 4, model=model, optimizer=optimizer, scheduler=scheduler, loader_state={},
                        meta={}, env=Distributed(), keep_last=2)
    assert list(tmp_path.iterdir()) == []


def test_metrics_hold_json_null_where_a_metric_is_not_finite(tmp_path):
    def loss_fn(model, batch):
        loss, _ = _mse(model, batch)
        return loss, {"ratio": math.nan}

    run_training(torch.nn.Linear(3, 1), loss_fn, _Batches(), OptimSettings(lr=1e-3, warmup_steps=0),
                 LoopSettings(steps=2, checkpoint_every=2), tmp_path)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["ratio"] for r in records] == [None, None]
    assert "NaN" not in (tmp_path / "metrics.jsonl").read_text()


def test_hyla_train_stops_on_divergence_and_a_resume_with_other_settings_is_refused(
        corpus, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "run"
    assert main(train_args(corpus, out, "--lr", "1e6")) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("hyla train: error: train: ") and "no update applied" in last and "--lr" in last
    for checkpoint in (out / "checkpoints").iterdir():  # what is kept is finite
        assert all(torch.isfinite(t).all() for t in load_file(checkpoint / "model.safetensors").values())
    for line in (out / "metrics.jsonl").read_text().splitlines():
        json.loads(line)
    assert main(train_args(corpus, out, "--lr", "1e-3")) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "it was made with other settings (lr=1000000.0 then, 0.001 now)" in err[0]
    assert f"delete {out / 'checkpoints'} to start fresh" in err[0]


def test_a_resume_may_change_speed_settings_and_paths(corpus, tmp_path):  # noqa: F811
    """--compile, --checkpoint-activations, --checkpoint-every and where the corpus and config files are do not change
    the results, so a resume accepts them changed."""
    import shutil

    out = tmp_path / "run"
    assert main(train_args(corpus, out, "--steps", "3", "--checkpoint-every", "2")) == 0
    shutil.rmtree(out / "model")
    moved = tmp_path / "moved"
    shutil.copytree(corpus / "corpus", moved / "corpus")
    shutil.copy(corpus / "config.json", moved / "config.json")
    (out / "checkpoints" / "step-3").rename(out / "checkpoints" / "step-3-set-aside")
    assert main(train_args(moved, out, "--steps", "3", "--checkpoint-every", "3", "--checkpoint-activations")) == 0
    assert Path(out / "model" / "model.safetensors").exists()
