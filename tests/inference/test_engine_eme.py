"""The inference engine under EME (docs/method.md, "EME"): every linear mixer (Lightning, GLA, GDN) as SWLA through
the cache's window ring, RoPE attention limited to the EME window, NoPE attention global with its logit scaling.
Prefill, chunked prefill, decode steps across window openings, ragged batches and greedy generation against the
model's own forward under the same options. CPU, pure torch, float64 models."""

import pytest
import torch
from test_engine_mixers import (
    TOL,
    assert_greedy_equals_transformers,
    engine_logits,
    left_pad,
    prompts_of,
    rel,
    tiny_model,
)

from hyla import InferenceOptions
from hyla.inference import InferenceEngine
from hyla.inference.settings import fit_to_model, tuned_settings, with_fields

# TOL (1e-6, test_engine_mixers.py): GLA's and GDN's gates are float32 even in a float64 model; Lightning-only
# layouts match to ~1e-15, a wrong window, slot or opening moves the logits by more than 1e-3.
LAYOUTS = {
    "lightning": ["lightning", "attention", "lightning", "attention_rope"],
    "gla": ["gla", "attention_rope", "gla", "attention"],
    "gdn": ["gdn", "attention", "lightning", "gdn"],
}
# (W, S): four windows open at once, two, one (S = W), and W not a multiple of S.
WINDOWS = [(8, 2), (6, 3), (5, 5), (7, 3)]


def eme(window, stride, **options):
    return InferenceOptions(eme_window=window, eme_stride=stride, **options)


def forward_logits(model, tokens, options):
    with torch.no_grad():
        return model(tokens, use_cache=False, inference_options=options).logits


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("window,stride", WINDOWS)
@pytest.mark.parametrize("chunk,step", [(3, "eager"), (64, "fused-projections")])
def test_prefill_and_decode_match_model_forward(layout, window, stride, chunk, step):
    """A prompt of 13 (chunks of 3 tokens, 1 a row, or all at once), then 14 decode steps: windows open and close
    in prefill, between chunks and while decoding."""
    model = tiny_model(LAYOUTS[layout])
    options = eme(window, stride)
    tokens = torch.randint(0, 101, (2, 27), generator=torch.Generator().manual_seed(window + stride))
    full = forward_logits(model, tokens, options)
    assert rel(full, forward_logits(model, tokens, InferenceOptions())) > 1e-2  # EME changes the result
    engine = InferenceEngine(model, batch_size=2, max_length=32, prefill_chunk=chunk, decode_step=step,
                             inference_options=options)
    assert rel(engine_logits(engine, tokens, 13), full[:, 12:]) <= TOL


@pytest.mark.parametrize("layout", ["gla", "gdn"])
@pytest.mark.parametrize("step", ["eager", "fused-projections"])
def test_prefill_and_decode_with_rnn_rope_match_model_forward(layout, step):
    """`gla_rope` / `gdn_rope` under SWLA: RoPE at absolute positions in every window, in prefill chunks of 3 tokens
    (1 a row: windows open between chunks) and decode steps, as the model's forward."""
    model = tiny_model(LAYOUTS[layout], gla_rope=True, gdn_rope=True)
    options = eme(7, 3)
    tokens = torch.randint(0, 101, (2, 27), generator=torch.Generator().manual_seed(4))
    full = forward_logits(model, tokens, options)
    engine = InferenceEngine(model, batch_size=2, max_length=32, prefill_chunk=3, decode_step=step,
                             inference_options=options)
    assert rel(engine_logits(engine, tokens, 13), full[:, 12:]) <= TOL


def test_cache_holds_window_rings():
    """Each linear mixer: a ring of ceil(W / S) window states; RoPE attention: a ring of W keys; NoPE attention
    keeps every key."""
    model = tiny_model(LAYOUTS["gla"])
    engine = InferenceEngine(model, batch_size=3, max_length=32, inference_options=eme(7, 3))
    assert engine.cache.states[0].shape == engine.cache.states[2].shape == (3, 3, 4, 16, 16)
    assert engine.cache.window_slots == {1: 7}
    assert engine.cache.keys[1].shape[2] == 7 and engine.cache.keys[3].shape[2] == 32


