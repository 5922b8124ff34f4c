"""The inference engine on GLA, GDN and sliding-window (SWA) layers, mixed with attention and Lightning: chunked
prefill, decode steps, ragged batches and greedy generation against the model's own forward and transformers'
generate. CPU, pure torch, float64 models."""

import pytest
import torch
from test_generate import PAD, left_pad, prompts_of

import hyla
from hyla import HypeNetConfig, HypeNetForCausalLM
from hyla.inference import InferenceEngine
from hyla.inference import engine as engine_module
from hyla.inference.engine import unsupported_reason
from hyla.inference.generate import GenerationSession, generation_path
from hyla.inference.settings import fit_to_model, tuned_settings, with_fields

# GLA's and GDN's gates are computed in float32 even in a float64 model (the layers' `.float()`): a summation-order
# difference of ~1e-16 in a hidden state can move a gate by one float32 ulp (~6e-8 relative), which reaches the
# logits at ~1e-8 (with the gates in float64 the engine matches to ~1e-15). A wrong state, gate, window or cache
# slot moves them by more than 1e-3.
TOL = 1e-6

LAYOUTS = {
    "gla": ["gla", "attention", "gla", "attention"],
    "gdn": ["gdn", "attention_rope", "gdn", "attention"],
    "swa": ["swa", "attention", "swa", "lightning"],
    "mixed": ["gla", "swa", "gdn", "attention"],
}


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def tiny_model(layer_types, *, swa_window=5, seed=0, **overrides):
    torch.manual_seed(seed)
    config = HypeNetConfig(
        vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=len(layer_types),
        num_attention_heads=4, num_key_value_heads=2, head_dim=16, layer_types=layer_types, swa_window=swa_window,
        attention_logit_scaling_a=5.0, attention_output_gate=True, attention_qk_norm=True, attention_gate_init_bias=0.0,
        gla_gate_low_rank_dim=8, pad_token_id=PAD, eos_token_id=None, bos_token_id=None, **overrides,
    )
    model = HypeNetForCausalLM(config).double().eval()
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "init_bias"):  # attention output gates start constant: make them depend on x
                module.weight.normal_(0.0, 0.1)
    return model


def engine_logits(engine, tokens, prompt_length):
    """[B, T - prompt_length + 1, V]: the prefill's last logits, then one decode step per later token."""
    logits = [engine.prefill(tokens[:, :prompt_length])]
    logits += [engine.decode(tokens[:, t : t + 1]) for t in range(prompt_length, tokens.shape[1])]
    return torch.stack(logits, 1)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("chunk,step", [(3, "eager"), (7, "fused-projections"), (64, "eager")])
