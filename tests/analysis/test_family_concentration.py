"""α~ of the family's layers (GLA, GDN, SWA, RoPE attention) and under the inference options (SWLA, logit scaling
c(L)) against the Jacobian, by autograd, of the computation each layer actually runs (float64)."""

import importlib
import math

import pytest
import torch
from test_concentration import (
    ATOL,
    LENGTH,
    all_positions,
    captured_layers,
    jacobian_concentration,
    record_calls,
    tiny_hypenet,
)

import hyla.layers.attention as attention_layer
import hyla.layers.lightning as lightning_layer
import hyla.layers.linear_mixer as linear_mixer
from hyla import HypeNetForCausalLM, InferenceOptions
from hyla.analysis.concentration import HeadInputs, concentration, concentration_blocks
from hyla.layers.rope import RotaryEmbedding, apply_rotary
from hyla.ops.gdn import gdn_attention
from hyla.ops.gla import gla_attention
from hyla.ops.lightning import lightning_attention
from hyla.ops.swla import serving_window_start

LAYER_TYPES = ["lightning", "gla", "gdn", "swa", "attention_rope", "attention"]
LINEAR_OPS = {"lightning": lightning_attention, "gla": gla_attention, "gdn": gdn_attention}
FORMS = {"lightning": "decay", "gla": "gated", "gdn": "delta", "swa": "softmax", "attention_rope": "softmax",
         "attention": "softmax"}
SWA_WINDOW = 4
# EME with windows that neither divide the length nor equal the stride, and c(L) > 1 from L = 5 on.
EME = InferenceOptions(logit_scaling="per_length", logit_scaling_train_length=4, eme_window=5, eme_stride=2)
OPTIONS = {"default": InferenceOptions(), "eme+c(L)": EME}
# The module, not the function of the same name that hyla.analysis exports.
concentration_module = importlib.import_module("hyla.analysis.concentration")


def tiny_family(seed: int, layer_types: list[str] = LAYER_TYPES, **overrides) -> HypeNetForCausalLM:
    # No per-query scaling s_t, so that c(L) is the only scaling under the options; GLA gates strong enough to shape
    # α~ over 11 tokens (the default normalizer 16 leaves its decay near 1).
    return tiny_hypenet(seed, layer_types, attention_logit_scaling_a=None, swa_window=SWA_WINDOW,
                        gla_gate_low_rank_dim=4, gla_gate_logit_normalizer=2.0, **overrides)


def record_layer_calls(monkeypatch):
    """Record what each layer hands its computation: run_linear_op (the op, or SWLA around it, under EME) for the
    linear mixers, softmax_attention for the softmax ones; returns (calls, the unwrapped functions)."""
    originals = {"run_linear_op": linear_mixer.run_linear_op, "softmax_attention": attention_layer.softmax_attention}
    calls = {
        "lightning": record_calls(monkeypatch, lightning_layer, "run_linear_op"),
        "gated": record_calls(monkeypatch, linear_mixer, "run_linear_op"),
        "softmax": record_calls(monkeypatch, attention_layer, "softmax_attention"),
    }
    return calls, originals


def expected_alpha(layer_type: str, call, originals) -> torch.Tensor:
    args, kwargs = call
    if layer_type in LINEAR_OPS:
        op, layer_idx, q, k, v, context = args
        assert op is LINEAR_OPS[layer_type]

        def values_to_output(values):
            return originals["run_linear_op"](op, layer_idx, q, k, values, context, **kwargs)
    else:
        q, k, v = args

        def values_to_output(values):
            return originals["softmax_attention"](q, k, values, **kwargs)
    return jacobian_concentration(values_to_output, v, num_heads=q.shape[2])


# jacrev through CPU SDPA falls back to a per-sample loop and says so; only speed is affected.
@pytest.mark.filterwarnings("ignore:There is a performance drop")
@pytest.mark.parametrize("options", list(OPTIONS))
def test_every_layer_closed_form_equals_its_jacobian(monkeypatch, options):
    model = tiny_family(0)
    model.inference_options = OPTIONS[options]
    calls, originals = record_layer_calls(monkeypatch)
    input_ids = torch.randint(0, 61, (2, LENGTH), generator=torch.Generator().manual_seed(1))
    captured = captured_layers(model, input_ids)
    monkeypatch.undo()
    layer_calls = [calls["lightning"][0], *calls["gated"], *calls["softmax"]]
    assert [inputs.form for inputs in captured] == [FORMS[kind] for kind in LAYER_TYPES]
    for layer_type, inputs, call in zip(LAYER_TYPES, captured, layer_calls):
        alpha = concentration(inputs, all_positions())
        torch.testing.assert_close(alpha, expected_alpha(layer_type, call, originals), atol=ATOL, rtol=0,
                                   msg=lambda text, layer_type=layer_type: f"{layer_type}: {text}")


