"""The hybrid family on CUDA: the fla/SDPA path against the reference path, with and without EME, and cached
decoding on GPU."""

import copy

import pytest
import torch

from hyla import HypeNetConfig, HypeNetForCausalLM, InferenceOptions
from hyla.ops.dispatch import use_backend

pytestmark = pytest.mark.gpu

LAYER_TYPES = ["gla", "attention", "gdn", "swa", "hh_gla", "attention_rope", "hh_gdn", "hh_lightning"]
EME = InferenceOptions(eme_window=128, eme_stride=32, logit_scaling="per_length", logit_scaling_train_length=128)


def model(dtype, eme=False, rope=False):
    """rope: `gla_rope` and `gdn_rope` on (the GLA and GDN layers, head-wise ones too, rotate q and k before fla's
    kernels)."""
    torch.manual_seed(0)
    config = HypeNetConfig(
        vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=len(LAYER_TYPES),
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, layer_types=LAYER_TYPES, swa_window=64,
        headwise_ratio="1:1", attention_output_gate=True, gla_rope=rope, gdn_rope=rope,
    )
    hybrid = HypeNetForCausalLM(config).to("cuda", dtype).eval()
    if eme:
        hybrid.inference_options = EME
    return hybrid


# fp32: TF32 matmuls in the chunk kernels over 8 layers (the float32 torch path is the reference itself).
# bf16: both paths round, at different points; each is measured against the float32 torch path, and the fla path may
# not add more than half again the torch path's own bf16 error (the rule of hyla.bench.model.check_engine), nor
# exceed `tol` where that is larger. Comparing the two bf16 paths with each other counted the rounding twice.
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-3), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("eme", [False, True])
def test_fla_model_logits_match_reference(dtype, tol, eme):
    assert_fla_logits_match_reference(model(dtype, eme), tol)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-3), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("eme", [False, True])
def test_fla_model_logits_with_rnn_rope_match_reference(dtype, tol, eme):
    assert_fla_logits_match_reference(model(dtype, eme, rope=True), tol)


def assert_fla_logits_match_reference(m, tol):
    tokens = torch.randint(0, 1000, (2, 333), device="cuda")
    with torch.no_grad():
        with use_backend("torch"):
            expected = copy.deepcopy(m).float()(tokens, use_cache=False).logits.float()
            ref = m(tokens, use_cache=False).logits.float()
        with use_backend("fla"):
            fast = m(tokens, use_cache=False).logits.float()
    own = ((ref - expected).norm() / expected.norm()).item()
    error = ((fast - expected).norm() / expected.norm()).item()
    assert error <= max(tol, 1.5 * own), f"fla path {error:.3g}; torch path in {m.dtype}: {own:.3g}"


@pytest.mark.parametrize("eme", [False, True])
def test_gpu_cached_decode_matches_full_forward(eme):
    assert_cached_decode_matches_full_forward(model(torch.float32, eme))


@pytest.mark.parametrize("eme", [False, True])
def test_gpu_cached_decode_with_rnn_rope_matches_full_forward(eme):
    assert_cached_decode_matches_full_forward(model(torch.float32, eme, rope=True))


def assert_cached_decode_matches_full_forward(m):
    tokens = torch.randint(0, 1000, (2, 200), device="cuda")
    with torch.no_grad():
        full = m(tokens, use_cache=False).logits
        out = m(tokens[:, :150], use_cache=True)
        pieces, cache = [out.logits], out.past_key_values
        for t in range(150, 200):
            out = m(tokens[:, t : t + 1], past_key_values=cache, use_cache=True)
            pieces.append(out.logits)
    assert ((torch.cat(pieces, 1) - full).norm() / full.norm()).item() <= 2e-3


def test_training_step_gradients_are_finite():
    m = model(torch.bfloat16).train()
    tokens = torch.randint(0, 1000, (2, 257), device="cuda")
    loss = m(tokens, labels=tokens, use_cache=False).loss
    loss.backward()
    for name, param in m.named_parameters():
        assert param.grad is not None and torch.isfinite(param.grad).all(), name
