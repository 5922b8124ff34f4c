"""Resumable training checkpoints: `checkpoints/step-N/` folders written atomically (tmp folder, then rename),
keep-last-k, holding the model's trainable weights, optimizer, scheduler, data-loader position and RNG states.

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
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from hyla.train.distributed import Distributed, barrier

STEP_PREFIX = "step-"


@dataclass
class Checkpoint:
    path: Path
    step: int
    meta: dict[str, Any]


def list_checkpoints(folder: Path) -> list[Checkpoint]:
    found = []
    for path in folder.glob(f"{STEP_PREFIX}*"):
        meta_file = path / "meta.json"
        if path.is_dir() and meta_file.exists():
            meta = json.loads(meta_file.read_text())
            found.append(Checkpoint(path, meta["step"], meta))
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
    if env.is_main:
        staging = folder / f".tmp-{STEP_PREFIX}{step}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir(parents=True)
        trainable = {name for name, p in model.named_parameters() if p.requires_grad}
        weights = {k: v.contiguous() for k, v in model_state.items() if _strip(k) in trainable or k in trainable}
        save_file(weights, staging / "model.safetensors")
        torch.save(
            {"optimizer": optim_state, "scheduler": scheduler.state_dict(), "rng": rng_state()},
            staging / "trainer.pt",
        )
        (staging / "loader.json").write_text(json.dumps(loader_state))
        (staging / "meta.json").write_text(json.dumps({**meta, "step": step}, indent=1))
        shutil.rmtree(target, ignore_errors=True)
        os.replace(staging, target)
        for old in list_checkpoints(folder)[:-keep_last]:
            shutil.rmtree(old.path, ignore_errors=True)
    barrier(env)
    return target


def _strip(name: str) -> str:
    return name.replace("_fsdp_wrapped_module.", "").replace("_orig_mod.", "")


def load_checkpoint(checkpoint: Checkpoint, *, model, optimizer, scheduler, env: Distributed) -> dict:
    """Restore model weights, optimizer, scheduler and RNG; return the saved loader state."""
    weights = load_file(checkpoint.path / "model.safetensors") if env.is_main else {}
    trainer = torch.load(checkpoint.path / "trainer.pt", weights_only=False)
    set_state_dict(
        model,
        optimizer,
        model_state_dict=weights,
        optim_state_dict=trainer["optimizer"] if env.is_main else {},
        options=_options(strict=False, broadcast_from_rank0=env.enabled),
    )
    scheduler.load_state_dict(trainer["scheduler"])
    set_rng_state(trainer["rng"])
    return json.loads((checkpoint.path / "loader.json").read_text())
