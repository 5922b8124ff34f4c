"""The training loop shared by every stage of `hyla convert` and by `hyla train`.

The caller supplies the model (trainable parameters marked with requires_grad), a loss function
`loss_fn(model, batch) -> (loss, metrics)`, and a resumable batch loader yielding the GLOBAL batch; each process
takes its slice of rows, so a run gives the same batches at every step whatever the number of processes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from hyla.train.checkpoint import resume_checkpoint, save_checkpoint
from hyla.train.distributed import Distributed, all_reduce_mean
from hyla.train.divergence import DivergenceMonitor, TrainingDiverged
from hyla.train.optim import OptimSettings, build_optimizer
from hyla.train.progress import StepLog, read_metrics

LossFn = Callable[[torch.nn.Module, dict], tuple[torch.Tensor, dict]]
__all__ = ["LoopSettings", "TrainResult", "TrainingDiverged", "run_training"]


@dataclass
class LoopSettings:
    steps: int
    checkpoint_every: int = 100
    keep_last: int = 2
    log_every: int = 1
    description: str = "train"
    vocab_size: int | None = None  # the loss is a cross-entropy over this many classes (divergence.py); else None
    divergence_patience: int = 3  # steps a collapse signature (zero gradient, loss at ln V) lasts before the stop


@dataclass
class TrainResult:
    steps: int
    resumed_from: int
    metrics: list[dict] = field(default_factory=list)


def _local_rows(batch: dict, env: Distributed) -> dict:
    """This process's rows of the global batch (packed-sequence boundaries are per row and are dropped)."""
    rows = batch["input_ids"].shape[0]
    if rows % env.world_size:
        raise ValueError(f"global batch of {rows} rows does not split over {env.world_size} processes")
    per = rows // env.world_size
    local = {k: v[env.rank * per : (env.rank + 1) * per] for k, v in batch.items() if k != "cu_seqlens"}
    return {k: v.to(env.device) for k, v in local.items()}


def training_autocast(device: torch.device) -> torch.autocast:
    """bf16 autocast on GPU (master weights stay float32), the precision training and evaluation run at there; CPU
    runs in the model's own dtype."""
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")


def _host_values(loss: torch.Tensor, grad_norm: torch.Tensor) -> tuple[float, float]:
    """The step's mean loss over processes and its gradient norm, fetched to the host in one transfer."""
    if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP2
        grad_norm = grad_norm.full_tensor()
    loss_value, grad_norm_value = torch.stack([loss.float(), grad_norm.float().to(loss.device)]).tolist()
    return loss_value, grad_norm_value


def _step(model, loss_fn, batch, optimizer, scheduler, settings: OptimSettings, env: Distributed,
          monitor: DivergenceMonitor | None = None, step: int = 0):
    with training_autocast(env.device):
        loss, metrics = loss_fn(model, batch)
    loss.backward()
    params = [p for p in model.parameters() if p.requires_grad]
    grad_norm = torch.nn.utils.clip_grad_norm_(params, settings.grad_clip)
    # After backward and clipping: loss and gradient norm to the host once, checked before the update, so that a
    # non-finite gradient is never applied (the monitor raises instead).
    loss_value, grad_norm_value = _host_values(all_reduce_mean(loss.detach().float(), env), grad_norm)
    if monitor is not None:
        monitor.check(step, loss_value, grad_norm_value)
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    # The values already fetched, as CPU tensors (bench/smollm2/probe.py calls `.item()`): no second sync.
    return torch.tensor(loss_value), metrics, torch.tensor(grad_norm_value)


def run_training(
    model: torch.nn.Module,
    loss_fn: LossFn,
    loader,
    optim: OptimSettings,
    loop: LoopSettings,
    out_dir: Path,
    env: Distributed = Distributed(),
    meta: dict | None = None,
) -> TrainResult:
    """Train for `loop.steps` optimizer steps, resuming from the newest usable checkpoint in `out_dir/checkpoints`
    (which must have been written with the same `meta["settings"]`)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    checkpoints = out_dir / "checkpoints"
    optimizer, scheduler = build_optimizer(model.parameters(), optim, loop.steps)
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
    try:
        for step in range(start, loop.steps):
            started = time.perf_counter()
            batch = next(loader)
            loss, metrics, grad_norm = _step(model, loss_fn, _local_rows(batch, env), optimizer, scheduler, optim, env,
                                             monitor, step + 1)
            elapsed = time.perf_counter() - started
            record = {"step": step + 1, "loss": loss.item(), "lr": scheduler.get_last_lr()[0],
                      "grad_norm": float(grad_norm), "tok_per_s": batch["input_ids"].numel() / elapsed,
                      **{k: float(v) for k, v in metrics.items()}}
            log.log(record)
            if (step + 1) % loop.checkpoint_every == 0 or step + 1 == loop.steps:
                save_checkpoint(checkpoints, step + 1, model=model, optimizer=optimizer, scheduler=scheduler,
                                loader_state=loader.state_dict(), meta=meta or {}, env=env,
                                keep_last=loop.keep_last)
    finally:
        log.close()
    model.eval()
    metrics = read_metrics(out_dir / "metrics.jsonl")
    return TrainResult(steps=loop.steps, resumed_from=start, metrics=metrics)
