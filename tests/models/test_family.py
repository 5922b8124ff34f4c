"""The hybrid family (GLA, GDN, SWA, RoPE attention, head-wise layers, EME) under the model invariants of
test_hypenet.py: chunked prefill + decode equals one forward, left-padded batched generation equals each prompt
alone, packed documents equal separate forwards, save/load; plus layouts and EME's inference options."""

import pytest
import torch
from test_hypenet import ATOL, left_pad, make_model

from hyla import HybridCache, HypeNetConfig, InferenceOptions
from hyla.models.configuration import default_layer_types
from hyla.models.layouts import headwise_layout, layerwise_layout

NEW_TYPES = ["gla", "gdn", "swa", "attention_rope", "hh_lightning", "hh_gla", "hh_gdn", "hh_swa"]
# A small SWA window so that 150 tokens cross it many times; EME windows likewise.
FAMILY = dict(num_attention_heads=4, num_key_value_heads=2, hidden_size=32, swa_window=7, headwise_ratio="1:1")
EME = InferenceOptions(eme_window=24, eme_stride=8, logit_scaling="per_length", logit_scaling_train_length=16)
EME_TYPES = ["lightning", "gla", "gdn", "attention_rope", "hh_gla", "hh_swa"]


def family_model(seed, layer_type, eme=False, **overrides):
    model = make_model(seed, **dict(FAMILY, num_hidden_layers=3, layer_types=[layer_type, "attention", layer_type],
                                    **overrides))
    if eme:
        model.inference_options = EME  # what forward and generate run with when a call passes no options
    return model


def chunked_logits(model, tokens, splits, decode_from):
    cache = HybridCache(model.config.layer_types)
    pieces = [model(tokens[:, a:b], past_key_values=cache, use_cache=True).logits for a, b in splits]
    for t in range(decode_from, tokens.shape[1]):
        pieces.append(model(tokens[:, t : t + 1], past_key_values=cache, use_cache=True).logits)
    return torch.cat(pieces, 1), cache


