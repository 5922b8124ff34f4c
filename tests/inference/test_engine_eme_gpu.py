"""The inference engine under EME on CUDA: SWLA's window rings through fla's chunked kernels in prefill (the open
windows carried between chunks, packed with cu_seqlens) and through the torch decode steps under a captured CUDA
graph, RoPE attention in the EME window's ring, against the model's own forward under the same options on the
pure-torch ops; greedy tokens against transformers' generate, under each logit scaling.

Packed windows are fla kernel keys of their own (cu_seqlens): as test_engine_mixers_gpu.py, the tests of one
family share an xdist group. Each layout runs both window shapes; the eager and compiled decode steps and batches of
1 and 3 keep a case each; the CPU twins (test_engine_eme.py, float64) cover every combination."""

import pytest
import torch
from test_engine_eme import eme
from test_engine_mixers_gpu import (
    FP32_TOL,
    assert_ragged_rows_equal_each_prompt_alone,
    assert_same_greedy_tokens,
    family,
    graph_decoded,
    greedy_on_both_paths,
    ragged_graph_logits,
    reference_logits,
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


def cases(layout, *extra):
    """Both window shapes with fused projections at batch 3, then `extra` (window, stride, batch, step, compiled)."""
    group = family(f"eme-{layout}")
    every = [(window, stride, 3, "fused-projections", False) for window, stride in WINDOWS] + list(extra)
    return [pytest.param(layout, *case, marks=group) for case in every]


GRAPH_CASES = (cases("gla", (48, 20, 1, "fused-projections", True))
               + cases("gdn", (64, 16, 1, "fused-projections", True))
               + cases("lightning", (64, 16, 1, "eager", False)))


@pytest.mark.parametrize("layout,window,stride,batch,step,compile_decode", GRAPH_CASES)
def test_graph_decode_matches_model_forward(layout, window, stride, batch, step, compile_decode):
    """FP32_TOL as in test_engine_mixers_gpu.py (fla's TF32 in the engine's prefill; emulated on CPU for these
    layouts and windows: 3.1e-4 to 5.9e-4)."""
    model = small_model(LAYOUTS[layout])
    options = eme(window, stride)
    tokens = torch.randint(0, 1000, (batch, 300), device="cuda")
    full = reference_logits(model, tokens, options)
    engine = InferenceEngine(model, batch_size=batch, max_length=320, prefill_chunk=128 * batch, decode_step=step,
                             compile_decode=compile_decode, compile_prefill=False, inference_options=options)
    assert rel(graph_decoded(engine, tokens, 250), full[:, 249:]) <= FP32_TOL


@family("eme-gla")
def test_ragged_batch_equals_each_prompt_alone():
    model = small_model(["gla", "attention_rope", "gdn", "lightning"])
    options = eme(64, 16)
    prompts, steps, logits = ragged_graph_logits(model, 40, inference_options=options)
    assert_ragged_rows_equal_each_prompt_alone(model, prompts, steps, logits, options)


@pytest.mark.parametrize("scaling", [{}, {"logit_scaling": "off"},
                                     {"logit_scaling": "per_length", "logit_scaling_train_length": 64}],
                         ids=["per-query", "off", "per-length"])
def test_greedy_tokens_equal_transformers_generate(scaling):
    """Float32 and the pure-torch ops on both paths, as test_engine_mixers_gpu.py: identical tokens."""
    model = small_model(["lightning", "attention", "gla", "attention_rope"])
    model.inference_options = eme(64, 16, **scaling)
    assert_same_greedy_tokens(model, *greedy_on_both_paths(model))
