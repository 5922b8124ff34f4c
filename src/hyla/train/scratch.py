"""`hyla train`: train any HypeNet configuration from scratch on a prepared corpus, with the same loop,
checkpoints, progress and data parallelism (DDP or FSDP2, `hyla.train.parallel`) as `hyla convert`."""

from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from hyla.compile import compile_blocks
from hyla.data.loader import TokenCorpus, TokenLoader
from hyla.models import HypeNetConfig, HypeNetForCausalLM
from hyla.train.activations import checkpoint_activations
from hyla.train.distributed import exclusive_run_folder, init_distributed
from hyla.train.divergence import TrainingDiverged
from hyla.train.loop import LoopSettings, run_training
from hyla.train.losses import LOSSES, ce_loss, longce_loss
from hyla.train.optim import SCHEDULES, OptimSettings
from hyla.train.parallel import MODES, choose_data_parallel, data_parallel, device_memory_bytes, replica_bytes
from hyla.validation import Rule, at_least, check_fields, coerce, did_you_mean, field_types, greater_than, one_of


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
    data_parallel: str = "auto"  # under torchrun: ddp, fsdp, fsdp-no-reshard, or auto (hyla.train.parallel)


REQUEST_RULES: dict[str, Rule] = {
    "steps": at_least(1), "seq_len": at_least(1), "batch_size": at_least(1), "lr": greater_than(0),
    "min_lr": at_least(0), "warmup_steps": at_least(0), "schedule": one_of(*SCHEDULES), "weight_decay": at_least(0),
    "loss": one_of(*LOSSES), "longce_window": at_least(1), "longce_cap": greater_than(0),
    "checkpoint_every": at_least(1), "seed": at_least(0), "data_parallel": one_of(*MODES),
}
CONFIG_RULES: dict[str, Rule] = {
    "vocab_size": at_least(1), "hidden_size": at_least(1), "intermediate_size": at_least(1),
    "num_hidden_layers": at_least(1), "num_attention_heads": at_least(1), "num_key_value_heads": at_least(1),
    "head_dim": at_least(1), "max_position_embeddings": at_least(1), "rms_norm_eps": greater_than(0),
}
# Request fields a resume may change: where things are (the corpus and config are compared by content) and how fast.
NOT_SETTINGS = ("config", "data", "out", "device", "compile", "checkpoint_activations", "checkpoint_every",
                "data_parallel")


def config_fields() -> set[str]:
    """The names a config file may use: HypeNetConfig's fields and what transformers writes into a config.json."""
    import dataclasses

    return ({f.name for f in dataclasses.fields(HypeNetConfig)} | set(HypeNetConfig().to_dict())
            | {"auto_map", "torch_dtype"})


def load_config(path: Path, vocab_size: int) -> HypeNetConfig:
    if not path.is_file():
        raise FileNotFoundError(f"no config file at {path}")
    try:
        values = json.loads(path.read_text())
    except ValueError as err:
        raise ValueError(f"config {path} is not valid JSON ({err})") from None
    if not isinstance(values, dict):
        raise ValueError(f"config {path} must hold a JSON object of HypeNetConfig fields")
    known = config_fields()
    unknown = [key for key in values if key not in known]
    if unknown:
        hints = ", ".join(f"{key!r}{did_you_mean(key, known)}" for key in unknown)
        raise ValueError(f"config {path}: unknown field{'s' if len(unknown) > 1 else ''} {hints}")
    values.setdefault("vocab_size", vocab_size)
    if values["vocab_size"] < vocab_size:
        raise ValueError(f"config vocab_size {values['vocab_size']} is smaller than the corpus's {vocab_size}")
    for key in ("model_type", "auto_map", "architectures", "transformers_version", "_name_or_path"):
        values.pop(key, None)
    types = field_types(HypeNetConfig)
    for key, value in values.items():
        try:
            values[key] = coerce(value, types.get(key, Any))
        except ValueError as err:
            raise ValueError(f"config {path}: {key}: {err}") from None
    config = HypeNetConfig(**values)
    for name, rule in CONFIG_RULES.items():
        value = getattr(config, name)
        problem = rule(value) if value is not None else None
        if problem:
            raise ValueError(f"config {path}: {name} {problem}, got {value!r}")
    return config


def _json_request(request: TrainRequest) -> dict:
    return {k: str(v) if isinstance(v, Path) else v for k, v in asdict(request).items()}


