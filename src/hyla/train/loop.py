"""The training loop shared by every stage of `hyla convert` and by `hyla train`.

The caller supplies the model (trainable parameters marked with requires_grad), a loss function
`loss_fn(model, batch) -> (loss, metrics)`, and a resumable batch loader yielding the GLOBAL batch; each process
takes its slice of rows, so a run gives the same batches at every step whatever the number of processes. Under
torchrun the loss function is the data-parallel one (`hyla.train.parallel.data_parallel`), with its `sync`.
"""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from hyla.train.checkpoint import resume_checkpoint, save_checkpoint
from hyla.train.distributed import Distributed
from hyla.train.divergence import DivergenceMonitor, TrainingDiverged
from hyla.train.optim import OptimSettings, build_optimizer
from hyla.train.progress import StepLog, read_metrics
from hyla.train.step import GradientSync, LossFn, TrainStep, training_autocast

__all__ = ["LoopSettings", "LossFn", "TrainResult", "TrainingDiverged", "run_training", "training_autocast"]


@dataclass
class LoopSettings:
    steps: int
    checkpoint_every: int = 100
    keep_last: int = 2
    log_every: int = 1
    description: str = "train"
    # Rows per forward/backward pass (gradients accumulated over the step); None: the most that fit (TrainStep).
    micro_batch_rows: int | None = None
    # torch's fused AdamW; None: where the parameters are on CUDA.
    fused_optimizer: bool | None = None
    vocab_size: int | None = None  # the loss is a cross-entropy over this many classes (divergence.py); else None
    divergence_patience: int = 3  # steps a collapse signature (zero gradient, loss at ln V) lasts before the stop


@dataclass
class TrainResult:
    steps: int
    resumed_from: int
    metrics: list[dict] = field(default_factory=list)
    micro_batch_rows: int | None = None  # what the steps ran at (None: all rows at once)


def _local_rows(batch: dict, env: Distributed) -> dict:
    """This process's rows of the global batch (packed-sequence boundaries are per row and are dropped)."""
    rows = batch["input_ids"].shape[0]
    if rows % env.world_size:
        raise ValueError(f"global batch of {rows} rows does not split over {env.world_size} processes")
    per = rows // env.world_size
    local = {k: v[env.rank * per : (env.rank + 1) * per] for k, v in batch.items() if k != "cu_seqlens"}
    return {k: v.to(env.device) for k, v in local.items()}


def run_training(
    model: torch.nn.Module,
    loss_fn: LossFn,
    loader,
    optim: OptimSettings,
    loop: LoopSettings,
    out_dir: Path,
    env: Distributed = Distributed(),
    meta: dict | None = None,
    sync: GradientSync = GradientSync(),
) -> TrainResult:
    """Train for `loop.steps` optimizer steps, resuming from the newest usable checkpoint in `out_dir/checkpoints`
    (which must have been written with the same `meta["settings"]`); `sync`: how the steps defer gradient
    synchronisation over micro-batches (`TrainStep`)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    checkpoints = out_dir / "checkpoints"
    optimizer, scheduler = build_optimizer(model.parameters(), optim, loop.steps, fused=loop.fused_optimizer)
    start = 0
    found = resume_checkpoint(checkpoints, model=model, optimizer=optimizer, scheduler=scheduler, env=env,
                              settings=(meta or {}).get("settings"))
    if found is not None:
        loader.load_state_dict(found.meta["loader_state"])
        start = found.step
    monitor = DivergenceMonitor(loop.vocab_size, loop.divergence_patience, description=loop.description, lr=optim.lr)
    log = StepLog(out_dir / "metrics.jsonl", total_steps=loop.steps, start_step=start,
                  description=loop.description, enabled=env.is_main)
    model.train()

    def note(line: str) -> None:
        if env.is_main:
            print(f"[{loop.description}] {line}", flush=True)

    step_fn = TrainStep(model, loss_fn, optimizer, scheduler, optim, env, micro_batch_rows=loop.micro_batch_rows,
                        log=note, sync=sync)
    try:
        for step in range(start, loop.steps):
            started = time.perf_counter()
            batch = next(loader)
            # The monitor sees the step's loss and gradient norm before its update and raises instead of applying it.
            outcome = step_fn(_local_rows(batch, env), check=functools.partial(monitor.check, step + 1))
            elapsed = time.perf_counter() - started
            record = {"step": step + 1, "loss": outcome.loss, "lr": scheduler.get_last_lr()[0],
                      "grad_norm": outcome.grad_norm, "tok_per_s": batch["input_ids"].numel() / elapsed,
                      **outcome.metrics}
            log.log(record)
            if (step + 1) % loop.checkpoint_every == 0 or step + 1 == loop.steps:
                save_checkpoint(checkpoints, step + 1, model=model, optimizer=optimizer, scheduler=scheduler,
                                loader_state=loader.state_dict(), meta=meta or {}, env=env,
                                keep_last=loop.keep_last)
    finally:
        log.close()
    model.eval()
    metrics = read_metrics(out_dir / "metrics.jsonl")
    return TrainResult(steps=loop.steps, resumed_from=start, metrics=metrics,
                       micro_batch_rows=step_fn.micro_batch_rows)
