"""One optimizer step of the training loop: the process's rows of the global batch in micro-batches (gradients
accumulated), clipping, and one read of the step's numbers back to the host, after which the update is applied
only if the loss and the gradient norm are finite.

That read is the step's only host synchronisation: loss functions return their metrics as tensors, and the GPU
works through the forward and backward passes without waiting for the host. Under several processes the numbers read
are all-reduced first (one all-reduce of one small tensor), so every process reads the same loss and gradient norm
and takes the same decision: apply the update or not, stop for divergence or go on.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from hyla.train.distributed import Distributed, all_reduce_mean
from hyla.train.optim import OptimSettings

LossFn = Callable[[torch.nn.Module, dict], tuple[torch.Tensor, dict]]


def training_autocast(device: torch.device) -> torch.autocast:
    """bf16 autocast on GPU (master weights stay float32), the precision training and evaluation run at there; CPU
    runs in the model's own dtype."""
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")


@dataclass(frozen=True)
class GradientSync:
    """How a step controls the gradients' synchronisation across processes (`hyla.train.parallel`)."""

    # A context under which a backward pass leaves the gradients unsynchronised (DDP's no_sync); None: every
    # backward pass synchronises.
    deferred: Callable[[], contextlib.AbstractContextManager] | None = None
    # Forward and backward passes under `deferred` run no collectives (DDP; FSDP2 gathers weights in its forward):
    # one process running out of memory there leaves no other waiting.
    collective_free: bool = False


@dataclass
class StepOutcome:
    loss: float
    grad_norm: float
    metrics: dict[str, float]
    applied: bool  # False: a non-finite loss or gradient norm, the update was not applied
    micro_batch_rows: int


def _as_tensor(value, device: torch.device) -> torch.Tensor:
    value = value.detach() if isinstance(value, torch.Tensor) else torch.tensor(float(value))
    return value.to(device=device, dtype=torch.float32)


