"""Resumable training checkpoints: `checkpoints/step-N/` folders written atomically (tmp folder, then rename),
keep-last-k, holding the model's trainable weights, optimizer, scheduler, data-loader position and RNG states.

A checkpoint is never written from non-finite weights. Its `meta.json` records the run's settings, which a resume
must match, and each file's size; a damaged checkpoint (truncated, unreadable) is passed over for the one before it,
with a note, and when none is usable the error names the folder to delete.

Under FSDP2 the full state is gathered to rank 0 (torch.distributed.checkpoint's state-dict API), which writes;
on load, rank 0's copy is broadcast. A single process uses the same calls.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict, set_model_state_dict,
                                                     set_optimizer_state_dict)

from hyla.train.distributed import Distributed, barrier, from_main
from hyla.train.divergence import TrainingDiverged

STEP_PREFIX = "step-"


FILES = ("model.safetensors", "trainer.pt", "loader.json")


@dataclass
class Checkpoint:
    path: Path
    step: int
    meta: dict[str, Any]
    damaged: str | None = None  # what is wrong with it, when its meta.json cannot be read


def list_checkpoints(folder: Path) -> list[Checkpoint]:
    """The `step-N` folders of `folder`, oldest first (those with an unreadable meta.json marked `damaged`)."""
    found = []
    for path in folder.glob(f"{STEP_PREFIX}*"):
        step_text = path.name.removeprefix(STEP_PREFIX)
        if not path.is_dir() or not step_text.isdigit():
            continue
        meta_file = path / "meta.json"
        try:
            meta = json.loads(meta_file.read_text())
            found.append(Checkpoint(path, int(meta["step"]), meta))
        except FileNotFoundError:
            continue  # not a checkpoint (yet): the rename of a complete one brings its meta.json
        except (OSError, ValueError, KeyError, TypeError) as err:
            found.append(Checkpoint(path, int(step_text), {}, damaged=f"meta.json unreadable ({err})"))
    return sorted(found, key=lambda c: c.step)


def latest_checkpoint(folder: Path) -> Checkpoint | None:
    checkpoints = list_checkpoints(folder)
    return checkpoints[-1] if checkpoints else None


def rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _options(**kwargs) -> StateDictOptions:
    return StateDictOptions(full_state_dict=True, cpu_offload=True, **kwargs)


def save_checkpoint(folder: Path, step: int, *, model, optimizer, scheduler, loader_state: dict, meta: dict,
                    env: Distributed, keep_last: int) -> Path:
    model_state, optim_state = get_state_dict(model, optimizer, options=_options())
    target = folder / f"{STEP_PREFIX}{step}"
    trainable = {name for name, p in model.named_parameters() if p.requires_grad}
    weights = {k: v.contiguous() for k, v in model_state.items() if _strip(k) in trainable or k in trainable}
    # The full weights are on the main process only: it decides, and every process stops together.
    problem = from_main(_non_finite(weights, target), env)
    if problem:
        raise TrainingDiverged(problem)
    if env.is_main:
        # Staging folders of killed runs (the run folder's lock makes this process the only writer).
        for stale in folder.glob(f".tmp-{STEP_PREFIX}*"):
            shutil.rmtree(stale, ignore_errors=True)
        staging = folder / f".tmp-{STEP_PREFIX}{step}"
        staging.mkdir(parents=True)
        save_file(weights, staging / "model.safetensors")
        torch.save(
            {"optimizer": optim_state, "scheduler": scheduler.state_dict(), "rng": rng_state()},
            staging / "trainer.pt",
        )
        (staging / "loader.json").write_text(json.dumps(loader_state))
        sizes = {name: (staging / name).stat().st_size for name in FILES}
        (staging / "meta.json").write_text(json.dumps({**meta, "step": step, "file_sizes": sizes}, indent=1))
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
        for old in list_checkpoints(folder)[:-keep_last]:
            shutil.rmtree(old.path, ignore_errors=True)
    barrier(env)
    return target


def _non_finite(weights: dict[str, torch.Tensor], target: Path) -> str | None:
    bad = [name for name, tensor in weights.items() if tensor.is_floating_point() and not torch.isfinite(tensor).all()]
    if not bad:
        return None
    return (f"{target.name} not written: {len(bad)} of {len(weights)} weight tensors hold NaN or inf (first: "
            f"{bad[0]}); the training diverged, lower the learning rate")


def _strip(name: str) -> str:
    return name.replace("_fsdp_wrapped_module.", "").replace("_orig_mod.", "")


def check_settings(checkpoint: Checkpoint, settings: dict | None) -> None:
    """Refuse to resume from a checkpoint written with other settings: one line saying what differs."""
    stored = checkpoint.meta.get("settings")
    if settings is None or stored is None:
        return  # written before checkpoints recorded their settings, or a caller without settings
    current = json.loads(json.dumps(settings, default=str))
    differ = [f"{key}={stored.get(key)!r} then, {current.get(key)!r} now"
              for key in sorted(set(stored) | set(current)) if stored.get(key) != current.get(key)]
    if differ:
        raise ValueError(f"cannot resume from {checkpoint.path}: it was made with other settings "
                         f"({'; '.join(differ)}); rerun with the same settings to continue, or delete "
                         f"{checkpoint.path.parent} to start fresh")


def read_checkpoint(checkpoint: Checkpoint, env: Distributed) -> tuple[dict, dict, dict]:
    """(weights, trainer state, loader state) of `checkpoint`; ValueError saying what is damaged. Every process
    checks the sizes and the safetensors header, so all agree on which checkpoint is usable."""
    from safetensors import SafetensorError, safe_open

    if checkpoint.damaged:
        raise ValueError(checkpoint.damaged)
    path = checkpoint.path
    for name, size in checkpoint.meta.get("file_sizes", {}).items():
        actual = (path / name).stat().st_size if (path / name).exists() else None
        if actual != size:
            raise ValueError(f"{name} is {'missing' if actual is None else f'{actual} bytes, not {size}'}")
    try:
        with safe_open(path / "model.safetensors", "pt"):
            pass
        weights = load_file(path / "model.safetensors") if env.is_main else {}
    except (SafetensorError, OSError) as err:
        raise ValueError(f"model.safetensors unreadable ({err})") from None
    try:
        trainer = torch.load(path / "trainer.pt", weights_only=False)
    except Exception as err:  # a damaged pickle or zip raises anything from EOFError to RuntimeError
        first_line = (str(err).strip().splitlines() or [""])[0]
        raise ValueError(f"trainer.pt unreadable ({type(err).__name__}: {first_line})") from None
    try:
        loader_state = json.loads((path / "loader.json").read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"loader.json unreadable ({err})") from None
    return weights, trainer, loader_state


def resume_checkpoint(folder: Path, *, model, optimizer, scheduler, env: Distributed, settings: dict | None = None,
                      log=print) -> Checkpoint | None:
    """Restore the newest usable checkpoint of `folder` (model, optimizer, scheduler, RNG) and return it, with the
    saved loader state in `meta["loader_state"]`; None when there is none. A damaged one is passed over for the one
    before it (with a note); settings that differ from `settings` stop the run."""
    checkpoints = list_checkpoints(folder)
    problems = []
    for checkpoint in reversed(checkpoints):
        try:
            contents = read_checkpoint(checkpoint, env)
        except ValueError as err:
            problems.append(f"{checkpoint.path.name}: {err}")
            if env.is_main:
                log(f"note: checkpoint {checkpoint.path} is damaged ({err}); trying the one before it")
            continue
        check_settings(checkpoint, settings)
        if problems and env.is_main:
            log(f"note: resuming from {checkpoint.path} (newer damaged checkpoints are ignored)")
        checkpoint.meta["loader_state"] = _apply(contents, model=model, optimizer=optimizer, scheduler=scheduler,
                                                 env=env)
        return checkpoint
    if problems:
        raise ValueError(f"no usable checkpoint in {folder} ({'; '.join(problems)}); delete {folder} to start this "
                         f"training over")
    return None


def load_checkpoint(checkpoint: Checkpoint, *, model, optimizer, scheduler, env: Distributed) -> dict:
    """Restore model weights, optimizer, scheduler and RNG; return the saved loader state."""
    try:
        contents = read_checkpoint(checkpoint, env)
    except ValueError as err:
        raise ValueError(f"damaged checkpoint {checkpoint.path}: {err}") from None
    return _apply(contents, model=model, optimizer=optimizer, scheduler=scheduler, env=env)


def _apply(contents: tuple[dict, dict, dict], *, model, optimizer, scheduler, env: Distributed) -> dict:
    weights, trainer, loader_state = contents
    options = _options(strict=False, broadcast_from_rank0=env.enabled)
    # Two calls, not set_state_dict: that takes the other processes' empty model state for "optimizer only" and
    # skips the model's broadcast there, which leaves the main process waiting in it.
    set_model_state_dict(model, weights, options=options)
    set_optimizer_state_dict(model, optimizer, trainer["optimizer"] if env.is_main else {}, options=options)
    scheduler.load_state_dict(trainer["scheduler"])
    set_rng_state(trainer["rng"])
    return loader_state
