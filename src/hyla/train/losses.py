"""Training losses for `hyla train`: next-token cross-entropy and LongCE (docs/method.md, "LongCE").

LongCE up-weights the tokens whose prediction improves most when the long context is present: with per-token
losses under the full context (ce_t) and under a short window only (ce_short_t, no gradient), the influence is
I_t = ce_short_t - ce_t = log p_long - log p_short, and the weight min(exp(I_t), cap) (no gradient) scales ce_t.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

LOSSES = ("ce", "longce")


def token_losses(model, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    logits = model(input_ids, use_cache=False).logits
    return F.cross_entropy(logits.flatten(0, 1).float(), labels.flatten(), reduction="none").view(labels.shape)


def ce_loss(model, batch: dict) -> tuple[torch.Tensor, dict]:
    return token_losses(model, batch["input_ids"], batch["labels"]).mean(), {}


@torch.no_grad()
def short_context_losses(model, input_ids: torch.Tensor, labels: torch.Tensor, window: int) -> torch.Tensor:
    """Per-token losses when each token sees only the tokens of its own `window`-sized block (between 0 and
    window - 1 earlier tokens): the cheap short-context reference, one forward over [B * T / window, window]."""
    batch, length = input_ids.shape
    pad = (-length) % window
    ids = F.pad(input_ids, (0, pad)).view(-1, window)
    targets = F.pad(labels, (0, pad), value=-100).view(-1, window)
    losses = token_losses(model, ids, targets.clamp(min=0))
    return losses.view(batch, -1)[:, :length]


def longce_loss(model, batch: dict, *, window: int = 256, cap: float = 5.0) -> tuple[torch.Tensor, dict]:
    losses = token_losses(model, batch["input_ids"], batch["labels"])
    short = short_context_losses(model, batch["input_ids"], batch["labels"], window)
    influence = short - losses.detach()
    weights = torch.exp(influence).clamp(max=cap)
    loss = (weights * losses).sum() / weights.sum()
    return loss, {"ce": losses.detach().mean(), "mean_weight": weights.mean()}
