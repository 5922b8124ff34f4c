"""`hyla train`'s run folder under faults: one writer at a time, damaged checkpoints passed over or named, settings and
config files checked before anything is written."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
import torch
from safetensors.torch import load_file

from hyla.cli import main
from hyla.outputs import FolderInUse, exclusive_folder
from killable import kill_when, start_blocking
from test_train import CONFIG, corpus, train_args  # noqa: F401  (the module's corpus fixture)


def _truncate(path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def test_a_second_writer_is_refused_at_once_and_a_killed_one_leaves_no_lock(corpus, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "run"
    process = start_blocking(train_args(corpus, out), block_after_step=2)
    try:
        deadline = time.time() + 300
        while not (out / "checkpoints" / "step-2").exists():
            assert process.poll() is None and time.time() < deadline
            time.sleep(0.05)
        started = time.perf_counter()
        assert main(train_args(corpus, out)) == 2
        assert time.perf_counter() - started < 5
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"hyla train: error: {out} is in use by another hyla run (pid {process.pid} since ")
        assert "\n" not in err
    finally:
        kill_when(process, out / "checkpoints" / "step-2")
    assert main(train_args(corpus, out)) == 0  # the kernel dropped the killed run's lock
    assert (out / "model" / "model.safetensors").exists()


def test_the_lock_is_held_across_processes_and_a_folder_it_made_for_nothing_is_removed(tmp_path):
    folder = tmp_path / "fresh"
    holder = ("import sys, time; from pathlib import Path; from hyla.outputs import exclusive_folder\n"
              "with exclusive_folder(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(60)")
    process = subprocess.Popen([sys.executable, "-c", holder, str(folder)], stdout=subprocess.PIPE, text=True)
    try:
        assert process.stdout.readline().strip() == "held"
        with pytest.raises(FolderInUse, match="is in use by another hyla run"):
            with exclusive_folder(folder):
                pass
    finally:
        process.kill()
        process.wait()
    with exclusive_folder(folder):
        pass
    # The killed holder made the folder; this holder found only the lock file in it and removed both.
    assert (folder / "hyla.lock").exists()
    other = tmp_path / "other"
    with exclusive_folder(other):
        pass
    assert not other.exists()


def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(corpus, tmp_path, capsys):  # noqa: F811
    short = ["--steps", "4", "--checkpoint-every", "1"]
    reference, damaged = tmp_path / "reference", tmp_path / "damaged"
    assert main(train_args(corpus, reference, *short)) == 0
    assert main(train_args(corpus, damaged, *short)) == 0
    _truncate(damaged / "checkpoints" / "step-4" / "model.safetensors")
    capsys.readouterr()
    assert main(train_args(corpus, damaged, *short)) == 0
    printed = capsys.readouterr().out
    assert f"note: checkpoint {damaged / 'checkpoints' / 'step-4'} is damaged (model.safetensors is " in printed
    assert f"note: resuming from {damaged / 'checkpoints' / 'step-3'}" in printed
    expected = load_file(reference / "model" / "model.safetensors")
    actual = load_file(damaged / "model" / "model.safetensors")
    assert all(torch.equal(expected[name], actual[name]) for name in expected)


def test_no_usable_checkpoint_names_the_folder_to_delete(corpus, tmp_path, capsys):  # noqa: F811
    short = ["--steps", "4", "--checkpoint-every", "1"]
    out = tmp_path / "run"
    assert main(train_args(corpus, out, *short)) == 0
    _truncate(out / "checkpoints" / "step-4" / "trainer.pt")
    (out / "checkpoints" / "step-3" / "meta.json").write_text("{not json")
    capsys.readouterr()
    assert main(train_args(corpus, out, *short)) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and f"no usable checkpoint in {out / 'checkpoints'}" in err
    assert "step-4: trainer.pt is" in err and "step-3: meta.json unreadable" in err
    assert err.endswith(f"delete {out / 'checkpoints'} to start this training over")


@pytest.mark.parametrize("change,message", [
    ({"hiden_size": 64}, "unknown field 'hiden_size' (did you mean 'hidden_size'?)"),
    ({"hidden_size": 0}, "hidden_size must be >= 1, got 0"),
    ({"hidden_size": "wide"}, "hidden_size"),
], ids=["typo", "range", "type"])
def test_a_bad_config_field_is_refused_before_anything_is_written(corpus, tmp_path, capsys, change, message):  # noqa: F811
    (tmp_path / "bad.json").write_text(json.dumps({**CONFIG, **change}))
    out = tmp_path / "never"
    args = train_args(corpus, out)
    args[args.index("--config") + 1] = str(tmp_path / "bad.json")
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("hyla train: error: ") and message in err and "\n" not in err
    assert not out.exists()


@pytest.mark.parametrize("flag,value,message", [
    ("--batch-size", "0", "batch_size must be >= 1, got 0"),
    ("--seq-len", "-5", "seq_len must be >= 1, got -5"),
    ("--lr", "0", "lr must be > 0, got 0.0"),
    ("--steps", "0", "steps must be >= 1, got 0"),
], ids=["batch", "seq", "lr", "steps"])
def test_out_of_range_train_options_are_refused_before_anything_is_written(corpus, tmp_path, capsys, flag, value,  # noqa: F811
                                                                          message):
    out = tmp_path / "never"
    args = train_args(corpus, out)
    args[args.index(flag) + 1] = value
    assert main(args) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_training_json_holds_numbers_as_numbers(corpus, tmp_path):  # noqa: F811
    out = tmp_path / "run"
    assert main(train_args(corpus, out, "--steps", "2", "--checkpoint-every", "2")) == 0
    settings = json.loads((out / "model" / "training.json").read_text())["settings"]
    assert settings["steps"] == 2 and settings["lr"] == 3e-3 and settings["compile"] is False
    assert settings["device"] == "cpu" and settings["out"] == str(out)
