"""AdamW with warm-up then cosine decay or a constant rate (docs/method.md, "HALO conversion": betas (0.9, 0.95), no
weight decay, clip 1)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

SCHEDULES = ("cosine", "constant")


@dataclass
class OptimSettings:
    lr: float = 1e-3
    min_lr: float = 1e-5
    warmup_steps: int = 50
    schedule: str = "cosine"
    weight_decay: float = 0.0
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0

    def __post_init__(self) -> None:
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule {self.schedule!r} is not one of {', '.join(SCHEDULES)}")
        if self.lr <= 0 or self.min_lr < 0 or self.warmup_steps < 0:
            raise ValueError("lr must be > 0, min_lr and warmup_steps >= 0")


def lr_at(step: int, total_steps: int, settings: OptimSettings) -> float:
    """Learning rate for optimizer step `step` (0-based) of `total_steps`."""
    if settings.warmup_steps and step < settings.warmup_steps:
        return settings.lr * (step + 1) / settings.warmup_steps
    if settings.schedule == "constant":
        return settings.lr
    decay_steps = max(1, total_steps - settings.warmup_steps)
    progress = min(1.0, (step - settings.warmup_steps) / decay_steps)
    return settings.min_lr + 0.5 * (settings.lr - settings.min_lr) * (1 + math.cos(math.pi * progress))


def build_optimizer(params, settings: OptimSettings, total_steps: int, *, fused: bool | None = None):
    """AdamW and a LambdaLR scheduler that follows `lr_at`. fused: torch's fused AdamW (one kernel for every
    parameter; the same update up to float32 rounding); None: where every parameter is on CUDA."""
    params = [p for p in params if p.requires_grad]
    if fused is None:
        fused = bool(params) and all(p.is_cuda for p in params)
    optimizer = torch.optim.AdamW(
        params,
        lr=settings.lr,
        betas=(settings.beta1, settings.beta2),
        weight_decay=settings.weight_decay,
        fused=fused,
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: lr_at(step, total_steps, settings) / settings.lr
    )
    return optimizer, scheduler
