"""Family layers on their own: head-wise layers at ratio 1:0 / 0:1 are the pure mixers, SWA equals attention over
each query's window, NoPE logit scaling modes, GLA/GDN gate ranges."""

import dataclasses
import math

import pytest
import torch

from hyla import HypeNetConfig
from hyla.layers.attention import Attention, query_logit_scale
from hyla.layers.context import InferenceOptions, MixerContext
from hyla.layers.gdn import GatedDeltaNet
from hyla.layers.gla import GatedLinearAttention
from hyla.layers.headwise import EFFICIENT_MIXERS, HeadwiseHybrid
from hyla.layers.rope import RotaryEmbedding
from hyla.layers.swa import RopeAttention, SlidingWindowAttention
from hyla.models.configuration import HEADWISE_LAYER_TYPES


def config(**overrides):
    kwargs = dict(
        vocab_size=50, hidden_size=32, intermediate_size=48, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8, layer_types=["attention"], swa_window=5, attention_qk_norm=True,
        attention_output_gate=True,
    )
    kwargs.update(overrides)
    return HypeNetConfig(**kwargs)


def context_for(cfg, batch, length, offset=0):
    positions = torch.arange(offset, offset + length)[None].expand(batch, -1)
    return MixerContext(position_ids=positions, rope=RotaryEmbedding(cfg)(positions, torch.float64))


def randomize(module, seed):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            param.copy_(torch.randn(param.shape, generator=gen, dtype=param.dtype) * 0.3)
    return module


@pytest.mark.parametrize("efficient_type", list(EFFICIENT_MIXERS))
def test_headwise_ratio_one_to_zero_is_the_pure_efficient_mixer(efficient_type):
    cfg = config(layer_types=[f"hh_{efficient_type}"], headwise_ratio="1:0")
    hybrid = randomize(HeadwiseHybrid(cfg, 0, efficient_type=efficient_type), 0).double()
    assert hybrid.nope is None
    pure = EFFICIENT_MIXERS[efficient_type](cfg, 0).double()
    pure.load_state_dict({name.removeprefix("efficient."): p for name, p in hybrid.state_dict().items()})
    x = torch.randn(2, 19, 32, dtype=torch.float64)
    ctx = context_for(cfg, 2, 19)
    assert torch.equal(hybrid(x, ctx), pure(x, ctx))


@pytest.mark.parametrize("layer_type", HEADWISE_LAYER_TYPES)
@pytest.mark.parametrize("scaling", [dict(), dict(attention_logit_scaling_a=16.0)])
def test_headwise_ratio_zero_to_one_is_the_pure_nope_attention(layer_type, scaling):
    cfg = config(layer_types=[layer_type], headwise_ratio="0:1", **scaling)
    hybrid = randomize(HeadwiseHybrid(cfg, 0, efficient_type=layer_type.removeprefix("hh_")), 1).double()
    assert hybrid.efficient is None
    pure = Attention(cfg, 0).double()
    assert not pure.use_rope
    pure.load_state_dict({name.removeprefix("nope."): p for name, p in hybrid.state_dict().items()})
    x = torch.randn(2, 19, 32, dtype=torch.float64)
    ctx = context_for(cfg, 2, 19, offset=3)
    assert torch.equal(hybrid(x, ctx), pure(x, ctx))


def test_headwise_split_follows_the_ratio():
    cfg = config(num_attention_heads=8, num_key_value_heads=4, hidden_size=64, headwise_ratio="3:1",
                 layer_types=["hh_gla"])
    hybrid = HeadwiseHybrid(cfg, 0, efficient_type="gla")
    assert (hybrid.efficient.num_heads, hybrid.nope.num_heads, hybrid.nope.num_kv_heads) == (6, 2, 1)
    assert hybrid.efficient.config.swa_window == cfg.swa_window  # the branches read the model config


