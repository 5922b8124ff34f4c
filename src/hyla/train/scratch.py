"""`hyla train`: train any HypeNet configuration from scratch on a prepared corpus, with the same loop,
checkpoints, progress and FSDP2 support as `hyla convert`."""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from hyla.data.loader import TokenCorpus, TokenLoader
from hyla.models import HypeNetConfig, HypeNetForCausalLM
from hyla.compile import compile_blocks
from hyla.train.activations import checkpoint_activations
from hyla.train.distributed import init_distributed, shard_model
from hyla.train.loop import LoopSettings, run_training
from hyla.train.losses import LOSSES, ce_loss, longce_loss
from hyla.train.optim import OptimSettings


@dataclass
class TrainRequest:
    config: Path
    data: Path
    out: Path
    steps: int
    seq_len: int = 1024
    batch_size: int = 8
    lr: float = 1e-3
    min_lr: float = 1e-5
    warmup_steps: int = 50
    schedule: str = "cosine"
    weight_decay: float = 0.1
    loss: str = "ce"
    longce_window: int = 256
    longce_cap: float = 5.0
    checkpoint_every: int = 200
    seed: int = 0
    device: str | None = None
    compile: bool = False  # torch.compile each block in place before training (speed only)
    checkpoint_activations: bool = False  # recompute block activations in the backward pass (memory only)


def load_config(path: Path, vocab_size: int) -> HypeNetConfig:
    if not path.is_file():
        raise FileNotFoundError(f"no config file at {path}")
    values = json.loads(path.read_text())
    values.setdefault("vocab_size", vocab_size)
    if values["vocab_size"] < vocab_size:
        raise ValueError(f"config vocab_size {values['vocab_size']} is smaller than the corpus's {vocab_size}")
    values.pop("model_type", None)
    return HypeNetConfig(**values)


def train(request: TrainRequest) -> dict:
    if request.loss not in LOSSES:
        raise ValueError(f"unknown loss {request.loss!r}; choose from {', '.join(LOSSES)}")
    env = init_distributed(request.device)
    corpus = TokenCorpus(request.data)
    config = load_config(request.config, corpus.vocab_size)
    torch.manual_seed(request.seed)
    model = HypeNetForCausalLM(config).to(env.device)
    num_params = sum(p.numel() for p in model.parameters())
    if env.is_main:
        print(f"hyla train: {num_params / 1e6:.1f}M params, layers {config.layer_types}, loss {request.loss}, "
              f"{request.steps} steps x {request.batch_size} x {request.seq_len} tokens, device {env.device} "
              f"x{env.world_size}" + (", activation checkpointing" if request.checkpoint_activations else ""))
    if request.compile:
        compile_blocks(model.model.layers)
    if request.checkpoint_activations:
        checkpoint_activations(model)
    if env.enabled:
        shard_model(model, list(model.model.layers), mixed_precision=env.device.type == "cuda")
    loss_fn = ce_loss if request.loss == "ce" else functools.partial(
        longce_loss, window=request.longce_window, cap=request.longce_cap
    )
    loader = TokenLoader(corpus, seq_len=request.seq_len, batch_size=request.batch_size, seed=request.seed)
    optim = OptimSettings(lr=request.lr, min_lr=request.min_lr, warmup_steps=request.warmup_steps,
                          schedule=request.schedule, weight_decay=request.weight_decay)
    loop = LoopSettings(steps=request.steps, checkpoint_every=request.checkpoint_every, description="train")
    out = Path(request.out)
    result = run_training(model, loss_fn, loader, optim, loop, out, env, meta={"request": {k: str(v) for k, v in asdict(request).items()}})
    if env.is_main:
        _export(model, out / "model", request, result.metrics, corpus.manifest.get("tokenizer", {}).get("spec"))
    return {"steps": result.steps, "resumed_from": result.resumed_from,
            "last": result.metrics[-1] if result.metrics else {}}


def _export(model, folder: Path, request: TrainRequest, metrics: list[dict], tokenizer_spec: str | None) -> None:
    """The HF model folder, with the corpus's tokenizer so that `generate` and `hyla eval` work on it directly."""
    from hyla.convert.weights import full_state_dict, without_shared
    from hyla.outputs import run_metadata, write_json

    state = without_shared(full_state_dict(model))
    fresh = HypeNetForCausalLM(model.config)
    fresh.load_state_dict(state, strict=False)
    fresh.save_pretrained(folder, safe_serialization=True)
    if tokenizer_spec:
        from hyla.convert.teacher import load_tokenizer

        try:
            load_tokenizer(tokenizer_spec).save_pretrained(folder)
        except (OSError, ValueError, ImportError) as err:
            print(f"hyla train: note: the corpus tokenizer {tokenizer_spec!r} could not be saved with the model "
                  f"({type(err).__name__}: {err}); copy it into {folder} before evaluating")
    write_json(folder / "training.json", {**run_metadata({k: str(v) for k, v in asdict(request).items()}),
                                          "final": metrics[-1] if metrics else {}})