class TrainStep:
    """`step(batch) -> StepOutcome` for the local rows of one global batch.

    micro_batch_rows: rows per forward/backward pass (None: automatic, all the rows at once, halved and the step
    redone whenever CUDA runs out of memory; the size found is kept for later steps). Each micro-batch's loss
    counts in proportion to its rows, so the step's gradient is that of the mean loss over the rows whatever the
    split (exactly for per-token means over equal token counts, as the training stages' losses are).

    sync: every micro-batch but the last runs under `sync.deferred`, so the gradients are reduced once a step.
    With several processes and the automatic size, when `sync.collective_free` (DDP), the first step is tried
    first with no synchronisation at all, the processes agree whether any ran out of memory (one all-reduce), and
    all halve together; the size that passed everywhere is kept. Otherwise (FSDP2, whose forward gathers weights)
    an out-of-memory error on one process cannot be agreed on and stops the run, naming the micro-batch setting."""

    def __init__(self, model: torch.nn.Module, loss_fn: LossFn, optimizer, scheduler, settings: OptimSettings,
                 env: Distributed, *, micro_batch_rows: int | None = None, log: Callable[[str], None] = print,
                 sync: GradientSync = GradientSync()):
        if micro_batch_rows is not None and micro_batch_rows < 1:
            raise ValueError(f"micro_batch_rows must be >= 1 or None (automatic), got {micro_batch_rows}")
        self.model, self.loss_fn, self.optimizer, self.scheduler = model, loss_fn, optimizer, scheduler
        self.settings, self.env, self.log, self.sync = settings, env, log, sync
        self.automatic = micro_batch_rows is None
        self.micro_batch_rows = micro_batch_rows
        self.size_agreed = not (self.automatic and env.enabled and sync.collective_free)
        self.params = [p for p in model.parameters() if p.requires_grad]

    def __call__(self, batch: dict, check: Callable[[float, float], None] | None = None) -> StepOutcome:
        """check(loss, grad_norm): called after the host read and before the update (a divergence monitor); if it
        raises, the update is not applied and the exception propagates."""
        rows = batch["input_ids"].shape[0]
        while True:
            size = min(self.micro_batch_rows or rows, rows)
            if self._agreed(batch, size):
                try:
                    return self._step(batch, size, check)
                except torch.OutOfMemoryError:
                    if not self.automatic or size == 1:
                        raise
                    if self.env.enabled:
                        # The other processes may be waiting in a collective of this step: no retry.
                        raise torch.OutOfMemoryError(
                            f"out of memory at {size} rows a micro-batch on process {self.env.rank} (under FSDP2, or "
                            f"after the first step), where the processes cannot agree on a smaller size: set the "
                            f"stage's micro_batch_size to {(size + 1) // 2} or less") from None
            elif size == 1:
                raise torch.OutOfMemoryError("out of memory at 1 row a micro-batch on one of the processes")
            # Outside the handler, so that the failed attempt's tensors are free before the next one.
            self._clear()
            self.micro_batch_rows = (size + 1) // 2
            self.log(f"out of memory at {size} rows a micro-batch: retrying the step at {self.micro_batch_rows}")

    def _agreed(self, batch: dict, size: int) -> bool:
        """Whether the step may run at `size`: always, once a size is agreed (or nothing needs agreeing); else
        whether every process fits it (`_fits_on_every_process`), which then agrees it."""
        if not self.size_agreed:
            self.size_agreed = self._fits_on_every_process(batch, size)
            return self.size_agreed
        return True

    def _clear(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def _micro_batches(self, batch: dict, size: int):
        rows = batch["input_ids"].shape[0]
        for start in range(0, rows, size):
            part = {key: value[start:start + size] for key, value in batch.items()}
            yield part, part["input_ids"].shape[0] / rows, start + size >= rows

    def _fits_on_every_process(self, batch: dict, size: int) -> bool:
        """Forward and backward passes of every micro-batch at `size` with no gradient synchronisation (their
        gradients are dropped), then one all-reduce: False when any process ran out of memory."""
        failed = False
        try:
            with self.sync.deferred():
                for part, weight, _ in self._micro_batches(batch, size):
                    with training_autocast(self.env.device):
                        loss, _ = self.loss_fn(self.model, part)
                    (loss * weight).backward()
                    del loss
        except torch.OutOfMemoryError:
            failed = True
        self._clear()
        flag = torch.tensor([float(failed)], device=self.env.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self.env.group)
        return flag.item() == 0

    def _step(self, batch: dict, size: int, check) -> StepOutcome:
        device = self.env.device
        loss_sum = torch.zeros((), device=device)
        metric_sums: dict[str, torch.Tensor] = {}
        for part, weight, last in self._micro_batches(batch, size):
            deferred = self.sync.deferred is not None and not last
            with self.sync.deferred() if deferred else contextlib.nullcontext():
                with training_autocast(device):
                    loss, metrics = self.loss_fn(self.model, part)
                (loss * weight).backward()
            loss_sum += loss.detach().float() * weight
            for name, value in metrics.items():
                metric_sums[name] = metric_sums.get(name, 0) + _as_tensor(value, device) * weight
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.settings.grad_clip)
        if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP2
            grad_norm = grad_norm.full_tensor()
        # The processes' means (the gradient norm is the same everywhere already), then the one host
        # synchronisation of the step: every process reads the same numbers.
        numbers = all_reduce_mean(torch.stack([loss_sum, grad_norm.detach().float().to(device),
                                               *metric_sums.values()]), self.env)
        loss_value, norm_value, *metric_values = numbers.tolist()
        if check is not None:
            try:
                check(loss_value, norm_value)
            except BaseException:
                self.optimizer.zero_grad(set_to_none=True)
                raise
        applied = math.isfinite(loss_value) and math.isfinite(norm_value)
        if applied:
            self.optimizer.step()
            self.scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return StepOutcome(loss_value, norm_value, dict(zip(metric_sums, metric_values)), applied, size)
