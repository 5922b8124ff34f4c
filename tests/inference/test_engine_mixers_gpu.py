"""The inference engine on CUDA with GLA, GDN and sliding-window (SWA) layers: fla's chunked kernels in prefill with
the state carried between chunks, the torch decode steps and the window's ring under a captured CUDA graph, against
the model's own forward; greedy tokens against transformers' generate."""

import pytest
import torch

import hyla
from hyla import HypeNetConfig, HypeNetForCausalLM
from hyla.inference import InferenceEngine
from hyla.ops.dispatch import use_backend

pytestmark = pytest.mark.gpu

LAYOUTS = {
    "gla": ["gla", "attention", "gla", "gla"],
    "gdn": ["gdn", "attention", "gdn", "gdn"],
    "swa": ["swa", "attention", "swa", "lightning"],
    "mixed": ["gla", "swa", "gdn", "attention"],
}
# fp32 models; fla's chunk kernels (GLA, GDN, Lightning) run their matmuls in TF32 (~1.5e-3, docs/method.md,
# "Kernel notes"), on the model's path and the engine's alike but over different chunk boundaries.
FP32_TOL = 3e-3
# bf16 model against its own fp32 forward: bf16 rounding (2^-9) of every activation through four blocks, and the
# model's bf16 forward rounds as much; fp32 states and gates on both.
BF16_TOL = 3e-2
UNCOMPILED = {"compile_decode": False, "compile_prefill": False}


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def small_model(layer_types, **overrides):
    torch.manual_seed(0)
    config = HypeNetConfig(
        vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=len(layer_types),
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, layer_types=layer_types, swa_window=64,
        attention_logit_scaling_a=500.0, attention_output_gate=True, attention_qk_norm=True, **overrides,
    )
    return HypeNetForCausalLM(config).to("cuda", torch.float32).eval()


def graph_decoded(engine, tokens, prompt_length):
    pieces = [engine.prefill(tokens[:, :prompt_length])]
    engine.capture_graph()
    for t in range(prompt_length, tokens.shape[1]):
        pieces.append(engine.decode(tokens[:, t : t + 1]).clone())
    return torch.stack(pieces, 1)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("batch,step,compile_decode", [(1, "eager", False), (3, "fused-projections", False),
                                                       (1, "fused-projections", True)])
def test_graph_decode_matches_model_forward(layout, batch, step, compile_decode):
    """Prefill in chunks of 128 tokens a row (the window of 64 crosses chunk boundaries), then 50 graph-replayed
    decode steps: the capture's warm-up must leave the states and the window's ring as they were."""
    model = small_model(LAYOUTS[layout])
    tokens = torch.randint(0, 1000, (batch, 300), device="cuda")
    with torch.no_grad():
        full = model(tokens, use_cache=False).logits
    engine = InferenceEngine(model, batch_size=batch, max_length=320, prefill_chunk=128 * batch, decode_step=step,
                             compile_decode=compile_decode, compile_prefill=False)
    assert rel(graph_decoded(engine, tokens, 250), full[:, 249:]) <= FP32_TOL


@pytest.mark.parametrize("layout", ["mixed", "swa"])
def test_bf16_graph_decode_matches_fp32_forward(layout):
    model = small_model(LAYOUTS[layout])
    tokens = torch.randint(0, 1000, (2, 300), device="cuda")
    with torch.no_grad():
        full = model(tokens, use_cache=False).logits
    model = model.bfloat16()
    engine = InferenceEngine(model, batch_size=2, max_length=320, prefill_chunk=256, **UNCOMPILED)
    assert engine.cache.states and all(s.dtype == torch.float32 for s in engine.cache.states.values())
    assert rel(graph_decoded(engine, tokens, 250), full[:, 249:]) <= BF16_TOL


def ragged_graph_logits(model, num_steps, **engine_options):
    """Prompts of 40, 190, 190 and 3 tokens left-padded into one batch, prefilled, then `num_steps` given tokens
    decoded through a captured graph: (prompts, steps [4, num_steps], logits per step, the prefill's first)."""
    lengths = [40, 190, 190, 3]
    prompts = [torch.randint(3, 1000, (n,), device="cuda") for n in lengths]
    ids = torch.zeros(len(prompts), max(lengths), dtype=torch.long, device="cuda")
    mask = torch.zeros_like(ids)
    for row, prompt in enumerate(prompts):
        ids[row, -len(prompt):], mask[row, -len(prompt):] = prompt, 1
    steps = torch.randint(3, 1000, (len(prompts), num_steps), device="cuda")
    engine = InferenceEngine(model, batch_size=len(prompts), max_length=256, prefill_chunk=256,
                             decode_step="fused-projections", **engine_options, **UNCOMPILED)
    logits = [engine.prefill(ids, mask)]
    engine.capture_graph()
    logits += [engine.decode(steps[:, t : t + 1]).clone() for t in range(steps.shape[1])]
    return prompts, steps, logits


def greedy_on_both_paths(model):
    """Greedy tokens of hyla.generate (graph-captured decode) and of transformers' generate for two random prompts
    of 200 tokens, both on the pure-torch ops."""
    generator = torch.Generator(device="cuda").manual_seed(1)
    ids = torch.randint(3, 1000, (2, 200), device="cuda", generator=generator)
    with use_backend("torch"):
        ours = hyla.generate(model, ids, max_new_tokens=24, **UNCOMPILED)
        theirs = model.hf_generate(ids, max_new_tokens=24, do_sample=False, pad_token_id=0)
    return ours, theirs


def test_ragged_batch_equals_each_prompt_alone():
    model = small_model(LAYOUTS["mixed"])
    prompts, steps, logits = ragged_graph_logits(model, 20)
    for row, prompt in enumerate(prompts):
        with torch.no_grad():
            alone = model(torch.cat([prompt, steps[row]])[None], use_cache=False).logits[0, len(prompt) - 1:]
        assert rel(torch.stack([step[row] for step in logits]), alone) <= FP32_TOL, f"row {row}"


@pytest.mark.parametrize("layout", ["mixed", "swa"])
def test_greedy_tokens_equal_transformers_generate(layout):
    """Float32 and the pure-torch ops on both paths (no TF32): the logits differ by ~1e-6 against gaps of ~0.1
    between a random model's top two logits, so greedy tokens must be identical. hyla.generate captures its decode
    step in a CUDA graph."""
    ours, theirs = greedy_on_both_paths(small_model(LAYOUTS[layout]))
    assert torch.equal(ours, theirs)
