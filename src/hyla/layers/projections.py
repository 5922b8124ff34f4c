"""Linear maps that read the same input, computed as one product: a mixer's q/k/v (and output gate) maps, an MLP's
gate/up maps.

One product of the input with the concatenated weights gives the same outputs as the separate maps (the same sums,
in another kernel's order), reads the input once instead of 3-4 times, and in the backward pass gives the input's
gradient as one product summed inside the matrix kernel where the separate maps give 3-4 products and the sums of
their results. Used by training (`fuse_projections` on `Attention`, `LightningAttention` and `GatedMLP`, set by
`hyla.models.modeling.use_fused_projections`: the weights concatenated at every call, so that gradients reach each
parameter) and by the inference engine's decode step (`hyla.inference.decode_step.FusedProjections`: copies taken
once).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def concatenate_linears(linears) -> tuple[torch.Tensor, torch.Tensor | None, tuple[int, ...]]:
    """(weight [sum of outputs, in], bias or None, each map's output width): `linears`' weights stacked in order; a
    bias where any map has one (zeros for those without)."""
    weight = torch.cat([linear.weight for linear in linears])
    bias = None
    if any(linear.bias is not None for linear in linears):
        bias = torch.cat([linear.bias if linear.bias is not None else linear.weight.new_zeros(linear.out_features)
                          for linear in linears])
    return weight, bias, tuple(linear.out_features for linear in linears)


def mixer_input_linears(mixer) -> list[nn.Linear]:
    """A softmax or Lightning mixer's input-side maps in the order fused products split them: q, k, v, then the
    output gate's where the layer has one (its pre-activation: `project_output` takes it as `gate`)."""
    gate = mixer.gate_projection()
    return [mixer.q_proj, mixer.k_proj, mixer.v_proj] + ([gate] if gate is not None else [])


def fused_linear(hidden_states: torch.Tensor, linears) -> tuple[torch.Tensor, ...]:
    """Each of `linears` applied to `hidden_states`, as one product with their concatenated weights (differentiable
    with respect to every weight and bias)."""
    weight, bias, sizes = concatenate_linears(linears)
    return F.linear(hidden_states, weight, bias).split(sizes, dim=-1)


def project_with_gate(mixer, hidden_states: torch.Tensor, context):
    """A softmax or Lightning mixer's (q, k, v, output gate's pre-activation or None): with its `fuse_projections`
    all four maps as one product (then `prepare_qkv`), else its own `project` and the gate left to
    `project_output`."""
    if not mixer.fuse_projections:
        return (*mixer.project(hidden_states, context), None)
    parts = fused_linear(hidden_states, mixer_input_linears(mixer))
    return (*mixer.prepare_qkv(*parts[:3], context), parts[3] if len(parts) > 3 else None)