def resume_settings(request: TrainRequest, corpus: TokenCorpus, config: HypeNetConfig) -> dict:
    """What a resumed run must share with the run that wrote the checkpoint (`hyla.train.checkpoint`)."""
    model = {k: v for k, v in config.to_dict().items() if k not in ("transformers_version", "_name_or_path")}
    return {**{k: v for k, v in _json_request(request).items() if k not in NOT_SETTINGS},
            "corpus_id": corpus.corpus_id, "model_config": json.loads(json.dumps(model, default=str))}


def train(request: TrainRequest) -> dict:
    """Check every setting, lock `request.out`, then train (or resume) and export `out/model`."""
    check_fields(request, REQUEST_RULES)
    corpus = TokenCorpus(request.data)
    config = load_config(request.config, corpus.vocab_size)
    env = init_distributed(request.device)
    with exclusive_run_folder(Path(request.out), env):
        try:
            return _train(request, corpus, config, env)
        except TrainingDiverged as err:
            raise TrainingDiverged(f"{err} (--lr); a resume must use the settings of its checkpoint, so delete "
                                   f"{Path(request.out) / 'checkpoints'} (or use a new --out) to start over") from None


def _train(request: TrainRequest, corpus: TokenCorpus, config: HypeNetConfig, env) -> dict:
    torch.manual_seed(request.seed)
    model = HypeNetForCausalLM(config).to(env.device)
    num_params = sum(p.numel() for p in model.parameters())
    choice = choose_data_parallel(request.data_parallel, world_size=env.world_size, replica=replica_bytes(model),
                                  device_memory=device_memory_bytes(env.device))
    if env.is_main:
        print(f"hyla train: {num_params / 1e6:.1f}M params, layers {config.layer_types}, loss {request.loss}, "
              f"{request.steps} steps x {request.batch_size} x {request.seq_len} tokens, device {env.device} "
              f"x{env.world_size}" + (", activation checkpointing" if request.checkpoint_activations else ""))
        print(f"hyla train: data parallel: {choice.describe()}")
    if request.compile:
        compile_blocks(model.model.layers)
    if request.checkpoint_activations:
        checkpoint_activations(model)
    loss_fn = ce_loss if request.loss == "ce" else functools.partial(
        longce_loss, window=request.longce_window, cap=request.longce_cap
    )
    parallel = data_parallel(model, loss_fn, list(model.model.layers), choice, env)
    loader = TokenLoader(corpus, seq_len=request.seq_len, batch_size=request.batch_size, seed=request.seed)
    optim = OptimSettings(lr=request.lr, min_lr=request.min_lr, warmup_steps=request.warmup_steps,
                          schedule=request.schedule, weight_decay=request.weight_decay)
    # Both losses are cross-entropies (LongCE a weighted one): a uniform prediction scores ln(vocab_size).
    loop = LoopSettings(steps=request.steps, checkpoint_every=request.checkpoint_every, description="train",
                        vocab_size=config.vocab_size)
    out = Path(request.out)
    meta = {"request": _json_request(request), "settings": resume_settings(request, corpus, config)}
    result = run_training(model, parallel, loader, optim, loop, out, env, meta=meta, sync=parallel.sync)
    if env.is_main:
        _export(model, out / "model", request, result.metrics, corpus.manifest.get("tokenizer", {}).get("spec"))
    return {"steps": result.steps, "resumed_from": result.resumed_from,
            "last": result.metrics[-1] if result.metrics else {}}


def _export(model, folder: Path, request: TrainRequest, metrics: list[dict], tokenizer_spec: str | None) -> None:
    """The HF model folder, with the corpus's tokenizer so that `generate` and `hyla eval` work on it directly."""
    from hyla.outputs import run_metadata, write_json
    from hyla.train.weights import full_state_dict, without_shared

    state = without_shared(full_state_dict(model))
    fresh = HypeNetForCausalLM(model.config)
    fresh.load_state_dict(state, strict=False)
    fresh.save_pretrained(folder, safe_serialization=True)  # with auto_map (hyla.models.hf)
    if tokenizer_spec:
        from hyla.models.loading import load_tokenizer

        try:
            load_tokenizer(tokenizer_spec).save_pretrained(folder)
        except (OSError, ValueError, ImportError) as err:
            print(f"hyla train: note: the corpus tokenizer {tokenizer_spec!r} could not be saved with the model "
                  f"({type(err).__name__}: {err}); copy it into {folder} before evaluating")
    write_json(folder / "training.json", {**run_metadata(_json_request(request)),
                                          "final": metrics[-1] if metrics else {}})