@pytest.mark.parametrize("window,stride,rope", [(8, 2, False), (7, 3, False), (7, 3, True)])
def test_ragged_batch_equals_each_prompt_alone(window, stride, rope):
    """Rows of a left-padded batch at different positions: each row opens its windows (and, with `gla_rope` /
    `gdn_rope`, starts its rotations) at its own positions."""
    model = tiny_model(["gla", "attention_rope", "gdn", "lightning"], gla_rope=rope, gdn_rope=rope)
    options = eme(window, stride)
    prompts = prompts_of([4, 13, 13, 1, 10])
    ids, mask = left_pad(prompts)
    ids[mask == 0] = torch.randint(3, 101, (int((mask == 0).sum()),))
    engine = InferenceEngine(model, batch_size=len(prompts), max_length=28, prefill_chunk=9,
                             inference_options=options)
    logits = [engine.prefill(ids, mask)]
    steps = torch.randint(3, 101, (len(prompts), 7), generator=torch.Generator().manual_seed(2))
    logits += [engine.decode(steps[:, t : t + 1]) for t in range(steps.shape[1])]
    for row, prompt in enumerate(prompts):
        alone = forward_logits(model, torch.tensor([prompt + steps[row].tolist()]), options)[0, len(prompt) - 1:]
        assert rel(torch.stack([step[row] for step in logits]), alone) <= TOL, f"row {row}"


@pytest.mark.parametrize("scaling", [{}, {"logit_scaling": "off"},
                                     {"logit_scaling": "per_length", "logit_scaling_train_length": 4}],
                         ids=["per-query", "off", "per-length"])
def test_greedy_tokens_equal_transformers_generate(scaling):
    """SWLA with the NoPE layers' logit scaling (the model's a, none, or c(L)): "SWLA+Log" and "SWLA"."""
    model = tiny_model(["lightning", "attention", "gla", "attention_rope"])
    model.inference_options = eme(6, 2, **scaling)
    assert_greedy_equals_transformers(model)


def test_triton_fused_decode_falls_back_under_eme():
    model = tiny_model(["lightning", "attention"])
    triton_fused = with_fields(tuned_settings("cpu"), {"decode_step": "triton-fused"})
    plain = fit_to_model(triton_fused, model, 1)[1]
    settings, reasons = fit_to_model(triton_fused, model, 1, eme(8, 2))
    assert settings.decode_step == "fused-projections"
    assert [reason for reason in reasons if reason not in plain] == [next(r for r in reasons if "EME" in r)]
    with pytest.raises(ValueError, match="EME"):
        InferenceEngine(model, batch_size=1, max_length=8, decode_step="triton-fused", inference_options=eme(8, 2))


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["gla", "gdn"])  # "gdn" holds a Lightning layer too
def test_compiled_decode_under_eme_matches_model_forward(layout):
    """The decode blocks compiled whole (fullgraph; inductor's CPU backend here, as dynamo traces them on CUDA too):
    the window ring's step, opening and serving slot trace into one graph and give the model's logits. Float32: the
    compiled kernels sum in another order than the eager reference, ~5e-7 relative measured."""
    model = tiny_model(LAYOUTS[layout]).float()
    options = eme(8, 2)
    tokens = torch.randint(0, 101, (2, 27), generator=torch.Generator().manual_seed(3))
    full = forward_logits(model, tokens, options)
    engine = InferenceEngine(model, batch_size=2, max_length=32, prefill_chunk=64, decode_step="fused-projections",
                             compile_decode=True, inference_options=options)
    assert rel(engine_logits(engine, tokens, 13), full[:, 12:]) <= 1e-5
