"""The inference engine on CUDA with GLA, GDN and sliding-window (SWA) layers: fla's chunked kernels in prefill with
the state carried between chunks, the torch decode steps and the window's ring under a captured CUDA graph, against
the model's own forward on the pure-torch ops; greedy tokens against transformers' generate.

Time: a process's first call of an fla kernel autotunes it for its key (chunk size, dtypes, which of state, final
state and packed sequences are given): on the first GPU run of these files a process's first GLA test took 147 s,
GDN 70 s, Lightning 44 s, nearly all of it compiling configurations, and the next test of a family ~1-8 s. Under
scripts/gpu-session/gpu-tests.sh (xdist, `--dist loadgroup`) the tests of one kernel family share a worker
(`family`), so each family is tuned once, and fla caches the choices on disk for the other workers; the reference
forwards run the pure-torch ops, so they tune nothing. Each mixer, the eager, fused and compiled decode steps and
batches of 1 and 3 keep a case; the CPU twins (test_engine_mixers.py, float64) cover every combination."""

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
# fp32 models. The engine's prefill runs fla's chunk kernels, whose products are TF32 (~1.5e-3 relative per op,
# docs/method.md, "Kernel notes"); the reference forward runs the pure-torch ops in fp32, and the decode steps are
# fp32. Emulated on CPU (the mixers' chunked products fed TF32-rounded operands, these shapes): 4.4e-4 to 5.4e-4 for
# the GLA, GDN and mixed layouts against the exact forward (6.8e-4 to 9.3e-4 against a forward whose mixers round
# alike: two rounded paths differ more than one from the exact).
FP32_TOL = 3e-3
# bf16 model against the fp32 forward: bf16 rounding (2^-9) of every activation through four blocks; fp32 states
# and gates.
BF16_TOL = 3e-2
# The engine on the pure-torch ops against the forward on them, both fp32: summation order alone (cuBLAS products
# of 2 rows against 224, recurrent steps against chunked forms). This model and these lengths in fp32 on CPU:
# 1.2e-6 relative, 2.8e-6 absolute at most; with decode attention's products rounded to TF32, 1.7e-4 and 2.8e-4.
FP32_ROUNDING_TOL = 1e-5
UNCOMPILED = {"compile_decode": False, "compile_prefill": False}


def family(name):
    """The xdist group of the tests whose first fla call tunes the kernels of `name` (see the module docstring)."""
    return pytest.mark.xdist_group(name=name)


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


def reference_logits(model, tokens, options=None):
    """The model's own forward (no cache) on the pure-torch ops, in the model's dtype: [B, T, V]."""
    with use_backend("torch"), torch.no_grad():
        return model(tokens, use_cache=False, inference_options=options).logits


def graph_decoded(engine, tokens, prompt_length):
    pieces = [engine.prefill(tokens[:, :prompt_length])]
    engine.capture_graph()
    assert engine.graph_captured
    for t in range(prompt_length, tokens.shape[1]):
        pieces.append(engine.decode(tokens[:, t : t + 1]).clone())
    return torch.stack(pieces, 1)


GRAPH_CASES = [
    pytest.param("gla", 3, "fused-projections", False, marks=family("gla")),
    pytest.param("mixed", 3, "fused-projections", False, marks=family("gla")),
    pytest.param("mixed", 1, "fused-projections", True, marks=family("gla")),
    pytest.param("gdn", 3, "fused-projections", False, marks=family("gdn")),
    pytest.param("gdn", 1, "eager", False, marks=family("gdn")),
    pytest.param("swa", 3, "fused-projections", False, marks=family("lightning")),
    pytest.param("swa", 1, "eager", False, marks=family("lightning")),
]


@pytest.mark.parametrize("layout,batch,step,compile_decode", GRAPH_CASES)
def test_graph_decode_matches_model_forward(layout, batch, step, compile_decode):
    """Prefill in chunks of 128 tokens a row (the window of 64 crosses chunk boundaries), then 50 graph-replayed
    decode steps: the capture's warm-up must leave the states and the window's ring as they were."""
    model = small_model(LAYOUTS[layout])
    tokens = torch.randint(0, 1000, (batch, 300), device="cuda")
    full = reference_logits(model, tokens)
    engine = InferenceEngine(model, batch_size=batch, max_length=320, prefill_chunk=128 * batch, decode_step=step,
                             compile_decode=compile_decode, compile_prefill=False)
    assert rel(graph_decoded(engine, tokens, 250), full[:, 249:]) <= FP32_TOL


@family("gla")
@pytest.mark.parametrize("step", ["fused-projections", "eager"])
def test_graph_decode_with_rnn_rope_matches_model_forward(step):
    """`gla_rope` / `gdn_rope`: fla's chunk kernels in prefill and the graph-captured decode steps take q and k
    rotated at each token's position, as the forward on the pure-torch ops."""
    model = small_model(LAYOUTS["mixed"], gla_rope=True, gdn_rope=True)
    tokens = torch.randint(0, 1000, (3, 300), device="cuda")
    full = reference_logits(model, tokens)
    engine = InferenceEngine(model, batch_size=3, max_length=320, prefill_chunk=384, decode_step=step, **UNCOMPILED)
    assert rel(graph_decoded(engine, tokens, 250), full[:, 249:]) <= FP32_TOL


