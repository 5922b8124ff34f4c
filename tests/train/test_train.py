"""`hyla train` from scratch: runs, resumes after SIGKILL to the same weights, LongCE, the schedule."""

from __future__ import annotations

import contextlib
import io
import json
import math
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from hyla.cli import main
from hyla.train.losses import ce_loss, longce_loss
from hyla.train.optim import OptimSettings, lr_at
from killable import kill_when, start_blocking

CONFIG = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4, "num_attention_heads": 4,
          "num_key_value_heads": 2, "layer_types": ["lightning", "lightning", "lightning", "attention"]}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    from hyla.data.tokenize import PrepareSettings, prepare_corpus
    from offline_models import TEXT, teacher_tokenizer

    root = tmp_path_factory.mktemp("train")
    teacher_tokenizer().save_pretrained(root / "tokenizer")
    texts = root / "texts"
    texts.mkdir()
    for i in range(40):
        (texts / f"doc{i}.txt").write_text(TEXT * (1 + i % 3) + f" document {i}.")
    settings = PrepareSettings(tokenizer=str(root / "tokenizer"), sources=(str(texts),))
    prepare_corpus(root / "corpus", settings, show_progress=False)
    (root / "config.json").write_text(json.dumps(CONFIG))
    return root


def train_args(root: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--config", str(root / "config.json"), "--data", str(root / "corpus"), "--out", str(out),
            "--steps", "12", "--seq-len", "64", "--batch-size", "4", "--lr", "3e-3", "--warmup-steps", "2",
            "--checkpoint-every", "1", "--device", "cpu", *extra]


# Four steps, one checkpoint at the end: the runs that compare two ways of training.
FOUR_STEPS = ["--steps", "4", "--checkpoint-every", "4"]


@pytest.fixture(scope="module")
def twelve_steps(corpus, tmp_path_factory) -> Path:
    """The run folder of `train_args` as they are, run once for the tests that read it (none writes to it)."""
    out = tmp_path_factory.mktemp("twelve-steps") / "run"
    assert main(train_args(corpus, out)) == 0
    return out


@pytest.fixture(scope="module")
def four_steps(corpus, tmp_path_factory) -> tuple[Path, str]:
    """The run folder of `train_args` with FOUR_STEPS, run once for the tests that read it, and what it printed."""
    out = tmp_path_factory.mktemp("four-steps") / "run"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(train_args(corpus, out, *FOUR_STEPS)) == 0
    return out, printed.getvalue()


def test_training_lowers_the_loss_and_exports_a_model(twelve_steps):
    from transformers import AutoModelForCausalLM

    losses = [json.loads(line)["loss"] for line in (twelve_steps / "metrics.jsonl").read_text().splitlines()]
    assert len(losses) == 12 and sum(losses[-3:]) / 3 < sum(losses[:3]) / 3
    model = AutoModelForCausalLM.from_pretrained(twelve_steps / "model")
    assert model.config.layer_types == CONFIG["layer_types"]
    # The corpus's tokenizer travels with the model, so `hyla eval` can load the folder as it is.
    from hyla.models.loading import load_model
    from offline_models import teacher_tokenizer

    _, tokenizer = load_model(str(twelve_steps / "model"))
    assert tokenizer("hello world").input_ids == teacher_tokenizer()("hello world").input_ids


def test_checkpointed_activations_train_to_the_same_weights(four_steps, corpus, tmp_path, capsys):
    (plain, printed), kept = four_steps, tmp_path / "kept"
    # What the plain run printed was kept: its header line is there, the words are not.
    assert "hyla train: " in printed and "activation checkpointing" not in printed
    assert main(train_args(corpus, kept, *FOUR_STEPS, "--checkpoint-activations")) == 0
    assert "activation checkpointing" in capsys.readouterr().out
    expected = load_file(plain / "model" / "model.safetensors")
    actual = load_file(kept / "model" / "model.safetensors")
    for name in expected:  # the recomputed forward is the same arithmetic: bitwise equal on CPU
        assert torch.equal(expected[name], actual[name]), name


