"""Head-wise hybrid (HH) layer (docs/method.md, "Hybrid family"): an efficient mixer and NoPE attention side by side in
one layer.

The layer's heads split as `headwise_ratio` "E:N" says; each branch is the ordinary mixer built with its share of
the heads (the NoPE branch keeps the model's query-per-KV-head grouping) and the layer returns the sum of the two
branch outputs. Summing two output projections over disjoint heads is one projection over the concatenated heads,
so this is the usual "heads side by side" layer, and ratio 1:0 (0:1) is exactly the pure efficient mixer (pure
NoPE attention). Each branch reads the model config with only its head counts replaced; the call's inference
options (EME, logit scaling) reach both branches through the context.
"""

from __future__ import annotations

import torch
from torch import nn

from hyla.layers.attention import Attention
from hyla.layers.context import MixerContext
from hyla.layers.gdn import GatedDeltaNet
from hyla.layers.gla import GatedLinearAttention
from hyla.layers.lightning import LightningAttention
from hyla.layers.swa import SlidingWindowAttention

EFFICIENT_MIXERS = {
    "lightning": LightningAttention,
    "gla": GatedLinearAttention,
    "gdn": GatedDeltaNet,
    "swa": SlidingWindowAttention,
}


def headwise_branch_index(layer_types: list[str], layer_idx: int) -> int:
    """Cache slot of the efficient branch of head-wise layer `layer_idx` (its NoPE branch uses slot layer_idx):
    one extra slot per "hh_*" layer, after the per-layer slots."""
    headwise = [i for i, kind in enumerate(layer_types) if kind.startswith("hh_")]
    return len(layer_types) + headwise.index(layer_idx)


class BranchConfig:
    """The model config seen through a branch: `overrides` replace fields, everything else is read live."""

    def __init__(self, config, **overrides):
        self.__dict__["_config"] = config
        self.__dict__["_overrides"] = overrides

    def __getattr__(self, name):
        if "_overrides" not in self.__dict__:  # copy/pickle probe an instance before its __dict__ is restored
            raise AttributeError(name)
        overrides = self.__dict__["_overrides"]
        return overrides[name] if name in overrides else getattr(self.__dict__["_config"], name)


class HeadwiseHybrid(nn.Module):
    def __init__(self, config, layer_idx: int, *, efficient_type: str):
        super().__init__()
        self.layer_idx = layer_idx
        self.efficient_type = efficient_type
        efficient_heads, nope_heads = config.headwise_split()
        group = config.num_attention_heads // config.num_key_value_heads
        self.efficient = None
        if efficient_heads:
            branch = BranchConfig(
                config, num_attention_heads=efficient_heads, num_key_value_heads=efficient_heads // group
            )
            slot = headwise_branch_index(config.layer_types, layer_idx)
            self.efficient = EFFICIENT_MIXERS[efficient_type](branch, slot)
        self.nope = None
        if nope_heads:
            branch = BranchConfig(
                config, num_attention_heads=nope_heads, num_key_value_heads=nope_heads // group
            )
            self.nope = Attention(branch, layer_idx)

    def forward(self, hidden_states: torch.Tensor, context: MixerContext) -> torch.Tensor:
        branches = [m for m in (self.efficient, self.nope) if m is not None]
        output = branches[0](hidden_states, context)
        for branch in branches[1:]:
            output = output + branch(hidden_states, context)
        return output


def headwise_mixer(efficient_type: str):
    """The mixer constructor `(config, layer_idx)` of layer type "hh_<efficient_type>"."""

    def build(config, layer_idx: int) -> HeadwiseHybrid:
        return HeadwiseHybrid(config, layer_idx, efficient_type=efficient_type)

    return build
