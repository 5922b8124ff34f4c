"""RoPE on GLA and GDN layers (`gla_rope`, `gdn_rope`): the layer equals, in float64, its projections rotated by
`hyla.layers.rope` at the tokens' absolute positions and run through the pure-torch reference recurrence; off, it is
the reference without rotation. GDN rotates after its SiLU and before its L2 norm, so |k| = 1 holds under any RoPE
type."""

import pytest
import torch
import torch.nn.functional as F

from hyla import HypeNetConfig
from hyla.layers.context import MixerContext
from hyla.layers.gdn import GatedDeltaNet
from hyla.layers.gla import GatedLinearAttention
from hyla.layers.headwise import HeadwiseHybrid
from hyla.layers.rope import RotaryEmbedding, apply_rotary
from hyla.ops.gdn.reference import gdn_recurrent
from hyla.ops.gla.reference import gla_recurrent

HEADS, HEAD_DIM, HIDDEN = 4, 8, 32
MIXERS = {"gla": GatedLinearAttention, "gdn": GatedDeltaNet}


def config(kind, rope, **overrides):
    kwargs = dict(vocab_size=50, hidden_size=HIDDEN, intermediate_size=48, num_hidden_layers=1,
                  num_attention_heads=HEADS, num_key_value_heads=2, head_dim=HEAD_DIM, layer_types=[kind])
    return HypeNetConfig(**{**kwargs, f"{kind}_rope": rope, **overrides})


def random_layer(kind, cfg, seed=0):
    layer = MIXERS[kind](cfg, 0).double()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in layer.parameters():
            param.copy_(torch.randn(param.shape, generator=gen, dtype=param.dtype) * 0.3)
    return layer


def context_at(cfg, positions):
    return MixerContext(position_ids=positions, rope=RotaryEmbedding(cfg)(positions, torch.float64))


def unit(x):
    """x / sqrt(|x|^2 + 1e-6) over the head dimension (fla's l2norm, written out)."""
    return x / (x.pow(2).sum(-1, keepdim=True) + 1e-6).sqrt()


def reference_output(kind, layer, x, positions, rope):
    """The layer's output recomputed outside the layer: its projections (GDN: SiLU), RoPE from `hyla.layers.rope`
    at `positions` when `rope` (GDN: then the L2 norm), the pure-torch recurrence, then the layer's unchanged tail.
    The gates are the layer's `token_inputs` (RoPE does not touch them)."""
    shape = x.shape[:2] + (HEADS, HEAD_DIM)
    q, k, v = (proj(x).view(shape) for proj in (layer.q_proj, layer.k_proj, layer.v_proj))
    if kind == "gdn":
        q, k, v = F.silu(q), F.silu(k), F.silu(v)
    if rope:
        cos, sin = RotaryEmbedding(layer.config)(positions, torch.float64)
        q, k = apply_rotary(q, cos, sin), apply_rotary(k, cos, sin)
    if kind == "gdn":
        q, k = unit(q), unit(k)
    gates = layer.token_inputs(x, context_at(layer.config, positions))
    recurrence = gla_recurrent if kind == "gla" else gdn_recurrent
    output, _ = recurrence(q, k, v, **{name: g.double() for name, g in gates.items()}, scale=HEAD_DIM**-0.5)
    return layer.project_output(output, x)


@pytest.mark.parametrize("kind", list(MIXERS))
@pytest.mark.parametrize("rope", [False, True])
def test_layer_equals_rotated_projections_through_the_reference_recurrence(kind, rope):
    """Rows at positions 0.. and 37..: RoPE at absolute positions. The reference is token-by-token, the layer runs
    the chunked form (67 tokens: two chunks); float64 but for the float32 gates, which both sides share."""
    cfg = config(kind, rope)
    layer = random_layer(kind, cfg)
    assert layer.use_rope is rope
    x = torch.randn(2, 67, HIDDEN, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    positions = torch.stack([torch.arange(67), torch.arange(37, 104)])
    with torch.no_grad():
        actual = layer(x, context_at(cfg, positions))
        expected = reference_output(kind, layer, x, positions, rope)
        unrotated = reference_output(kind, layer, x, positions, not rope)
    torch.testing.assert_close(actual, expected, rtol=1e-12, atol=1e-12)
    assert (actual - unrotated).abs().max() > 1e-3  # the option changes the layer


def test_gdn_keys_stay_unit_under_a_scaled_rope():
    """yarn multiplies cos/sin by its attention factor (here 1.14): rotated after the L2 norm, |k| would be 1.14;
    GDN rotates before its norm, so |q| = |k| = 1 (up to the norm's eps), as the delta rule needs."""
    yarn = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 16}
    cfg = config("gdn", True, rope_parameters=yarn, max_position_embeddings=64)
    rotary = RotaryEmbedding(cfg)
    positions = torch.arange(40)[None]
    cos, sin = rotary(positions, torch.float64)
    assert rotary.attention_scaling == pytest.approx(1.1386, abs=1e-4)
    layer = random_layer("gdn", cfg)
    x = torch.randn(1, 40, HIDDEN, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        q, k, _ = layer.project(x, MixerContext(position_ids=positions, rope=(cos, sin)))
    for tensor in (q, k):
        torch.testing.assert_close(tensor.norm(dim=-1), torch.ones(1, 40, HEADS, dtype=torch.float64), rtol=0,
                                   atol=1e-4)


@pytest.mark.parametrize("kind", list(MIXERS))
def test_headwise_layers_take_the_mixers_rope(kind):
    cfg = config(kind, True, layer_types=[f"hh_{kind}"], headwise_ratio="1:1")
    assert HeadwiseHybrid(cfg, 0, efficient_type=kind).efficient.use_rope
    assert not HeadwiseHybrid(config(kind, False, layer_types=[f"hh_{kind}"], headwise_ratio="1:1"), 0,
                              efficient_type=kind).efficient.use_rope