def test_sliding_window_attention_equals_attention_over_each_window():
    cfg = config(swa_window=5)
    swa = randomize(SlidingWindowAttention(cfg, 0), 2).double()
    full = RopeAttention(cfg, 0).double()
    full.load_state_dict(swa.state_dict())
    x = torch.randn(1, 23, 32, dtype=torch.float64)
    out = swa(x, context_for(cfg, 1, 23))
    for t in range(23):
        start = max(0, t - 4)
        alone = full(x[:, start : t + 1], context_for(cfg, 1, t + 1 - start, offset=start))
        assert torch.allclose(out[:, t], alone[:, -1], rtol=0, atol=1e-12), t


def test_rope_attention_scales_per_query_only_and_follows_the_eme_window():
    """Full RoPE attention takes the per-query s_t (the model's a) but not EME's c(L), which is for NoPE queries;
    sliding-window attention scales nothing. EME windows full RoPE attention, SWA keeps its own window."""
    cfg = config(attention_logit_scaling_a=16.0)
    ctx = context_for(cfg, 1, 40)
    per_length = InferenceOptions(logit_scaling="per_length", logit_scaling_train_length=4)
    rope, nope, swa = RopeAttention(cfg, 0), Attention(cfg, 0), SlidingWindowAttention(cfg, 0)
    torch.testing.assert_close(rope.logit_scale(ctx), query_logit_scale(cfg, ctx.options, ctx.position_ids, nope=True))
    assert rope.logit_scale(dataclasses.replace(ctx, options=per_length)) is None
    assert nope.logit_scale(dataclasses.replace(ctx, options=per_length)) is not None
    assert swa.logit_scale(ctx) is None
    assert rope.window(InferenceOptions()) is None and rope.window(InferenceOptions(eme_window=64)) == 64
    assert nope.window(InferenceOptions(eme_window=64)) is None
    assert swa.window(InferenceOptions(eme_window=64)) == cfg.swa_window


def test_per_length_scaling_is_log_length_over_log_train_length():
    """docs/method.md, "EME": c(L) = log L / log L0 for L >= L0; at L0 = 4096, L = 65536 the multiplier is 4/3."""
    cfg = config(layer_types=["attention"])
    options = InferenceOptions(logit_scaling="per_length", logit_scaling_train_length=4096)
    positions = torch.tensor([[0, 100, 4095, 65535]])
    scale = query_logit_scale(cfg, options, positions, nope=True)
    assert scale[0, :3].tolist() == [1.0, 1.0, 1.0]
    assert scale[0, 3].item() == pytest.approx(4 / 3, rel=1e-15)
    scaled = config(layer_types=["attention"], attention_logit_scaling_a=500.0)
    per_query = query_logit_scale(scaled, InferenceOptions(), positions, nope=True)
    assert per_query[0, 3].item() == pytest.approx(math.log(65535 + 500) / math.log(500), rel=1e-15)
    # the options' a replaces the model's; "off" turns the model's off
    other = query_logit_scale(scaled, InferenceOptions(logit_scaling_a=20.0), positions, nope=True)
    assert other[0, 3].item() == pytest.approx(math.log(65535 + 20) / math.log(20), rel=1e-15)
    assert query_logit_scale(scaled, InferenceOptions(logit_scaling="off"), positions, nope=True) is None
    assert query_logit_scale(config(layer_types=["attention"]), InferenceOptions(), positions, nope=True) is None


def test_gate_ranges():
    cfg = config(layer_types=["gla"])
    x = torch.randn(2, 9, 32)
    gla = GatedLinearAttention(cfg, 0)
    g = gla.token_inputs(x, context_for(cfg, 2, 9))["g"]
    assert g.dtype == torch.float32 and bool((g <= 0).all()) and bool((g > -torch.inf).all())
    gdn = GatedDeltaNet(cfg, 0)
    context = context_for(cfg, 2, 9)
    q, k, _ = gdn.project(x, context)
    g, beta = gdn.token_inputs(x, context).values()
    assert torch.allclose(k.norm(dim=-1), torch.ones(2, 9, 4), atol=1e-3)
    assert bool((g < 0).all()) and bool(((beta > 0) & (beta < 1)).all())
    a = gdn.A_log.exp()
    assert bool(((a > 0) & (a <= 16)).all())
