"""α~ in closed form against its definition: the spectral norm of the value-path Jacobian by autograd (float64)."""

import math

import pytest
import torch
from torch.func import jacrev
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.models.llama import modeling_llama
from transformers.models.qwen3 import modeling_qwen3

import hyla.layers.attention as attention_layer
import hyla.layers.lightning as lightning_layer
from hyla import HypeNetConfig, HypeNetForCausalLM
from hyla.analysis.capture import capture_heads, mixer_layers
from hyla.analysis.concentration import (
    HeadInputs,
    concentration,
    concentration_blocks,
    normalized_entropy,
    top_k_hit_rate,
)
from hyla.ops.attention.reference import softmax_attention_reference

# float64 end to end: the closed form and autograd differ only by rounding (~1e-16 relative); 1e-10 leaves room for
# sums over a few dozen terms and still catches any wrong position, head or decay exponent (errors ≥ 1e-3).
ATOL = 1e-10
# Weights of transformers' eager attention carry float32 rounding (≤ ~6e-8 on weights ≤ 1).
HF_FLOAT32_SOFTMAX_ATOL = 1e-6
LENGTH = 11


def jacobian_concentration(values_to_output, v: torch.Tensor, num_heads: int) -> torch.Tensor:
    """α~ [B, H, T, T] by definition: ‖∂o_t/∂v_s‖₂ normalised over s, from autograd with q and k held fixed.

    values_to_output: v [B, T, Hk, D] -> o [B, T, H, D].
    """
    jacobian = jacrev(values_to_output)(v)  # [B, T, H, D, B, T, Hk, D]
    batch, length, num_kv_heads = v.shape[:3]
    groups = num_heads // num_kv_heads
    rows = []
    for b in range(batch):
        heads = []
        for h in range(num_heads):
            blocks = jacobian[b, :, h, :, b, :, h // groups, :].permute(0, 2, 1, 3)  # [T, S, D, D]
            heads.append(torch.linalg.matrix_norm(blocks, ord=2))
        rows.append(torch.stack(heads))
    norms = torch.stack(rows)
    return norms / norms.sum(-1, keepdim=True)


def tiny_hypenet(seed: int, layer_types=("lightning", "attention"), **overrides) -> HypeNetForCausalLM:
    """A float64 HypeNet of `layer_types` with norm weights away from 1 (and GDN decays that keep every key's c well
    above 0: A in [0.05, 0.5] rather than fla's U(0, 16))."""
    config = HypeNetConfig(**{
        **dict(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=len(layer_types),
               num_attention_heads=4, num_key_value_heads=2, head_dim=8, layer_types=list(layer_types),
               attention_logit_scaling_a=16.0, attention_qk_norm=True, attention_output_gate=True),
        **overrides,
    })
    torch.manual_seed(seed)
    model = HypeNetForCausalLM(config).double().eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.uniform_(0.5, 1.5)
            if name.endswith("A_log"):
                parameter.copy_(torch.empty_like(parameter).uniform_(0.05, 0.5).log())
    return model


def record_calls(monkeypatch, module, name: str) -> list:
    calls, original = [], getattr(module, name)

    def recorder(*args, **kwargs):
        calls.append((args, kwargs))
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, recorder)
    return calls


def captured_layers(model, input_ids) -> list[HeadInputs]:
    layers = []
    capture_heads(model, input_ids, lambda layer, inputs: layers.append(inputs))
    return layers


def all_positions() -> torch.Tensor:
    return torch.arange(LENGTH)


