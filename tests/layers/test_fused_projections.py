"""Fused input projections (`hyla.layers.projections`, `use_fused_projections`): each mixer's q/k/v/output-gate maps
and each MLP's gate/up maps as one product give the separate maps' outputs and gradients (float64, so that only the
order of the sums differs: agreement to ~1e-12), on single layers and on a whole HypeNet; the parameters and the
checkpoint stay as they are."""

from __future__ import annotations

import copy

import pytest
import torch

from hyla import HypeNetConfig
from hyla.layers.attention import Attention
from hyla.layers.context import MixerContext
from hyla.layers.lightning import LightningAttention
from hyla.layers.mlp import GatedMLP
from hyla.layers.projections import concatenate_linears, fused_linear, mixer_input_linears
from hyla.layers.rope import RotaryEmbedding
from hyla.models.modeling import HypeNetForCausalLM, use_fused_projections

TOL = dict(rtol=1e-10, atol=1e-12)


def config(**overrides):
    kwargs = dict(vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
                  num_key_value_heads=2, head_dim=8, layer_types=["lightning", "attention", "lightning", "attention"],
                  attention_output_gate=True, lightning_output_gate=True, qkv_bias=False)
    kwargs.update(overrides)
    return HypeNetConfig(**kwargs)


def randomize(module, seed):
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=generator, dtype=param.dtype) * 0.3)
    return module


def context_for(cfg, batch, length):
    positions = torch.arange(length)[None].expand(batch, -1)
    return MixerContext(position_ids=positions, rope=RotaryEmbedding(cfg)(positions, torch.float64))


def outputs_and_gradients(module, inputs, run):
    """run(module, x) -> output; returns the output, the input's gradient and each parameter's, by name."""
    x = inputs.clone().requires_grad_(True)
    output = run(module, x)
    weights = torch.randn(output.shape, generator=torch.Generator().manual_seed(7), dtype=output.dtype)
    (output * weights).sum().backward()
    grads = {name: param.grad.clone() for name, param in module.named_parameters() if param.grad is not None}
    return output.detach(), x.grad, grads


def both_ways(module, inputs, run):
    plain = copy.deepcopy(module)
    fused = copy.deepcopy(module)
    use_fused_projections(fused)
    return outputs_and_gradients(plain, inputs, run), outputs_and_gradients(fused, inputs, run)


def assert_same(plain, fused):
    (out_a, dx_a, grads_a), (out_b, dx_b, grads_b) = plain, fused
    torch.testing.assert_close(out_b, out_a, **TOL)
    torch.testing.assert_close(dx_b, dx_a, **TOL)
    assert grads_a.keys() == grads_b.keys()
    for name in grads_a:
        torch.testing.assert_close(grads_b[name], grads_a[name], **TOL, msg=name)


@pytest.mark.parametrize("gate", [True, False], ids=["output-gate", "no-gate"])
@pytest.mark.parametrize("kind", ["attention", "lightning"])
def test_a_mixers_fused_maps_give_its_outputs_and_gradients(kind, gate):
    torch.manual_seed(0)
    cfg = config(attention_output_gate=gate, lightning_output_gate=gate, attention_qk_norm=True,
                 attention_logit_scaling_a=50.0)
    layer = randomize((Attention if kind == "attention" else LightningAttention)(cfg, 0).double(), 1)
    assert len(mixer_input_linears(layer)) == (4 if gate else 3)
    inputs = torch.randn(2, 11, cfg.hidden_size, dtype=torch.float64)
    context = context_for(cfg, 2, 11)
    plain, fused = both_ways(layer, inputs, lambda module, x: module(x, context))
    assert_same(plain, fused)
    # every map's parameters get a gradient, the output gate's bias among them
    assert {name.split(".")[0] for name in fused[2]} >= {"q_proj", "k_proj", "v_proj", "o_proj"} | (
        {"g_proj" if kind == "attention" else "z_proj"} if gate else set())


def test_the_mlps_fused_maps_give_its_outputs_and_gradients():
    mlp = randomize(GatedMLP(32, 48, bias=True).double(), 2)
    plain, fused = both_ways(mlp, torch.randn(3, 5, 32, dtype=torch.float64), lambda module, x: module(x))
    assert_same(plain, fused)
    assert {"gate_proj.bias", "up_proj.bias", "gate_proj.weight", "up_proj.weight"} <= fused[2].keys()


def test_a_hypenet_with_fused_maps_gives_the_same_logits_and_gradients_and_keeps_its_checkpoint():
    torch.manual_seed(0)
    model = randomize(HypeNetForCausalLM(config()).double(), 3)
    ids = torch.randint(0, 50, (2, 13))

    def run(module, _):
        return module(input_ids=ids).logits

    keys = list(model.state_dict())
    plain_model, fused_model = copy.deepcopy(model), copy.deepcopy(model)
    # two mixers a kind and an MLP a block
    assert use_fused_projections(fused_model) == 4 + 4
    assert list(fused_model.state_dict()) == keys
    plain, fused = outputs_and_gradients(plain_model, torch.zeros(1), run), \
        outputs_and_gradients(fused_model, torch.zeros(1), run)
    torch.testing.assert_close(fused[0], plain[0], **TOL)
    assert plain[2].keys() == fused[2].keys()
    for name in plain[2]:
        torch.testing.assert_close(fused[2][name], plain[2][name], **TOL, msg=name)
    assert use_fused_projections(fused_model, False) == 8
    assert not any(getattr(module, "fuse_projections", False) for module in fused_model.modules())


def test_fused_linear_is_each_map_in_order():
    linears = [torch.nn.Linear(6, width, bias=bias).double() for width, bias in ((4, False), (2, True), (3, False))]
    x = torch.randn(5, 6, dtype=torch.float64)
    weight, bias, sizes = concatenate_linears(linears)
    assert weight.shape == (9, 6) and sizes == (4, 2, 3)
    torch.testing.assert_close(bias, torch.cat([torch.zeros(4, dtype=torch.float64), linears[1].bias.detach(),
                                                torch.zeros(3, dtype=torch.float64)]))
    for part, linear in zip(fused_linear(x, linears), linears, strict=True):
        torch.testing.assert_close(part, x @ linear.weight.T + (linear.bias if linear.bias is not None else 0), **TOL)