@pytest.mark.slow
def test_training_killed_mid_run_resumes_to_the_same_weights(twelve_steps, corpus, tmp_path):
    reference, killed = twelve_steps, tmp_path / "killed"
    process = start_blocking(train_args(corpus, killed), block_after_step=5)
    kill_when(process, killed / "checkpoints" / "step-5")
    assert main(train_args(corpus, killed)) == 0
    expected = load_file(reference / "model" / "model.safetensors")
    actual = load_file(killed / "model" / "model.safetensors")
    for name in expected:
        assert torch.equal(expected[name], actual[name]), name
    curve = lambda out: [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert curve(reference) == curve(killed)


def test_bad_config_is_one_clear_error(corpus, tmp_path, capsys):
    (tmp_path / "bad.json").write_text(json.dumps({**CONFIG, "layer_types": ["lightning", "mamba"] * 2}))
    args = train_args(corpus, tmp_path / "x")
    args[args.index("--config") + 1] = str(tmp_path / "bad.json")
    assert main(args) == 2
    assert "unknown layer types" in capsys.readouterr().err


def _tiny_model():
    from hyla import HypeNetConfig, HypeNetForCausalLM

    torch.manual_seed(0)
    return HypeNetForCausalLM(HypeNetConfig(vocab_size=50, **CONFIG)).eval()


def test_longce_equals_ce_when_the_window_covers_the_sequence():
    """With a window of the whole sequence, short and full losses coincide: every weight is exp(0) = 1."""
    model = _tiny_model()
    batch = {"input_ids": torch.randint(0, 50, (2, 32)), "labels": torch.randint(0, 50, (2, 32))}
    loss, metrics = longce_loss(model, batch, window=32)
    expected, _ = ce_loss(model, batch)
    assert torch.allclose(loss, expected, atol=1e-6)
    assert metrics["mean_weight"] == pytest.approx(1.0, abs=1e-5)


def test_longce_weights_follow_the_influence(monkeypatch):
    """Hand-computed: full losses (1, 2), short losses (1 + ln 2, 2 + 10): weights (2, cap 5) ->
    (2*1 + 5*2) / (2 + 5) = 12/7."""
    import hyla.train.losses as losses

    monkeypatch.setattr(losses, "token_losses", lambda model, ids, labels: torch.tensor([[1.0, 2.0]]))
    monkeypatch.setattr(losses, "short_context_losses",
                        lambda model, ids, labels, window: torch.tensor([[1.0 + math.log(2.0), 12.0]]))
    loss, _ = losses.longce_loss(None, {"input_ids": None, "labels": None}, cap=5.0)
    assert loss.item() == pytest.approx(12 / 7)


def test_schedule_warms_up_then_decays_to_min_lr():
    settings = OptimSettings(lr=1e-3, min_lr=1e-5, warmup_steps=10, schedule="cosine")
    assert lr_at(0, 100, settings) == pytest.approx(1e-4)
    assert lr_at(9, 100, settings) == pytest.approx(1e-3)
    assert lr_at(10, 100, settings) == pytest.approx(1e-3)
    assert lr_at(55, 100, settings) == pytest.approx((1e-3 + 1e-5) / 2)
    assert lr_at(100, 100, settings) == pytest.approx(1e-5)
    constant = OptimSettings(lr=1e-5, min_lr=1e-5, warmup_steps=0, schedule="constant")
    assert lr_at(7, 100, constant) == 1e-5


def test_train_help_documents_every_option(capsys):
    with pytest.raises(SystemExit):
        main(["train", "--help"])
    import argparse

    from hyla.train import cli

    parser = argparse.ArgumentParser()
    cli.register(parser.add_subparsers())
    train = next(a for a in parser._subparsers._group_actions[0].choices.values())
    undocumented = [a.option_strings for a in train._actions if a.option_strings and not a.help]
    assert undocumented == []
    assert "--compile" in capsys.readouterr().out


@pytest.mark.slow
def test_two_processes_train_the_loss_curve_of_one(four_steps, corpus, tmp_path):
    """DDP under torchrun (2 gloo processes), each with half of the global batch. Tolerance 1e-4 relative: the runs
    differ only in how the gradients are summed, ~1e-7 a step in float32 over 4 steps of AdamW."""
    import os
    import subprocess
    import sys

    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m",
               "hyla.cli", *train_args(corpus, tmp_path / "two", *FOUR_STEPS, "--data-parallel", "ddp")]
    completed = subprocess.run(command, capture_output=True, text=True, timeout=300,
                               env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert completed.returncode == 0, completed.stderr[-3000:]
    assert "data parallel: ddp (data_parallel=ddp)" in completed.stdout
    read = lambda out: [json.loads(line)["loss"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    one, two = read(four_steps[0]), read(tmp_path / "two")
    assert len(one) == len(two) == 4
    for a, b in zip(one, two):
        assert abs(a - b) <= 1e-4 * abs(a), (one, two)