# jacrev through CPU SDPA falls back to a per-sample loop and says so; only speed is affected.
@pytest.mark.filterwarnings("ignore:There is a performance drop")
def test_lightning_and_attention_closed_forms_equal_jacobian(monkeypatch):
    model = tiny_hypenet(0)
    lightning_calls = record_calls(monkeypatch, lightning_layer, "lightning_attention")
    attention_calls = record_calls(monkeypatch, attention_layer, "softmax_attention")
    input_ids = torch.randint(0, 61, (2, LENGTH), generator=torch.Generator().manual_seed(1))
    lightning_inputs, attention_inputs = captured_layers(model, input_ids)

    (q, k, v), kwargs = lightning_calls[0]
    expected = jacobian_concentration(lambda values: lightning_layer.lightning_attention(q, k, values, **kwargs)[0],
                                      v, num_heads=4)
    assert lightning_inputs.form == "decay"
    torch.testing.assert_close(concentration(lightning_inputs, all_positions()), expected, atol=ATOL, rtol=0)

    (q, k, v), kwargs = attention_calls[0]
    assert k.shape[2] == 2, "the attention layer must be GQA for this test"
    expected = jacobian_concentration(lambda values: attention_layer.softmax_attention(q, k, values, **kwargs),
                                      v, num_heads=4)
    torch.testing.assert_close(concentration(attention_inputs, all_positions()), expected, atol=ATOL, rtol=0)


HF_FAMILIES = {
    "llama": (LlamaConfig, LlamaForCausalLM, modeling_llama),
    "qwen3": (Qwen3Config, Qwen3ForCausalLM, modeling_qwen3),  # with per-head q/k RMSNorm
}


def tiny_hf_model(family: str, seed: int):
    config_class, model_class, _ = HF_FAMILIES[family]
    config = config_class(vocab_size=61, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, head_dim=8, rope_theta=100.0)
    config._attn_implementation = "eager"
    torch.manual_seed(seed)
    model = model_class(config).double().eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                parameter.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("family", sorted(HF_FAMILIES))
def test_hf_attention_closed_form_equals_jacobian_and_attention_weights(monkeypatch, family):
    model = tiny_hf_model(family, 0)
    calls = record_calls(monkeypatch, HF_FAMILIES[family][2], "eager_attention_forward")
    input_ids = torch.randint(0, 61, (1, LENGTH), generator=torch.Generator().manual_seed(2))
    captured = captured_layers(model, input_ids)
    monkeypatch.undo()
    with torch.no_grad():
        weights = model(input_ids, output_attentions=True).attentions
    for layer, ((module, q, k, v, mask), kwargs) in enumerate(calls):
        alpha = concentration(captured[layer], all_positions())
        # transformers' eager attention runs its softmax in float32 even for float64 inputs.
        torch.testing.assert_close(alpha, weights[layer], atol=HF_FLOAT32_SOFTMAX_ATOL, rtol=0)
        # The Jacobian, in float64, of softmax attention over the q and k that transformers' kernel received.
        expected = jacobian_concentration(
            lambda values: softmax_attention_reference(q.transpose(1, 2), k.transpose(1, 2), values,
                                                       scale=kwargs["scaling"]),
            v.transpose(1, 2), num_heads=4,
        )
        torch.testing.assert_close(alpha, expected, atol=ATOL, rtol=0)


def random_inputs(form: str, *, window: int | None = None, seed: int = 0) -> HeadInputs:
    generator = torch.Generator().manual_seed(seed)
    q = torch.randn(1, LENGTH, 4, 8, generator=generator, dtype=torch.float64)
    k = torch.randn(1, LENGTH, 2, 8, generator=generator, dtype=torch.float64)
    log_decay = -torch.rand(4, generator=generator, dtype=torch.float64)
    return HeadInputs(form, q, k, scale=8**-0.5, log_decay=log_decay, window=window)


def test_sliding_window_softmax_equals_jacobian():
    inputs = random_inputs("softmax", window=4)
    v = torch.randn(1, LENGTH, 2, 8, dtype=torch.float64)
    keys = torch.arange(LENGTH)
    in_window = (keys[:, None] - keys[None, :] < 4)[None, None]
    expected = jacobian_concentration(
        lambda values: softmax_attention_reference(inputs.q, inputs.k, values, scale=inputs.scale,
                                                   attention_mask=in_window),
        v, num_heads=4,
    )
    torch.testing.assert_close(concentration(inputs, all_positions()), expected, atol=ATOL, rtol=0)


