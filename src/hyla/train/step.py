"""One optimizer step of the training loop: the process's rows of the global batch in micro-batches (gradients
accumulated), clipping, and one read of the step's numbers back to the host, after which the update is applied
only if the loss and the gradient norm are finite.

That read is the step's only host synchronisation: loss functions return their metrics as tensors, and the GPU
works through the forward and backward passes without waiting for the host.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from hyla.train.distributed import Distributed, all_reduce_mean
from hyla.train.optim import OptimSettings

LossFn = Callable[[torch.nn.Module, dict], tuple[torch.Tensor, dict]]


def training_autocast(device: torch.device) -> torch.autocast:
    """bf16 autocast on GPU (master weights stay float32), the precision training and evaluation run at there; CPU
    runs in the model's own dtype."""
    return torch.autocast("cuda", dtype=torch.bfloat16, enabled=device.type == "cuda")


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
    split (exactly for per-token means over equal token counts, as the training stages' losses are)."""

    def __init__(self, model: torch.nn.Module, loss_fn: LossFn, optimizer, scheduler, settings: OptimSettings,
                 env: Distributed, *, micro_batch_rows: int | None = None, log: Callable[[str], None] = print):
        if micro_batch_rows is not None and micro_batch_rows < 1:
            raise ValueError(f"micro_batch_rows must be >= 1 or None (automatic), got {micro_batch_rows}")
        self.model, self.loss_fn, self.optimizer, self.scheduler = model, loss_fn, optimizer, scheduler
        self.settings, self.env, self.log = settings, env, log
        self.automatic = micro_batch_rows is None
        self.micro_batch_rows = micro_batch_rows
        self.params = [p for p in model.parameters() if p.requires_grad]

    def __call__(self, batch: dict, check: Callable[[float, float], None] | None = None) -> StepOutcome:
        """check(loss, grad_norm): called after the host read and before the update (a divergence monitor); if it
        raises, the update is not applied and the exception propagates."""
        rows = batch["input_ids"].shape[0]
        while True:
            size = min(self.micro_batch_rows or rows, rows)
            try:
                return self._step(batch, size, check)
            except torch.OutOfMemoryError:
                if not self.automatic or size == 1:
                    raise
            # Outside the handler, so that the failed attempt's tensors are free before the next one.
            self.optimizer.zero_grad(set_to_none=True)
            torch.cuda.empty_cache()
            self.micro_batch_rows = (size + 1) // 2
            self.log(f"out of memory at {size} rows a micro-batch: retrying the step at {self.micro_batch_rows}")

    def _step(self, batch: dict, size: int, check) -> StepOutcome:
        rows = batch["input_ids"].shape[0]
        device = self.env.device
        loss_sum = torch.zeros((), device=device)
        metric_sums: dict[str, torch.Tensor] = {}
        for start in range(0, rows, size):
            part = {key: value[start:start + size] for key, value in batch.items()}
            weight = part["input_ids"].shape[0] / rows
            with training_autocast(device):
                loss, metrics = self.loss_fn(self.model, part)
            (loss * weight).backward()
            loss_sum += loss.detach().float() * weight
            for name, value in metrics.items():
                metric_sums[name] = metric_sums.get(name, 0) + _as_tensor(value, device) * weight
        grad_norm = torch.nn.utils.clip_grad_norm_(self.params, self.settings.grad_clip)
        if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP2
            grad_norm = grad_norm.full_tensor()
        loss_mean = all_reduce_mean(loss_sum, self.env)
        # The one host synchronisation of the step.
        loss_value, norm_value, *metric_values = torch.stack(
            [loss_mean, grad_norm.detach().float().to(device), *metric_sums.values()]).tolist()
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
