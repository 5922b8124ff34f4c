"""Activation checkpointing (`STAGE.checkpoint_activations=true`, `hyla train --checkpoint-activations`): the same
loss and gradients as without, far fewer bytes kept for the backward pass, and no change to the stages' hashes."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from hyla import HypeNetConfig, HypeNetForCausalLM
from hyla.convert.pipeline import stage_settings
from hyla.convert.presets import apply_overrides, make_plan
from hyla.train.activations import checkpoint_activations


def saved_bytes_and_grads(model: HypeNetForCausalLM, tokens: torch.Tensor) -> tuple[int, float, list[torch.Tensor]]:
    """Bytes autograd keeps from the forward for the backward, the loss, and the gradients."""
    saved = []

    def keep(tensor):
        saved.append(tensor.numel() * tensor.element_size())
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(keep, lambda tensor: tensor):
        loss = model(tokens, labels=tokens, use_cache=False).loss
    loss.backward()
    return sum(saved), loss.item(), [p.grad for p in model.parameters()]


def test_checkpointed_blocks_give_the_same_gradients_and_keep_far_less():
    torch.manual_seed(0)
    config = HypeNetConfig(vocab_size=60, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                           num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                           layer_types=["lightning", "attention", "lightning", "lightning"],
                           attention_output_gate=True, attention_logit_scaling_a=5.0)
    plain = HypeNetForCausalLM(config).double().train()
    checkpointed = copy.deepcopy(plain)
    checkpoint_activations(checkpointed)
    tokens = torch.randint(0, 60, (2, 64), generator=torch.Generator().manual_seed(1))
    plain_bytes, plain_loss, plain_grads = saved_bytes_and_grads(plain, tokens)
    kept_bytes, kept_loss, kept_grads = saved_bytes_and_grads(checkpointed, tokens)
    assert kept_loss == pytest.approx(plain_loss, rel=1e-12)
    for a, b in zip(plain_grads, kept_grads):
        assert ((a - b).norm() / a.norm()).item() <= 1e-12
    # What stays is each block's input and the embedding/head work: under a quarter of the plain forward's here.
    assert kept_bytes < plain_bytes / 4, (kept_bytes, plain_bytes)


def test_checkpoint_setting_leaves_stage_hashes_alone_and_is_refused_for_alignment():
    plan = make_plan("smoke", 1_000_000)
    kept = apply_overrides(make_plan("smoke", 1_000_000),
                           ["distill.checkpoint_activations=true", "finetune.checkpoint_activations=true"])
    assert kept.finetune.checkpoint_activations and not plan.finetune.checkpoint_activations
    request = SimpleNamespace(data=["somewhere"])
    assert stage_settings(kept, request) == stage_settings(plan, request)
    with pytest.raises(ValueError, match="align.checkpoint_activations"):
        apply_overrides(make_plan("smoke", 1_000_000), ["align.checkpoint_activations=true"])