def test_blocks_of_sampled_queries_equal_the_full_rows():
    inputs = random_inputs("decay")
    full = concentration(inputs, all_positions())
    positions = torch.tensor([1, 4, 5, 9, 10])
    for block, alpha in concentration_blocks(inputs, positions, block_size=2):
        torch.testing.assert_close(alpha, full[:, :, block, : alpha.shape[-1]], atol=ATOL, rtol=0)
        assert torch.all(full[:, :, block, alpha.shape[-1]:] == 0)


def test_decay_form_stays_finite_far_beyond_underflow():
    # exp(-0.7 * 3000) underflows float64; the log-space form must still give rows that sum to 1.
    length = 3000
    q = torch.randn(1, length, 2, 4, dtype=torch.float64)
    inputs = HeadInputs("decay", q, q.clone(), scale=0.5, log_decay=torch.tensor([-0.7, -0.001], dtype=torch.float64))
    alpha = concentration(inputs, torch.tensor([length - 1]))
    torch.testing.assert_close(alpha.sum(-1), torch.ones(1, 2, 1, dtype=torch.float64))
    assert alpha[0, 0, 0, 0] == 0 and alpha[0, 1, 0, 0] > 0


def test_uniform_head_has_normalized_entropy_one_and_a_one_hot_head_zero():
    positions = torch.tensor([3, 7])
    uniform = torch.zeros(2, 8, dtype=torch.float64)
    uniform[0, :4], uniform[1, :] = 0.25, 0.125
    entropy = normalized_entropy(uniform, positions, length=8, normalizer="visible")
    torch.testing.assert_close(entropy, torch.ones(2, dtype=torch.float64))
    by_length = normalized_entropy(uniform, positions, length=8, normalizer="length")
    torch.testing.assert_close(by_length, torch.tensor([math.log(4) / math.log(8), 1.0], dtype=torch.float64))
    one_hot = torch.eye(8, dtype=torch.float64)[positions]
    assert torch.all(normalized_entropy(one_hot, positions, length=8) == 0)


def test_head_attending_only_to_the_needle_hits_every_needle_token():
    needle = torch.tensor([300, 301, 302, 303, 304, 305, 306])
    length = 2000
    generator = torch.Generator().manual_seed(3)
    k = 0.1 * torch.randn(1, length, 1, 16, generator=generator, dtype=torch.float64)
    direction = torch.zeros(16, dtype=torch.float64)
    direction[0] = 1.0
    k[0, needle, 0] += 3.0 * direction
    q = torch.zeros(1, length, 2, 16, dtype=torch.float64)
    q[0, -1, 0] = 20.0 * direction  # head 0 looks for the needle
    q[0, -1, 1] = 20.0 * torch.randn(16, generator=generator, dtype=torch.float64).abs() * (1 - direction)
    for form in ("softmax", "decay"):
        inputs = HeadInputs(form, q, k, scale=0.25, log_decay=torch.zeros(2, dtype=torch.float64))
        alpha = concentration(inputs, torch.tensor([length - 1]))[0, :, 0]
        hit_rate = top_k_hit_rate(alpha, needle, top_k=64)
        assert hit_rate[0] == 1.0
        assert hit_rate[1] < 0.5


def test_hit_rate_counts_only_top_k_and_never_zero_weights():
    alpha = torch.tensor([[0.5, 0.3, 0.2, 0.0, 0.0]])
    assert top_k_hit_rate(alpha, torch.tensor([0, 2]), top_k=2).item() == 0.5
    assert top_k_hit_rate(alpha, torch.tensor([3, 4]), top_k=5).item() == 0.0
    with pytest.raises(ValueError):
        top_k_hit_rate(alpha, torch.tensor([], dtype=torch.long), top_k=2)


def test_a_mixer_without_a_registered_capture_is_one_clear_error():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.mixer = torch.nn.Linear(4, 4)

    class Decoder(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = torch.nn.ModuleList([Block()])

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = Decoder()
            self.config = None

    with pytest.raises(ValueError, match="no concentration capture for mixer Linear"):
        mixer_layers(Model())
