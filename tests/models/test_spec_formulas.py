"""Each mixer recomputed by hand from its weights with the equations of docs/method.md ("Lightning layer", "Attention
layer and logit scaling"): decay, scaling, norm and gate placement."""

import math

import torch

from hyla import HypeNetConfig, HypeNetForCausalLM


def _rms(x, weight, eps):
    return weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def _rope(x, positions, theta):
    dim = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    angles = positions[:, None].double() * inv_freq[None]
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    rotated = torch.cat([-x[..., dim // 2 :], x[..., : dim // 2]], -1)
    return x * cos[:, None] + rotated * sin[:, None]


def _model(layer_types):
    torch.manual_seed(0)
    config = HypeNetConfig(
        vocab_size=50, hidden_size=32, intermediate_size=40, num_hidden_layers=len(layer_types),
        num_attention_heads=4, num_key_value_heads=2, head_dim=8, layer_types=layer_types,
        attention_logit_scaling_a=8.0, attention_output_gate=True, attention_qk_norm=True,
        rope_parameters={"rope_type": "default", "rope_theta": 1000.0},
    )
    model = HypeNetForCausalLM(config).double().eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name or name.endswith("g_proj.bias"):
                p.uniform_(0.5, 1.5)
    return model


def test_lightning_layer_matches_spec_equations():
    model = _model(["lightning"])
    layer = model.model.layers[0].mixer
    eps = model.config.rms_norm_eps
    x = torch.randn(1, 21, 32, dtype=torch.float64)
    length, heads, dim = 21, 4, 8
    pos = torch.arange(length)
    q = _rms(layer.q_proj(x)[0].view(length, heads, dim), layer.q_norm.weight, eps)
    k = _rms(layer.k_proj(x)[0].view(length, heads, dim), layer.k_norm.weight, eps)
    v = layer.v_proj(x)[0].view(length, heads, dim)
    q, k = _rope(q, pos, 1000.0), _rope(k, pos, 1000.0) / math.sqrt(dim)
    out = torch.zeros(length, heads, dim, dtype=torch.float64)
    for h in range(heads):
        gamma = math.exp(-(2 ** (-8 * (h + 1) / heads)))
        state = torch.zeros(dim, dim, dtype=torch.float64)
        for t in range(length):
            state = gamma * state + torch.outer(k[t, h], v[t, h])
            out[t, h] = q[t, h] @ state
    out = _rms(out.reshape(length, heads * dim), layer.o_norm.weight, eps)
    out = out * torch.sigmoid(layer.z_proj(x)[0])
    expected = layer.o_proj(out)
    context = model.model._context(x, None, None, None, None)
    assert torch.allclose(layer(x, context)[0], expected, atol=1e-10)


def test_attention_layer_is_nope_with_query_scaling_and_gate():
    model = _model(["attention"])
    layer = model.model.layers[0].mixer
    eps, a = model.config.rms_norm_eps, 8.0
    x = torch.randn(1, 13, 32, dtype=torch.float64)
    length, heads, kv_heads, dim = 13, 4, 2, 8
    q = _rms(layer.q_proj(x)[0].view(length, heads, dim), layer.q_norm.weight, eps)
    k = _rms(layer.k_proj(x)[0].view(length, kv_heads, dim), layer.k_norm.weight, eps)
    v = layer.v_proj(x)[0].view(length, kv_heads, dim)
    s = torch.log(torch.arange(length, dtype=torch.float64) + a) / math.log(a)
    out = torch.zeros(length, heads, dim, dtype=torch.float64)
    for h in range(heads):
        kv = h // (heads // kv_heads)
        logits = (s[:, None] * q[:, h]) @ k[:, kv].T / math.sqrt(dim)
        logits = logits.masked_fill(torch.ones(length, length).triu(1).bool(), float("-inf"))
        out[:, h] = torch.softmax(logits, -1) @ v[:, kv]
    gate = torch.sigmoid(x[0] @ layer.g_proj.weight.T + layer.g_proj.bias)
    out = out.reshape(length, heads * dim) * gate
    expected = layer.o_proj(out)
    context = model.model._context(x, None, None, None, None)
    assert torch.allclose(layer(x, context)[0], expected, atol=1e-10)


def test_new_attention_gate_starts_near_one():
    model = _model(["attention"])
    fresh = HypeNetForCausalLM(model.config)
    gate = fresh.model.layers[0].mixer.g_proj
    assert torch.all(gate.weight == 0)
    assert torch.allclose(torch.sigmoid(gate.bias), torch.tensor(1 / (1 + math.exp(-4.0))))