@pytest.mark.parametrize(
    ("layer_type", "eme"), [(t, False) for t in NEW_TYPES] + [(t, True) for t in EME_TYPES]
)
def test_chunked_prefill_and_decode_equal_full_forward(layer_type, eme):
    model = family_model(len(layer_type), layer_type, eme)
    tokens = torch.randint(3, 97, (2, 90), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(tokens, use_cache=False).logits
        pieces, cache = chunked_logits(model, tokens, [(0, 37), (37, 70)], 70)
    assert cache.get_seq_length() == 90
    assert (pieces - full).abs().max().item() <= ATOL


@pytest.mark.parametrize("layer_type", ["gla", "gdn", "hh_gdn"])
@pytest.mark.parametrize("eme", [False, True])
def test_rnn_rope_chunked_prefill_and_decode_equal_full_forward(layer_type, eme):
    """`gla_rope` / `gdn_rope`: RoPE at each token's absolute position in prefill chunks, decode steps and SWLA's
    windows (EME's window 24 < 90 tokens)."""
    model = family_model(len(layer_type), layer_type, eme, gla_rope=True, gdn_rope=True)
    mixer = model.model.layers[0].mixer
    assert (mixer.efficient if layer_type.startswith("hh_") else mixer).use_rope
    tokens = torch.randint(3, 97, (2, 90), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(tokens, use_cache=False).logits
        pieces, _ = chunked_logits(model, tokens, [(0, 37), (37, 70)], 70)
    assert (pieces - full).abs().max().item() <= ATOL


@pytest.mark.parametrize(
    ("layer_type", "eme"), [(t, False) for t in NEW_TYPES] + [(t, True) for t in ("gdn", "hh_gla", "attention_rope")]
)
def test_left_padded_greedy_generation_equals_each_prompt_alone(layer_type, eme):
    assert_left_padded_generation_equals_each_prompt_alone(family_model(2, layer_type, eme), (5, 30, 1, 41), 8)


def assert_left_padded_generation_equals_each_prompt_alone(model, lengths, max_new_tokens):
    prompts = [[(7 * i + 3) % 94 + 3 for i in range(n)] for n in lengths]
    ids, mask = left_pad(prompts)
    kwargs = dict(max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None, pad_token_id=0)
    with torch.no_grad():
        batched = model.generate(ids, attention_mask=mask, **kwargs)[:, ids.shape[1] :]
        for row, prompt in enumerate(prompts):
            alone = model.generate(torch.tensor([prompt]), **kwargs)[0, len(prompt) :]
            assert batched[row].tolist() == alone.tolist(), f"row {row}"


@pytest.mark.parametrize("layer_type", ["gla", "gdn"])
def test_rnn_rope_left_padded_greedy_generation_equals_each_prompt_alone(layer_type):
    """Each row's RoPE positions start at its first real token (EME on: SWLA's windows open at those positions)."""
    model = family_model(2, layer_type, True, gla_rope=True, gdn_rope=True)
    assert_left_padded_generation_equals_each_prompt_alone(model, (5, 30, 1), 6)


@pytest.mark.parametrize("layer_type", NEW_TYPES)
def test_packed_documents_equal_separate_forwards(layer_type):
    model = family_model(5, layer_type)
    docs = [torch.randint(3, 97, (1, n), generator=torch.Generator().manual_seed(n)) for n in (9, 30, 4)]
    cu = torch.tensor([0, 9, 39, 43])
    with torch.no_grad():
        packed = model(torch.cat(docs, 1), cu_seqlens=cu, use_cache=False).logits
        for doc, start in zip(docs, cu[:-1].tolist()):
            alone = model(doc, use_cache=False).logits
            assert (packed[:, start : start + doc.shape[1]] - alone).abs().max().item() <= ATOL


def test_eme_changes_only_what_reaches_beyond_its_window():
    """Below the EME window and below L0 every mixer gives the plain result; past them the result changes."""
    layer_types = ["gla", "attention", "gdn", "attention_rope"]
    model = make_model(3, **dict(FAMILY, num_hidden_layers=4, layer_types=layer_types))
    tokens = torch.randint(3, 97, (1, 60), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = model(tokens, use_cache=False).logits
        eme = model(tokens, use_cache=False, inference_options=EME).logits
        model.inference_options = EME
        assert torch.equal(model(tokens, use_cache=False).logits, eme)
    assert (eme[:, :16] - plain[:, :16]).abs().max().item() <= ATOL
    assert (eme[:, 24:] - plain[:, 24:]).abs().max().item() > 1e-3


def test_save_load_keeps_family_fields_and_no_inference_options(tmp_path):
    import json

    from transformers import AutoModelForCausalLM

    layer_types = ["hh_gdn", "swa", "gla", "attention"]
    model = make_model(11, **dict(FAMILY, num_hidden_layers=4, layer_types=layer_types))
    model.inference_options = EME
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert not {"eme_window", "eme_stride", "logit_scaling", "logit_scaling_train_length"} & set(saved)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path).eval()
    for field in ("layer_types", "headwise_ratio", "swa_window"):
        assert getattr(loaded.config, field) == getattr(model.config, field), field
    assert loaded.inference_options == InferenceOptions()
    tokens = torch.randint(3, 97, (2, 40))
    with torch.no_grad():
        assert torch.equal(model(tokens, inference_options=InferenceOptions()).logits, loaded(tokens).logits)
        assert torch.equal(model(tokens).logits, loaded(tokens, inference_options=EME).logits)


def test_save_load_keeps_the_rnn_rope_fields_and_configs_without_them_load_with_them_off(tmp_path):
    import json

    from transformers import AutoModelForCausalLM

    model = make_model(13, **dict(FAMILY, num_hidden_layers=3, layer_types=["gla", "attention", "gdn"],
                                  gla_rope=True, gdn_rope=True))
    model.save_pretrained(tmp_path / "rope")
    saved = json.loads((tmp_path / "rope" / "config.json").read_text())
    assert saved["gla_rope"] is True and saved["gdn_rope"] is True
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "rope").eval()
    assert loaded.config.gla_rope and loaded.config.gdn_rope
    tokens = torch.randint(3, 97, (2, 30))
    with torch.no_grad():
        assert torch.equal(model(tokens).logits, loaded(tokens).logits)
    # A folder saved before the fields existed: its layers load without RoPE, as they ran.
    for field in ("gla_rope", "gdn_rope"):
        del saved[field]
    (tmp_path / "rope" / "config.json").write_text(json.dumps(saved))
    earlier = AutoModelForCausalLM.from_pretrained(tmp_path / "rope").eval()
    assert not earlier.config.gla_rope and not earlier.config.gdn_rope
    assert not any(getattr(block.mixer, "use_rope", False) for block in earlier.model.layers)


def test_layerwise_layouts():
    assert layerwise_layout(8) == default_layer_types(8)
    assert layerwise_layout(8, efficient="gla", ratio="1:1") == ["gla", "attention"] * 4
    yoco = layerwise_layout(8, efficient="gdn", ratio="3:1", order="bottom")
    assert yoco == ["gdn"] * 6 + ["attention"] * 2
    assert layerwise_layout(4, ratio="1:0") == ["lightning"] * 4
    assert layerwise_layout(3, ratio="1:3", global_type="attention_rope").count("attention_rope") == 2
    assert headwise_layout(3, efficient="swa") == ["hh_swa"] * 3
    with pytest.raises(ValueError, match="order"):
        layerwise_layout(4, order="top")
    with pytest.raises(ValueError, match="ratio"):
        layerwise_layout(4, ratio="3-1")


def test_config_rejects_bad_family_settings():
    from huggingface_hub.errors import StrictDataclassClassValidationError

    errors = (ValueError, StrictDataclassClassValidationError)
    base = dict(num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, hidden_size=32)
    with pytest.raises(errors, match="whole groups"):
        HypeNetConfig(**base, layer_types=["hh_gla"], headwise_ratio="3:1")  # 1 NoPE head, groups of 2
    with pytest.raises(errors, match="swa_window"):
        HypeNetConfig(**base, layer_types=["swa"], swa_window=0)


@pytest.mark.parametrize("options, message", [
    (dict(logit_scaling="per_length"), "needs logit_scaling_train_length"),
    (dict(logit_scaling_train_length=16), "the L0 of logit_scaling='per_length'"),
    (dict(logit_scaling="per_length", logit_scaling_train_length=16, logit_scaling_a=500.0), "a of"),
    (dict(logit_scaling_a=1.0), "must be > 1"),
    (dict(logit_scaling="nope"), "must be one of per_query, per_length, off"),
    (dict(eme_window=8, eme_stride=9), "1 <= eme_stride <= eme_window"),
    (dict(eme_stride=4), "eme_stride needs eme_window"),
])
def test_inference_options_refuse_settings_that_do_not_go_together(options, message):
    with pytest.raises(ValueError, match=message):
        InferenceOptions(**options)
    assert InferenceOptions(eme_window=8).swla_stride == 2 and InferenceOptions().swla_stride is None
    assert EME.changes() == {"logit_scaling": "per_length", "logit_scaling_train_length": 16, "eme_window": 24,
                             "eme_stride": 8}


@pytest.mark.parametrize("layer_type", ["hh_lightning", "hh_gla"])
def test_headwise_model_deepcopies_and_pickles(layer_type):
    # copy.deepcopy and pickle probe a BranchConfig before its fields exist; both must give the same function.
    import copy
    import pickle

    model = family_model(12, layer_type)
    tokens = torch.randint(3, 97, (2, 30))
    with torch.no_grad():
        expected = model(tokens).logits
        for other in (copy.deepcopy(model), pickle.loads(pickle.dumps(model))):
            assert other.model.layers[0].mixer.efficient is not model.model.layers[0].mixer.efficient
            assert torch.equal(other(tokens).logits, expected)
