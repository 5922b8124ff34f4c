"""The inference engine under EME on CUDA: SWLA's window rings through fla's chunked kernels in prefill (the open
windows carried between chunks) and through the torch decode steps under a captured CUDA graph, RoPE attention in
the EME window's ring, against the model's own forward under the same options; greedy tokens against transformers'
generate."""

import pytest
import torch
from test_engine_eme import eme, forward_logits
from test_engine_mixers_gpu import (
    FP32_TOL,
    graph_decoded,
    greedy_on_both_paths,
    ragged_graph_logits,
    rel,
    small_model,
)

from hyla.inference import InferenceEngine

pytestmark = pytest.mark.gpu

LAYOUTS = {
    "lightning": ["lightning", "attention", "lightning", "attention_rope"],
    "gla": ["gla", "attention_rope", "gla", "attention"],
    "gdn": ["gdn", "attention", "lightning", "gdn"],
}
# W = 64 with four windows open at once, or W = 48 with S = 20 (W not a multiple of S): windows open and close
# inside prefill chunks of 128 tokens, across their boundaries and while decoding.
WINDOWS = [(64, 16), (48, 20)]


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("window,stride", WINDOWS)
@pytest.mark.parametrize("batch,step,compile_decode", [(1, "eager", False), (3, "fused-projections", False),
                                                       (1, "fused-projections", True)])
def test_graph_decode_matches_model_forward(layout, window, stride, batch, step, compile_decode):
    model = small_model(LAYOUTS[layout])
    options = eme(window, stride)
    tokens = torch.randint(0, 1000, (batch, 300), device="cuda")
    full = forward_logits(model, tokens, options)
    engine = InferenceEngine(model, batch_size=batch, max_length=320, prefill_chunk=128 * batch, decode_step=step,
                             compile_decode=compile_decode, compile_prefill=False, inference_options=options)
    assert rel(graph_decoded(engine, tokens, 250), full[:, 249:]) <= FP32_TOL


def test_ragged_batch_equals_each_prompt_alone():
    model = small_model(["gla", "attention_rope", "gdn", "lightning"])
    options = eme(64, 16)
    prompts, steps, logits = ragged_graph_logits(model, 40, inference_options=options)
    for row, prompt in enumerate(prompts):
        alone = forward_logits(model, torch.cat([prompt, steps[row]])[None], options)[0, len(prompt) - 1:]
        assert rel(torch.stack([step[row] for step in logits]), alone) <= FP32_TOL, f"row {row}"


@pytest.mark.parametrize("scaling", [{}, {"logit_scaling": "off"},
                                     {"logit_scaling": "per_length", "logit_scaling_train_length": 64}],
                         ids=["per-query", "off", "per-length"])
def test_greedy_tokens_equal_transformers_generate(scaling):
    """Float32 and the pure-torch ops on both paths (no TF32), as test_engine_mixers_gpu.py: identical tokens."""
    model = small_model(["lightning", "attention", "gla", "attention_rope"])
    model.inference_options = eme(64, 16, **scaling)
    ours, theirs = greedy_on_both_paths(model)
    assert torch.equal(ours, theirs)
