"""Activation checkpointing for training: each block of a HypeNet keeps only its input for the backward pass and
recomputes the rest there (the model's own gradient checkpointing, non-reentrant so that it composes with FSDP2 and
torch.compile), one more forward per step for much less memory."""

from __future__ import annotations

from hyla.models import HypeNetForCausalLM


def checkpoint_activations(model: HypeNetForCausalLM) -> int:
    """Switch activation checkpointing on for every block of `model`; returns the number of blocks."""
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return len(model.model.layers)
