"""Teacher -> HypeNet weight transfer: exact parity with tiny random teachers of every supported family."""

import pytest
import torch
from transformers import (
    LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM,
    Qwen3Config, Qwen3ForCausalLM,
)

from hyla.models.transfer import expand_kv_heads, hypenet_config_from_teacher, lightning_from_attention, to_hypenet

# float32 end to end; the same ops in the same order except RoPE tables: 1e-5 is the bound.
ATOL = 1e-5

COMMON = dict(
    vocab_size=120, hidden_size=48, intermediate_size=80, num_hidden_layers=3, num_attention_heads=6,
    num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5,
)


def teachers():
    yield "llama", LlamaForCausalLM(LlamaConfig(**COMMON, rope_theta=1e5, tie_word_embeddings=True))
    yield "llama-untied-bias", LlamaForCausalLM(
        LlamaConfig(**COMMON, tie_word_embeddings=False, attention_bias=True, mlp_bias=True)
    )
    yield "llama3-rope-scaling", LlamaForCausalLM(LlamaConfig(**COMMON, rope_parameters={
        "rope_type": "llama3", "rope_theta": 5e5, "factor": 8.0, "low_freq_factor": 1.0,
        "high_freq_factor": 4.0, "original_max_position_embeddings": 64,
    }))
    yield "mistral", MistralForCausalLM(MistralConfig(**COMMON, sliding_window=None, tie_word_embeddings=False))
    yield "qwen2", Qwen2ForCausalLM(Qwen2Config(**COMMON, tie_word_embeddings=True))
    yield "qwen3", Qwen3ForCausalLM(Qwen3Config(**COMMON, head_dim=16, tie_word_embeddings=False))
    yield "qwen3-tied-mha", Qwen3ForCausalLM(
        Qwen3Config(**{**COMMON, "num_key_value_heads": 6}, head_dim=8, tie_word_embeddings=True)
    )


def randomize_norms(model):
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name or name.endswith(".bias"):
                param.normal_(1.0 if "norm" in name else 0.0, 0.2)


@pytest.mark.parametrize("name,teacher", list(teachers()), ids=lambda x: x if isinstance(x, str) else "")
def test_teacher_equivalent_hypenet_reproduces_logits(name, teacher):
    torch.manual_seed(0)
    teacher = teacher.eval()
    randomize_norms(teacher)
    student = to_hypenet(teacher, attention_rope=True)
    tokens = torch.randint(0, 120, (2, 97))
    with torch.no_grad():
        expected = teacher(tokens).logits
        actual = student(tokens, use_cache=False).logits
    assert (actual - expected).abs().max().item() <= ATOL
    if teacher.config.tie_word_embeddings:
        assert student.lm_head.weight.data_ptr() == student.model.embed_tokens.weight.data_ptr()


def test_qwen2_biases_and_qwen3_norms_are_carried():
    qwen2 = Qwen2ForCausalLM(Qwen2Config(**COMMON))
    config = hypenet_config_from_teacher(qwen2)
    assert config.qkv_bias and not config.o_bias and not config.attention_qk_norm
    qwen3 = Qwen3ForCausalLM(Qwen3Config(**COMMON, head_dim=16))
    assert hypenet_config_from_teacher(qwen3).attention_qk_norm


def test_lightning_twin_maps_query_head_to_kv_head_of_its_group():
    """6 query heads, 2 KV heads (g = 3): query heads 0-2 take KV head 0, 3-5 take KV head 1.
    A tiled repeat (0, 1, 0, 1, ...) would fail this."""
    teacher = LlamaForCausalLM(LlamaConfig(**COMMON)).eval()
    attention = teacher.model.layers[0].self_attn
    head_dim = 8
    with torch.no_grad():
        for kv in range(2):
            attention.k_proj.weight[kv * head_dim : (kv + 1) * head_dim] = float(kv + 1)
            attention.v_proj.weight[kv * head_dim : (kv + 1) * head_dim] = -float(kv + 1)
    config = hypenet_config_from_teacher(teacher, ["lightning"] * 3)
    twin = lightning_from_attention(attention, config, 0)
    k_heads = twin.k_proj.weight.view(6, head_dim, -1)[:, 0, 0].tolist()
    v_heads = twin.v_proj.weight.view(6, head_dim, -1)[:, 0, 0].tolist()
    assert k_heads == [1.0, 1.0, 1.0, 2.0, 2.0, 2.0]
    assert v_heads == [-1.0, -1.0, -1.0, -2.0, -2.0, -2.0]
    assert torch.equal(twin.q_proj.weight, attention.q_proj.weight)
    assert torch.equal(twin.o_proj.weight, attention.o_proj.weight)


def test_expand_kv_heads_on_biases():
    bias = torch.arange(4.0)  # 2 KV heads of dim 2
    assert expand_kv_heads(bias, 2, 2).tolist() == [0.0, 1.0, 0.0, 1.0, 2.0, 3.0, 2.0, 3.0]