def test_prefill_and_decode_match_model_forward(layout, chunk, step):
    """Chunks of 3 and 7 tokens a row (2 rows: 1 and 3 a chunk) carry the recurrent states and the window's ring
    between prefill calls; chunk 64 prefills the prompt at once. The window (5) is shorter than the prompt (19)."""
    model = tiny_model(LAYOUTS[layout])
    tokens = torch.randint(0, 101, (2, 27), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(tokens, use_cache=False).logits
    engine = InferenceEngine(model, batch_size=2, max_length=32, prefill_chunk=chunk, decode_step=step)
    assert all((f is not None) == (step == "fused-projections") for f in engine.step.fused)
    logits = engine_logits(engine, tokens, 19)
    assert engine.lengths == [27, 27]
    assert rel(logits, full[:, 18:]) <= TOL


@pytest.mark.parametrize("layout", ["gla", "gdn", "mixed"])
@pytest.mark.parametrize("step", ["eager", "fused-projections"])
def test_prefill_and_decode_with_rnn_rope_match_model_forward(layout, step):
    """`gla_rope` / `gdn_rope` on: the engine's prefill chunks (7 tokens a row) and decode steps (eager and fused
    projections: both through the layers' `prepare_qkv`) rotate at each token's position, as the model's forward."""
    model = tiny_model(LAYOUTS[layout], gla_rope=True, gdn_rope=True)
    tokens = torch.randint(0, 101, (2, 27), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(tokens, use_cache=False).logits
    engine = InferenceEngine(model, batch_size=2, max_length=32, prefill_chunk=14, decode_step=step)
    assert rel(engine_logits(engine, tokens, 19), full[:, 18:]) <= TOL


@pytest.mark.parametrize("window", [1, 4, 40])
def test_sliding_window_prefill_in_query_blocks_matches_model_forward(window, monkeypatch):
    """The window's prefill attention runs in blocks of queries (here 8, at least twice the window): blocks that
    start inside the window of the previous block's keys, a window of one token (each query sees itself), and a
    window longer than the engine's buffer (the ring holds every position)."""
    monkeypatch.setattr(engine_module, "WINDOW_QUERY_BLOCK", 8)
    model = tiny_model(["swa", "gla", "swa", "attention"], swa_window=window)
    tokens = torch.randint(0, 101, (1, 30), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        full = model(tokens, use_cache=False).logits
    engine = InferenceEngine(model, batch_size=1, max_length=32, prefill_chunk=13)
    assert engine.cache.window_slots == {0: min(window, 32), 2: min(window, 32)}
    assert engine.cache.keys[0].shape[2] == min(window, 32) and engine.cache.keys[3].shape[2] == 32
    assert rel(engine_logits(engine, tokens, 25), full[:, 24:]) <= TOL


@pytest.mark.parametrize("rope", [False, True])
def test_ragged_batch_equals_each_prompt_alone(rope):
    """A left-padded batch (real tokens, not pad ids, under the padding) prefills each row at its own positions:
    logits and decode steps equal each prompt run alone through the model, and the GLA/GDN states equal the model
    cache's recurrent states; with `gla_rope` / `gdn_rope`, each row's rotations start at its first real token."""
    model = tiny_model(LAYOUTS["mixed"], gla_rope=rope, gdn_rope=rope)
    prompts = prompts_of([4, 13, 13, 1, 20])
    ids, mask = left_pad(prompts)
    ids[mask == 0] = torch.randint(3, 101, (int((mask == 0).sum()),))
    engine = InferenceEngine(model, batch_size=len(prompts), max_length=28, prefill_chunk=9)
    logits = [engine.prefill(ids, mask)]
    steps = torch.randint(3, 101, (len(prompts), 3), generator=torch.Generator().manual_seed(2))
    logits += [engine.decode(steps[:, t : t + 1]) for t in range(3)]
    for row, prompt in enumerate(prompts):
        with torch.no_grad():
            alone = model(torch.tensor([prompt + steps[row].tolist()]), use_cache=True)
        expected = alone.logits[0, len(prompt) - 1:]
        assert rel(torch.stack([step[row] for step in logits]), expected) <= TOL, f"row {row}"
        for index, state in engine.cache.states.items():
            assert rel(state[row], alone.past_key_values.recurrent_state(index)[0]) <= TOL, f"row {row}"


def assert_greedy_equals_transformers(model):
    """hyla.generate on the engine gives transformers' greedy tokens for a ragged batch of four prompts; returns
    (ids, mask, transformers' output)."""
    assert generation_path(model)[0] == "engine"
    ids, mask = left_pad(prompts_of((5, 14, 1, 9)))
    ours = hyla.generate(model, ids, mask, max_new_tokens=10, pad_token_id=PAD)
    theirs = model.hf_generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, pad_token_id=PAD)
    assert ours.shape == theirs.shape == (4, ids.shape[1] + 10)
    assert torch.equal(ours, theirs)
    return ids, mask, theirs


@pytest.mark.parametrize("layout", ["mixed", "swa"])
def test_greedy_tokens_equal_transformers_generate(layout):
    model = tiny_model(LAYOUTS[layout], swa_window=6)
    ids, mask, theirs = assert_greedy_equals_transformers(model)
    session = GenerationSession(model, decode_step="fused-projections")
    assert torch.equal(session.generate(ids, mask, max_new_tokens=10, pad_token_id=PAD), theirs)


def test_the_engine_takes_gated_and_window_layers_but_not_headwise_ones():
    for layout in LAYOUTS.values():
        assert unsupported_reason(tiny_model(layout)) is None
    model = tiny_model(["hh_gla", "attention"], headwise_ratio="1:1")
    reason = unsupported_reason(model)
    assert "\n" not in reason and "['hh_gla']" in reason
    with pytest.raises(ValueError, match="hh_gla"):
        InferenceEngine(model, batch_size=1, max_length=8)


def test_triton_fused_decode_falls_back_for_gated_and_window_layers():
    model = tiny_model(LAYOUTS["mixed"])
    settings, reasons = fit_to_model(with_fields(tuned_settings("cpu"), {"decode_step": "triton-fused"}), model, 1)
    assert settings.decode_step == "fused-projections"
    assert any("not ['gdn', 'gla', 'swa']" in reason for reason in reasons)
    with pytest.raises(ValueError, match="triton-fused"):
        InferenceEngine(model, batch_size=1, max_length=8, decode_step="triton-fused")
