"""Divergence checks of the training loop: a step whose loss or gradient norm is not finite, or a run that has
collapsed (the loss sitting at ln(vocabulary), the cross-entropy of a uniform prediction, or a gradient norm of zero,
for `patience` steps in a row), stops the run with one line naming the step and the likely cause. The loop calls
`check` after backward and clipping and before the optimizer step, so a non-finite gradient is never applied."""

from __future__ import annotations

import math

# |loss - ln V| below this is a uniform prediction (a collapsed model's logits are all equal: ln V to float32
# rounding, ~1e-6). A trained or freshly initialised model's cross-entropy differs from ln V by more: a fresh one by
# about half the variance of its logits, 1e-2 for a 32-wide toy model; the student of the tests' 32-wide random
# teacher, itself near uniform, after the smoke plan's training on the repository's docs by 9.8e-4 (its held-out
# loss 5.7028 against ln 300 = 5.7038), which the earlier 1e-3 took for a collapse.
UNIFORM_LOSS_TOLERANCE = 3e-4
# A gradient norm below this is zero: the loss no longer depends on the trainable weights.
ZERO_GRAD_NORM = 1e-10
# The uniform-loss plateau counts only after the loss has been this far below ln V: a fresh model starts near ln V.
LEARNED_MARGIN = 0.1


class TrainingDiverged(ValueError):
    """The run diverged or collapsed: it stops, keeping its last good checkpoint."""


class DivergenceMonitor:
    """Per-step checks of the loss and the gradient norm; `check` raises `TrainingDiverged` with one clear line.

    `vocab_size`: the loss is a cross-entropy over this many classes (None for other losses: KL, MSE), so that a
    loss stuck at ln(vocab_size) means a uniform prediction. `patience`: steps a collapse signature must last."""

    def __init__(self, vocab_size: int | None, patience: int = 3, *, description: str = "train",
                 lr: float | None = None):
        if patience < 1:
            raise ValueError(f"patience must be >= 1, got {patience}")
        self.uniform_loss = math.log(vocab_size) if vocab_size else None
        self.patience = patience
        self.description = description
        self.lr = lr
        self.zero_grad_steps = 0
        self.uniform_steps = 0
        self.has_learned = False

    def _cause(self) -> str:
        rate = f" ({self.lr:g})" if self.lr is not None else ""
        return f"the training diverged; the likely cause is a learning rate too high{rate}: lower it"

    def check(self, step: int, loss: float, grad_norm: float) -> None:
        """Raise `TrainingDiverged` when step `step` (1-based) shows divergence; its update must not be applied."""
        where = f"{self.description}: "
        if not math.isfinite(loss):
            raise TrainingDiverged(f"{where}loss is {loss} at step {step}, no update applied: {self._cause()}")
        if not math.isfinite(grad_norm):
            raise TrainingDiverged(f"{where}gradient norm is {grad_norm} at step {step}, no update applied: "
                                   f"{self._cause()}")
        self.zero_grad_steps = self.zero_grad_steps + 1 if grad_norm < ZERO_GRAD_NORM else 0
        if self.zero_grad_steps >= self.patience:
            raise TrainingDiverged(
                f"{where}gradient norm has been 0 for {self.zero_grad_steps} steps (to step {step}): the model "
                f"collapsed and no longer learns (loss {loss:.4g}); {self._cause()}"
            )
        if self.uniform_loss is None:
            return
        if loss < self.uniform_loss - LEARNED_MARGIN:
            self.has_learned = True
        at_uniform = self.has_learned and abs(loss - self.uniform_loss) < UNIFORM_LOSS_TOLERANCE
        self.uniform_steps = self.uniform_steps + 1 if at_uniform else 0
        if self.uniform_steps >= self.patience:
            raise TrainingDiverged(
                f"{where}loss has been {loss:.4f} = ln(vocabulary {round(math.exp(self.uniform_loss))}) for "
                f"{self.uniform_steps} steps (to step {step}): the model collapsed to a uniform prediction; "
                f"{self._cause()}"
            )