def test_mixed_layer_types_copy_everything_but_build_twins():
    teacher = Qwen3ForCausalLM(Qwen3Config(**COMMON, head_dim=16)).eval()
    student = to_hypenet(teacher, ["lightning", "attention", "lightning"])
    assert [b.layer_type for b in student.model.layers] == ["lightning", "attention", "lightning"]
    assert "attention_rope" not in student.config.layer_types
    assert torch.equal(student.model.layers[1].mixer.q_norm.weight, teacher.model.layers[1].self_attn.q_norm.weight)
    assert torch.equal(student.model.layers[0].mixer.k_norm.weight, teacher.model.layers[0].self_attn.k_norm.weight)
    tokens = torch.randint(0, 120, (1, 20))
    with torch.no_grad():
        assert torch.isfinite(student(tokens).logits).all()


def test_unsupported_family_is_one_clear_error():
    from transformers import GPT2Config, GPT2LMHeadModel

    with pytest.raises(ValueError, match="supported: llama, mistral, qwen2, qwen3"):
        to_hypenet(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50)))


@pytest.mark.slow
def test_smollm2_from_gguf_reproduces_teacher_logits(smollm2_teacher):
    teacher = smollm2_teacher.model
    student = to_hypenet(teacher, attention_rope=True)
    tokens = smollm2_teacher.tokenizer("The quick brown fox jumps over the lazy dog. " * 12, return_tensors="pt")
    with torch.no_grad():
        expected = teacher(tokens.input_ids).logits
        actual = student(tokens.input_ids, use_cache=False).logits
    assert (actual - expected).abs().max().item() <= ATOL


WINDOW = 16  # shorter than the test sequences, so that the window changes the logits


def teachers_with_their_own_layer_types():
    full = ["full_attention"] * 3
    yield pytest.param(LlamaForCausalLM(LlamaConfig(**COMMON, layer_types=full)), ["attention_rope"] * 3, id="llama")
    yield pytest.param(MistralForCausalLM(MistralConfig(**COMMON, sliding_window=WINDOW)), ["swa"] * 3,
                       id="mistral-sliding")
    yield pytest.param(Qwen2ForCausalLM(Qwen2Config(
        **COMMON, use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1,
    )), ["attention_rope", "swa", "swa"], id="qwen2-sliding")
    yield pytest.param(Qwen3ForCausalLM(Qwen3Config(
        **COMMON, head_dim=16, use_sliding_window=True, sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
    )), ["swa", "attention_rope", "swa"], id="qwen3-sliding")
    yield pytest.param(Qwen3ForCausalLM(Qwen3Config(**COMMON, head_dim=16, layer_types=full)), ["attention_rope"] * 3,
                       id="qwen3")


@pytest.mark.parametrize("teacher,expected_types", list(teachers_with_their_own_layer_types()))
def test_teacher_configs_with_their_own_layer_types_convert(teacher, expected_types, tmp_path):
    """transformers' own layer types ("full_attention", "sliding_attention") become hyla's ("attention_rope" here,
    "swa" with the teacher's window); the converted model keeps the teacher's logits and greedy continuation through
    save/load, on every transformers version CI tests."""
    from hyla.models import HypeNetForCausalLM

    torch.manual_seed(0)
    teacher = teacher.eval()
    randomize_norms(teacher)
    student = to_hypenet(teacher, attention_rope=True)
    assert student.config.layer_types == expected_types
    if "swa" in expected_types:
        assert student.config.swa_window == WINDOW
    student.save_pretrained(tmp_path)
    loaded = HypeNetForCausalLM.from_pretrained(tmp_path).eval()
    assert loaded.config.layer_types == expected_types
    tokens = torch.randint(0, 120, (2, 97))
    prompt = tokens[:1, :20]
    with torch.no_grad():
        expected = teacher(tokens).logits
        assert (loaded(tokens, use_cache=False).logits - expected).abs().max().item() <= ATOL
        continuation = teacher.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0)
        assert torch.equal(loaded.generate(prompt, max_new_tokens=12, do_sample=False, pad_token_id=0), continuation)


def test_sliding_window_teacher_layers_never_become_full_attention():
    teacher = Qwen2ForCausalLM(Qwen2Config(**COMMON, use_sliding_window=True, sliding_window=WINDOW,
                                           max_window_layers=1))
    with pytest.raises(ValueError, match=r"teacher layer 1 is sliding-window attention \(window 16\); give it 'swa'"):
        to_hypenet(teacher, ["attention", "attention", "lightning"])
    student = to_hypenet(teacher, ["attention", "lightning", "swa"])
    assert student.config.layer_types == ["attention", "lightning", "swa"] and student.config.swa_window == WINDOW


def test_teacher_layer_types_hyla_cannot_convert_are_one_clear_error():
    no_window = Qwen3ForCausalLM(Qwen3Config(**COMMON, head_dim=16, sliding_window=None,
                                             layer_types=["full_attention", "sliding_attention", "full_attention"]))
    with pytest.raises(ValueError, match="layer 1 is 'sliding_attention' but its config sets no sliding_window"):
        to_hypenet(no_window)
    with pytest.raises(ValueError, match="layer 0 is 'hh_gla'; to_hypenet builds attention, attention_rope, swa, "
                                         "lightning, gla, gdn layers"):
        to_hypenet(LlamaForCausalLM(LlamaConfig(**COMMON)), ["hh_gla", "attention", "attention"], headwise_ratio="1:1")
