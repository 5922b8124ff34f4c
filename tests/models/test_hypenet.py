"""HypeNet model invariants on CPU in float32: cache continuation, batched left-padded generation, save/load."""

import random

import pytest
import torch
from huggingface_hub.errors import StrictDataclassClassValidationError
from transformers import AutoConfig, AutoModelForCausalLM

from hyla import HybridCache, HypeNetConfig, HypeNetForCausalLM

# Chunked prefill + decode reorders float32 sums; 1e-4 on logits of a tiny model is far above that rounding and
# far below any real error (a wrong position or a leaked state moves logits by ~1e-1).
ATOL = 1e-4


def random_config(seed: int, **overrides) -> HypeNetConfig:
    rng = random.Random(seed)
    num_layers = rng.randint(2, 5)
    layer_types = [rng.choice(["lightning", "attention"]) for _ in range(num_layers)]
    layer_types[rng.randrange(num_layers)] = "lightning"
    layer_types[rng.randrange(num_layers)] = "attention"
    heads, kv_heads = rng.choice([(4, 2), (4, 4), (6, 2), (2, 1)])
    kwargs = dict(
        vocab_size=97,
        hidden_size=heads * 8,
        intermediate_size=48,
        num_hidden_layers=num_layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        head_dim=8,
        layer_types=layer_types,
        attention_logit_scaling_a=rng.choice([None, 16.0]),
        attention_qk_norm=rng.random() < 0.5,
        attention_output_gate=rng.random() < 0.5,
        qkv_bias=rng.random() < 0.3,
        tie_word_embeddings=rng.random() < 0.5,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=2,
    )
    kwargs.update(overrides)
    return HypeNetConfig(**kwargs)


def make_model(seed: int, **overrides) -> HypeNetForCausalLM:
    torch.manual_seed(seed)
    model = HypeNetForCausalLM(random_config(seed, **overrides)).eval()
    # Randomise norms and gate biases too, so that a wrong placement cannot hide behind weights of one.
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("g_proj.bias"):
                param.uniform_(0.5, 1.5)
    return model


@pytest.mark.parametrize("seed", range(6))
def test_chunked_prefill_and_decode_equal_full_forward(seed):
    model = make_model(seed)
    tokens = torch.randint(3, 97, (2, 150), generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        full = model(tokens, use_cache=False).logits
        cache = HybridCache(model.config.layer_types)
        pieces = []
        for start, end in [(0, 70), (70, 130)]:
            pieces.append(model(tokens[:, start:end], past_key_values=cache, use_cache=True).logits)
        for t in range(130, 150):
            pieces.append(model(tokens[:, t : t + 1], past_key_values=cache, use_cache=True).logits)
    assert cache.get_seq_length() == 150
    assert (torch.cat(pieces, 1) - full).abs().max().item() <= ATOL


def left_pad(prompts, pad_id=0):
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id)
    mask = torch.zeros(len(prompts), width, dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    return ids, mask


@pytest.mark.parametrize("seed", range(4))
def test_left_padded_greedy_generation_equals_each_prompt_alone(seed):
    model = make_model(seed)
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 97) for _ in range(n)] for n in (5, 17, 1, 70)]
    ids, mask = left_pad(prompts)
    kwargs = dict(max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0)
    batched = model.generate(ids, attention_mask=mask, **kwargs)[:, ids.shape[1] :]
    for row, prompt in enumerate(prompts):
        alone = model.generate(torch.tensor([prompt]), **kwargs)[0, len(prompt) :]
        assert batched[row].tolist() == alone.tolist(), f"row {row}"


def test_padding_does_not_leak_into_recurrent_state():
    model = make_model(7, layer_types=["lightning", "attention", "lightning"], num_hidden_layers=3)
    prompt = torch.randint(3, 97, (1, 9))
    padded = torch.cat([torch.full((1, 6), 0), prompt], 1)
    mask = torch.cat([torch.zeros(1, 6, dtype=torch.long), torch.ones(1, 9, dtype=torch.long)], 1)
    # Real token embeddings at the padding positions: only the mask may keep them out.
    padded[0, :6] = torch.randint(3, 97, (6,))
    with torch.no_grad():
        alone = model(prompt, use_cache=True).past_key_values
        with_pad = model(padded, attention_mask=mask, use_cache=True).past_key_values
    for layer in (0, 2):
        assert torch.allclose(alone.recurrent_state(layer), with_pad.recurrent_state(layer), atol=1e-5)


def test_sampling_generation_is_seeded_and_batched():
    model = make_model(3)
    ids, mask = left_pad([[5, 6, 7], [8, 9, 10, 11, 12]])
    kwargs = dict(max_new_tokens=8, do_sample=True, top_k=20, temperature=0.9, pad_token_id=0, eos_token_id=None)
    torch.manual_seed(0)
    first = model.generate(ids, attention_mask=mask, **kwargs)
    torch.manual_seed(0)
    second = model.generate(ids, attention_mask=mask, **kwargs)
    assert first.shape == (2, ids.shape[1] + 8)
    assert torch.equal(first, second)


def test_save_load_round_trip_is_bit_exact(tmp_path):
    model = make_model(11, attention_logit_scaling_a=500.0)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    config = AutoConfig.from_pretrained(tmp_path)
    assert config.model_type == "hypenet" and config.layer_types == model.config.layer_types
    assert config.attention_logit_scaling_a == 500.0
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    assert isinstance(loaded, HypeNetForCausalLM)
    tokens = torch.randint(3, 97, (2, 40))
    with torch.no_grad():
        assert torch.equal(model(tokens).logits, loaded(tokens).logits)
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, loaded.state_dict()[name]), name


def test_packed_documents_equal_separate_forwards():
    model = make_model(5)
    docs = [torch.randint(3, 97, (1, n)) for n in (9, 30, 4)]
    cu = torch.tensor([0, 9, 39, 43])
    with torch.no_grad():
        packed = model(torch.cat(docs, 1), cu_seqlens=cu, use_cache=False).logits
        for doc, start in zip(docs, cu[:-1].tolist()):
            alone = model(doc, use_cache=False).logits
            assert (packed[:, start : start + doc.shape[1]] - alone).abs().max().item() <= ATOL


def test_config_rejects_bad_layer_types():
    # transformers wraps validation errors in its strict-dataclass error, keeping our message.
    config_errors = (ValueError, StrictDataclassClassValidationError)
    with pytest.raises(config_errors, match="unknown layer types"):
        HypeNetConfig(num_hidden_layers=2, layer_types=["lightning", "mamba"])
    with pytest.raises(config_errors, match="entries"):
        HypeNetConfig(num_hidden_layers=3, layer_types=["lightning", "attention"])


def test_default_layout_is_three_lightning_then_attention():
    config = HypeNetConfig(num_hidden_layers=8)
    assert config.layer_types == ["lightning"] * 3 + ["attention"] + ["lightning"] * 3 + ["attention"]


def test_cache_rows_can_be_repeated_for_several_continuations():
    """One cached context, three continuations: each equals the full forward of context + continuation."""
    model = make_model(2)
    context = torch.randint(3, 97, (1, 20))
    continuations = torch.randint(3, 97, (3, 5))
    with torch.no_grad():
        cache = model(context, use_cache=True).past_key_values
        cache.batch_repeat_interleave(3)
        logits = model(continuations, past_key_values=cache, use_cache=True).logits
        for row in range(3):
            full = model(torch.cat([context, continuations[row : row + 1]], 1), use_cache=False).logits[:, 20:]
            assert (full - logits[row : row + 1]).abs().max().item() <= ATOL