@pytest.mark.parametrize("layout", [pytest.param("mixed", marks=family("bf16-gla-gdn")),
                                    pytest.param("swa", marks=family("lightning"))])
def test_bf16_graph_decode_matches_fp32_forward(layout):
    """bf16 tunes fla's kernels anew (another dtype): GLA's and GDN's in a group of their own, Lightning's after its
    fp32 tests. The same comparison in bf16 on CPU (pure-torch ops): 1.7e-2 (mixed), 1.6e-2 (swa)."""
    model = small_model(LAYOUTS[layout])
    tokens = torch.randint(0, 1000, (2, 300), device="cuda")
    full = reference_logits(model, tokens)
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


def assert_ragged_rows_equal_each_prompt_alone(model, prompts, steps, logits, options=None):
    for row, prompt in enumerate(prompts):
        alone = reference_logits(model, torch.cat([prompt, steps[row]])[None], options)[0, len(prompt) - 1:]
        assert rel(torch.stack([step[row] for step in logits]), alone) <= FP32_TOL, f"row {row}"


@family("gla")
def test_ragged_batch_equals_each_prompt_alone():
    """The rows of 3 and 40 tokens prefill through fla's GLA with fewer tokens than its chunk of 64 (padded to one
    chunk by `hyla.ops.gla.gpu`), the rows of 190 together."""
    model = small_model(LAYOUTS["mixed"])
    assert_ragged_rows_equal_each_prompt_alone(model, *ragged_graph_logits(model, 20))


GREEDY_PROMPT, GREEDY_NEW = 200, 24


def greedy_prompts():
    generator = torch.Generator(device="cuda").manual_seed(1)
    return torch.randint(3, 1000, (2, GREEDY_PROMPT), device="cuda", generator=generator)


def greedy_on_both_paths(model):
    """Greedy tokens of hyla.generate (graph-captured decode) and of transformers' generate for two random prompts
    of 200 tokens, both on the pure-torch ops."""
    ids = greedy_prompts()
    with use_backend("torch"):
        ours = hyla.generate(model, ids, max_new_tokens=GREEDY_NEW, **UNCOMPILED)
        theirs = model.hf_generate(ids, max_new_tokens=GREEDY_NEW, do_sample=False, pad_token_id=0)
    return ours, theirs


def first_difference(model, ours, theirs) -> str:
    """Where two greedy outputs [B, T] first differ: the new token's index, both tokens, and the reference forward's
    logits there (on the tokens both paths agree on): its top two and their gap, and how far each token is below
    the top. A gap below fp32 rounding is a tie; a token far below the top is a wrong path."""
    row, position = (ours != theirs).nonzero()[0].tolist()
    logits = reference_logits(model, ours[row : row + 1, :position])[0, -1].double()
    top = logits.topk(2)
    below = {name: (top.values[0] - logits[tokens[row, position]]).item()
             for name, tokens in (("hyla", ours), ("transformers", theirs))}
    return (f"row {row}, new token {position - GREEDY_PROMPT}: hyla {ours[row, position].item()}, transformers "
            f"{theirs[row, position].item()}; the forward's top two {top.indices.tolist()}, gap "
            f"{(top.values[0] - top.values[1]).item():.3g}; below its top: hyla's {below['hyla']:.3g}, "
            f"transformers' {below['transformers']:.3g}")


def assert_same_greedy_tokens(model, ours, theirs):
    assert ours.shape == theirs.shape
    assert torch.equal(ours, theirs), first_difference(model, ours, theirs)


@pytest.mark.parametrize("layout", ["mixed", "swa"])
def test_greedy_tokens_equal_transformers_generate(layout):
    """Float32 and the pure-torch ops on both paths, hyla's decode attention kernel with fp32 products: the logits
    differ by fp32 rounding (test_fp32_engine_on_torch_ops_matches_model_forward), 2.8e-6 at most measured for this
    model in fp32 on CPU, while the smallest gap between the forward's top two logits over the 48 greedy positions
    there was 1.2e-3 (median 0.08): the greedy tokens must be identical. On a mismatch the message gives the gap."""
    model = small_model(LAYOUTS[layout])
    assert_same_greedy_tokens(model, *greedy_on_both_paths(model))


@pytest.mark.parametrize("layout", ["mixed", "swa"])
def test_fp32_engine_on_torch_ops_matches_model_forward(layout):
    """What the greedy comparison rests on: with every op on its pure-torch form (fla's TF32 out of the way), the
    engine's graph-decoded fp32 logits are the forward's up to fp32 rounding (FP32_ROUNDING_TOL), batch 2 as
    hyla.generate runs it."""
    model = small_model(LAYOUTS[layout])
    tokens = torch.cat([greedy_prompts(), torch.randint(3, 1000, (2, GREEDY_NEW), device="cuda")], dim=1)
    engine = InferenceEngine(model, batch_size=2, max_length=256, decode_step="fused-projections", **UNCOMPILED)
    with use_backend("torch"):
        logits = graph_decoded(engine, tokens, GREEDY_PROMPT)
    assert rel(logits, reference_logits(model, tokens)[:, GREEDY_PROMPT - 1:]) <= FP32_ROUNDING_TOL