@pytest.mark.parametrize("layer_type", LAYER_TYPES)
def test_the_options_reach_alpha(layer_type):
    # One layer, so that its input is the same with and without the options.
    model = tiny_family(0, [layer_type])
    input_ids = torch.randint(0, 61, (1, LENGTH), generator=torch.Generator().manual_seed(1))
    (plain,) = [concentration(inputs, all_positions()) for inputs in captured_layers(model, input_ids)]
    model.inference_options = EME
    (eme,) = [concentration(inputs, all_positions()) for inputs in captured_layers(model, input_ids)]
    positions, keys = all_positions()[:, None], torch.arange(LENGTH)[None, :]
    if layer_type in LINEAR_OPS:
        # SWLA: the window serving t holds keys start(t)..t only.
        before_window = keys < serving_window_start(positions, window=EME.eme_window, stride=EME.eme_stride)
        assert torch.all(eme[..., before_window] == 0) and torch.all(plain[..., before_window] > 0)
        window = keys >= serving_window_start(positions, window=EME.eme_window, stride=EME.eme_stride)
        assert torch.all(eme[..., window & (keys <= positions)] > 0)
    elif layer_type == "attention_rope":
        # EME turns RoPE full attention into sliding-window attention of W keys.
        beyond = keys <= positions - EME.eme_window
        assert torch.all(eme[..., beyond] == 0) and torch.all(plain[..., beyond] > 0)
    elif layer_type == "swa":
        torch.testing.assert_close(eme, plain, atol=0, rtol=0)  # it keeps its own window
        assert torch.all(plain[..., keys <= positions - SWA_WINDOW] == 0)
    else:
        # c(L) scales the NoPE logits from L = t + 1 > L0 on and leaves the positions before alone.
        changed = (eme - plain).abs().amax(dim=(0, 1, 3)) > 1e-6
        assert changed.tolist() == [t + 1 > EME.logit_scaling_train_length for t in range(LENGTH)]


@pytest.mark.parametrize("layer_type", ["gla", "gdn"])
def test_the_capture_takes_the_rotated_queries_and_keys_of_rnn_rope(layer_type):
    """With `gla_rope` / `gdn_rope` the captured q and k are the model's without RoPE (same weights) rotated by
    `hyla.layers.rope` at positions 0..T-1 (GDN's L2 norm commutes with the rotation), and α~ changes."""
    input_ids = torch.randint(0, 61, (2, LENGTH), generator=torch.Generator().manual_seed(1))
    (plain,) = captured_layers(tiny_family(0, [layer_type]), input_ids)
    model = tiny_family(0, [layer_type], **{f"{layer_type}_rope": True})
    (rotated,) = captured_layers(model, input_ids)
    cos, sin = RotaryEmbedding(model.config)(torch.arange(LENGTH)[None].expand(2, -1), torch.float64)
    for name in ("q", "k"):
        torch.testing.assert_close(getattr(rotated, name), apply_rotary(getattr(plain, name), cos, sin), rtol=0,
                                   atol=1e-12)
    changed = concentration(rotated, all_positions()) - concentration(plain, all_positions())
    assert changed.abs().max() > 1e-3


def random_recurrent_inputs(form: str, length: int = LENGTH, **fields) -> HeadInputs:
    generator = torch.Generator().manual_seed(4)
    q = torch.randn(1, length, 3, 8, generator=generator, dtype=torch.float64)
    k = torch.nn.functional.normalize(torch.randn(1, length, 3, 8, generator=generator, dtype=torch.float64), dim=-1)
    gate_shape = (1, length, 3, 8) if form == "gated" else (1, length, 3)
    log_gates = -torch.rand(gate_shape, generator=generator, dtype=torch.float64)
    beta = torch.rand(1, length, 3, generator=generator, dtype=torch.float64)
    return HeadInputs(form, q, k, scale=8**-0.5, log_gates=log_gates, beta=beta, **fields)


@pytest.mark.parametrize("form", ["gated", "delta"])
def test_chunks_and_blocks_of_queries_do_not_change_alpha(monkeypatch, form):
    inputs = random_recurrent_inputs(form, swla_window=6, swla_stride=4)
    full = concentration(inputs, all_positions())
    monkeypatch.setattr(concentration_module, "DELTA_CHUNK_SIZE", 3)
    monkeypatch.setattr(concentration_module, "GATED_CHUNK_ELEMENTS", 2 * 3 * 8)
    positions = torch.tensor([1, 4, 5, 9, 10])
    for block, alpha in concentration_blocks(inputs, positions, block_size=2):
        torch.testing.assert_close(alpha, full[:, :, block, : alpha.shape[-1]], atol=ATOL, rtol=0)
        assert torch.all(full[:, :, block, alpha.shape[-1]:] == 0)


@pytest.mark.parametrize("form", ["gated", "delta"])
def test_recurrent_forms_stay_finite_far_beyond_underflow(form):
    # Products of decays over 3000 tokens reach exp(-2000): the forms keep log-weights, so rows still sum to 1.
    length = 3000
    inputs = random_recurrent_inputs(form, length=length)
    inputs.log_gates = torch.full_like(inputs.log_gates, -0.7)
    inputs.log_gates[:, :, 2] = -0.001  # head 2 forgets slowly
    inputs.beta = torch.full_like(inputs.beta, 0.01)
    alpha = concentration(inputs, torch.tensor([length - 1]))
    torch.testing.assert_close(alpha.sum(-1), torch.ones(1, 3, 1, dtype=torch.float64))
    assert alpha[0, 0, 0, 0] == 0 and alpha[0, 2, 0, 0] > 0
    assert math.isfinite(alpha.sum().item())


def test_recurrent_forms_refuse_shared_key_heads():
    inputs = random_recurrent_inputs("gated")
    inputs.k = inputs.k[:, :, :1]
    with pytest.raises(ValueError, match="one key head per query head"):
        concentration(inputs, all_positions())
