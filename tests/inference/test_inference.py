"""The fast inference path (static cache, chunked prefill, single-token decode, ragged batches) against the model's own
forward, its attention pieces against the written-out softmax reference, and its settings. CPU, pure torch."""

import math

import pytest
import torch

from hyla import HypeNetConfig, HypeNetForCausalLM, InferenceOptions
from hyla.inference import InferenceEngine
from hyla.ops.chunk_attention import attention_with_lse, attention_with_lse_reference, chunk_attention
from hyla.ops.decode_attention import decode_attention_reference
from hyla.ops.attention import softmax_attention_reference

# float64 model and references: the only differences are summation order, far below 1e-9.
TOL = 1e-9


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def tiny_model(**overrides):
    torch.manual_seed(0)
    settings = dict(
        vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, layer_types=["lightning", "attention", "lightning", "attention"],
        attention_logit_scaling_a=5.0, attention_output_gate=True, attention_qk_norm=True, attention_gate_init_bias=0.0,
    )
    settings.update(overrides)
    model = HypeNetForCausalLM(HypeNetConfig(**settings)).double().eval()
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "init_bias"):
                module.weight.normal_(0.0, 0.1)
    return model


MODELS = {
    "hypenet": {},
    "all-attention-rope": dict(layer_types=["attention_rope"] * 4, attention_logit_scaling_a=None,
                               attention_output_gate=False),
    "rope-layers": dict(layer_types=["lightning", "attention_rope", "attention", "lightning"]),
}


MODELS["biases-no-gates"] = dict(qkv_bias=True, attention_output_gate=False, lightning_output_gate=False)


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("chunk,fused", [(7, False), (64, False), (7, True)])
def test_prefill_and_decode_match_model_forward(name, chunk, fused):
    model = tiny_model(**MODELS[name])
    if name == "biases-no-gates":
        assert model.model.layers[0].mixer.gate_projection() is None and model.model.layers[0].mixer.q_proj.bias is not None
        with torch.no_grad():  # biases start at zero: make them count
            for block in model.model.layers:
                for linear in (block.mixer.q_proj, block.mixer.k_proj, block.mixer.v_proj):
                    linear.bias.normal_(0.0, 0.5)
    tokens = torch.randint(0, 101, (2, 29), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(tokens, use_cache=False).logits
    engine = InferenceEngine(model, batch_size=2, max_length=40, prefill_chunk=chunk,
                             decode_step="fused-projections" if fused else "eager")
    assert all((f is not None) == fused for f in engine.step.fused)
    logits = [engine.prefill(tokens[:, :21])]
    for t in range(21, 29):
        logits.append(engine.decode(tokens[:, t : t + 1]))
    assert engine.num_cached == 29 and engine.cache.length.tolist() == [29, 29]
    assert rel(torch.stack(logits, 1), full[:, 20:]) <= TOL


@pytest.mark.parametrize("options", [
    InferenceOptions(logit_scaling="off"), InferenceOptions(logit_scaling_a=50.0),
    InferenceOptions(logit_scaling="per_length", logit_scaling_train_length=4),
], ids=["off", "other-a", "per-length"])
@pytest.mark.parametrize("fused", [False, True])
def test_the_engine_runs_under_the_inference_options_of_the_model_forward(options, fused):
    model = tiny_model(layer_types=["lightning", "attention", "attention_rope", "attention"])
    tokens = torch.randint(0, 101, (2, 29), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(tokens, use_cache=False, inference_options=options).logits
        plain = model(tokens, use_cache=False).logits
    assert rel(full, plain) > 1e-6  # the options change the logits
    engine = InferenceEngine(model, batch_size=2, max_length=40, prefill_chunk=7, inference_options=options,
                             decode_step="fused-projections" if fused else "eager")
    logits = [engine.prefill(tokens[:, :21])]
    for t in range(21, 29):
        logits.append(engine.decode(tokens[:, t : t + 1]))
    assert rel(torch.stack(logits, 1), full[:, 20:]) <= TOL


def test_greedy_generation_continues_like_the_model():
    model = tiny_model()
    prompt = torch.randint(0, 101, (1, 12), generator=torch.Generator().manual_seed(2))
    engine = InferenceEngine(model, batch_size=1, max_length=20, prefill_chunk=5)
    engine.prefill(prompt)
    generated = engine.generate_greedy(6)
    sequence = prompt
    with torch.no_grad():
        for _ in range(6):
            next_token = model(sequence, use_cache=False).logits[:, -1].argmax(-1, keepdim=True)
            sequence = torch.cat([sequence, next_token], dim=1)
    assert torch.equal(generated, sequence[:, 12:])


def test_engine_refuses_overflow_and_unknown_layers():
    model = tiny_model()
    engine = InferenceEngine(model, batch_size=1, max_length=8)
    with pytest.raises(ValueError, match="exceed max_length"):
        engine.prefill(torch.zeros(1, 9, dtype=torch.long))
    with pytest.raises(ValueError, match="batch"):
        engine.prefill(torch.zeros(2, 3, dtype=torch.long))
    model.config.layer_types = ["lightning", "hh_lightning", "lightning", "attention"]
    with pytest.raises(ValueError, match="hh_lightning"):
        InferenceEngine(model, batch_size=1, max_length=8)


@pytest.mark.parametrize("name", ["hypenet", "biases-no-gates"])
def test_every_decode_product_goes_through_the_matvec_function(name):
    """With fused projections, each block's 4 products (fused mixer map, o_proj, fused gate/up, down_proj) and the
    LM head go through the engine's matrix-vector function (hyla's Triton kernel under matvec="triton"), and the
    logits stay the model's. Here a counting float64 product stands in for the kernel."""
    model = tiny_model(**MODELS[name])
    tokens = torch.randint(0, 101, (1, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        full = model(tokens, use_cache=False).logits
    engine = InferenceEngine(model, batch_size=1, max_length=24, prefill_chunk=8, decode_step="fused-projections")
    assert engine.step.linear is None  # cuBLAS (F.linear) by default
    calls = []

    def counting_linear(x, weight, bias=None):
        calls.append(tuple(weight.shape))
        out = x @ weight.T
        return out if bias is None else out + bias

    engine.step.linear = counting_linear
    logits = [engine.prefill(tokens[:, :16])]
    for t in range(16, 20):
        logits.append(engine.decode(tokens[:, t : t + 1]))
    assert len(calls) == 4 * (4 * len(model.model.layers) + 1)
    assert calls.count(tuple(model.lm_head.weight.shape)) == 4
    assert rel(torch.stack(logits, 1), full[:, 15:]) <= TOL


def test_settings_refuse_what_cannot_run():
    model = tiny_model()
    with pytest.raises(ValueError, match="decode_step must be one of"):
        InferenceEngine(model, batch_size=1, max_length=8, decode_step="cutlass")
    with pytest.raises(ValueError, match="sets the products of decode_step='fused-projections'"):
        InferenceEngine(model, batch_size=1, max_length=8, matvec="triton")
    with pytest.raises(ValueError, match="needs a CUDA device with triton"):
        InferenceEngine(model, batch_size=1, max_length=8, decode_step="fused-projections", matvec="triton")
    with pytest.raises(ValueError, match="launch_pdl applies to decode_step='triton-fused'"):
        InferenceEngine(model, batch_size=1, max_length=8, decode_step="fused-projections", launch_pdl=True)
    # head_dim 16: the fused Lightning step needs multiples of 32; batch 2: it decodes one sequence
    with pytest.raises(ValueError, match="multiple of 32"):
        InferenceEngine(model, batch_size=1, max_length=8, decode_step="triton-fused")
    with pytest.raises(ValueError, match="batch_size=1"):
        InferenceEngine(model, batch_size=2, max_length=8, decode_step="triton-fused")
    assert not InferenceEngine(model, batch_size=1, max_length=8, decode_step="fused-projections").launch_pdl


def _sweep_result(n, k, bias, cublas_us, fastest):
    return {"n": n, "k": k, "bias": bias, "cublas_us": cublas_us, "fastest": fastest}


def test_matvec_table_keeps_the_kernel_only_where_it_beat_cublas(tmp_path):
    """matvec_table_from_sweep reads a matvec sweep's JSON: a shape's fastest setting where it was faster than
    cuBLAS, None (cuBLAS) where it was slower, had no checked setting, or where one shape with and without a bias
    disagree."""
    import json

    from hyla.inference.settings import matvec_table_from_sweep
    from hyla.ops.matvec import MatvecConfig

    def load_table(path):
        return dict(matvec_table_from_sweep(path))

    fast = {"block_n": 4, "block_k": 1024, "num_warps": 8, "num_stages": 3, "us": 9.0, "tb_per_s": 3.9}
    results = [
        _sweep_result(12288, 2048, False, 15.5, fast),
        _sweep_result(2048, 2048, False, 5.0, {**fast, "us": 5.5}),
        _sweep_result(151936, 2048, False, 150.0, None),
        _sweep_result(6144, 2048, False, 11.0, fast),
        _sweep_result(6144, 2048, True, 11.0, {**fast, "block_n": 8}),
    ]
    path = tmp_path / "matvec-sweep.json"
    path.write_text(json.dumps({"device": "x", "results": results}))
    table = load_table(path)
    assert table == {(12288, 2048): MatvecConfig(block_n=4, block_k=1024, num_warps=8, num_stages=3),
                     (2048, 2048): None, (151936, 2048): None, (6144, 2048): None}
    path.write_text(json.dumps({"results": [{"n": 1}]}))
    with pytest.raises(ValueError, match="not a matvec sweep result"):
        load_table(path)
    with pytest.raises(ValueError, match="not a matvec sweep result"):
        load_table(tmp_path / "missing.json")


@pytest.mark.slow
@pytest.mark.parametrize("fused", [False, True])
def test_compiled_decode_blocks_match_model_forward(fused):
    # torch.compile traces the same block functions on CPU as on CUDA (inductor emits C++ here, Triton there).
    model = tiny_model(num_hidden_layers=2, layer_types=["lightning", "attention"])
    tokens = torch.randint(0, 101, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        full = model(tokens, use_cache=False).logits
    engine = InferenceEngine(model, batch_size=2, max_length=16, prefill_chunk=5, compile_decode=True,
                             decode_step="fused-projections" if fused else "eager")
    logits = [engine.prefill(tokens[:, :9])] + [engine.decode(tokens[:, t : t + 1]) for t in range(9, 12)]
    assert rel(torch.stack(logits, 1), full[:, 8:]) <= TOL


@pytest.mark.slow
def test_compiled_prefill_matches_model_forward():
    # Chunks of 5, 5 and 3 tokens a row (10 tokens a call over 2 rows: the block functions take 10, 10 and 6
    # tokens, their length symbolic); a later prompt of another length must still be right. The layers include RoPE
    # attention, NoPE attention with logit scaling and Lightning.
    model = tiny_model(layer_types=["lightning", "attention_rope", "attention", "lightning"])
    tokens = torch.randint(0, 101, (2, 16), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        full = model(tokens, use_cache=False).logits
    engine = InferenceEngine(model, batch_size=2, max_length=20, prefill_chunk=10, compile_prefill=True)
    logits = [engine.prefill(tokens[:, :13])] + [engine.decode(tokens[:, t : t + 1]) for t in range(13, 16)]
    assert rel(torch.stack(logits, 1), full[:, 12:]) <= TOL
    engine.reset()
    assert rel(engine.prefill(tokens[:, :11]), full[:, 10]) <= TOL


@pytest.mark.slow
def test_compiled_prefill_compiles_once_for_every_prompt_length():
    # An evaluation's prompts all differ in length: after the first prompt, no length compiles anything new.
    from torch._dynamo.utils import counters

    model = tiny_model(layer_types=["lightning", "attention", "lightning", "attention_rope"])
    engine = InferenceEngine(model, batch_size=1, max_length=40, prefill_chunk=64, compile_prefill=True)
    tokens = torch.randint(0, 101, (1, 40), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        full = model(tokens, use_cache=False).logits
    torch._dynamo.reset()
    counters.clear()
    engine.prefill(tokens[:, :17])
    first = counters["stats"]["unique_graphs"]
    assert first > 0
    for length in (23, 30, 11):
        engine.reset()
        assert rel(engine.prefill(tokens[:, :length]), full[:, length - 1]) <= TOL
    assert counters["stats"]["unique_graphs"] == first


# GLA's and GDN's gates are float32 even in a float64 model: one float32 ulp of a gate reaches the logits at ~1e-8
# (tests/inference/test_engine_mixers.py, TOL); a wrong state, cache slot or row moves them by more than 1e-3.
MIXED_TOL = 1e-6


@pytest.mark.parametrize("backend", ["eager", pytest.param("inductor", marks=pytest.mark.slow)])
# Past its recompile limit dynamo would run the blocks uncompiled, compiling nothing new: an error instead.
@torch._dynamo.config.patch(fail_on_recompile_limit_hit=True)
def test_compiled_prefill_compiles_one_graph_per_kind_of_block_for_every_batch(backend, monkeypatch, request):
    """An evaluation prefills prompts of every length in batches of several rows (its warm-up one row, its last
    batch fewer, a ragged batch in runs of fewer rows): the first prompt compiles one graph per kind of block in each
    prefill function, and no later row count, length or chunking compiles anything new. backend="eager": dynamo's
    own guards, which decide what recompiles, without inductor's code generation; "inductor": the engine's own."""
    from torch._dynamo.utils import counters

    from hyla.compile import raise_recompile_limits
    from hyla.inference import engine as engine_module

    request.addfinalizer(torch._dynamo.reset)
    if backend == "eager":
        def compiled(function, **options):
            raise_recompile_limits()  # as the engine's own `compiled`
            return torch.compile(function, backend="eager", **options)

        monkeypatch.setattr(engine_module, "compiled", compiled)
    kinds = ["lightning", "attention", "gla", "gdn", "swa", "attention_rope"]
    model = tiny_model(layer_types=kinds, num_hidden_layers=len(kinds), swa_window=5, gla_gate_low_rank_dim=8)
    tokens = torch.randint(1, 101, (3, 40), generator=torch.Generator().manual_seed(8))
    with torch.no_grad():
        full = model(tokens, use_cache=False).logits

    def prefill(rows, length, chunk):
        engine = InferenceEngine(model, batch_size=rows, max_length=40, prefill_chunk=chunk, compile_prefill=True)
        return engine.prefill(tokens[:rows, :length])

    torch._dynamo.reset()
    counters.clear()
    assert rel(prefill(1, 17, 64), full[:1, 16]) <= MIXED_TOL
    assert counters["stats"]["unique_graphs"] == 2 * len(kinds)
    # (rows, prompt length, prefill_chunk): chunk 8 a row splits 17 tokens 8 + 7 + 2, never a one-token chunk.
    for rows, length, chunk in [(2, 23, 64), (3, 9, 64), (1, 30, 64), (3, 31, 64), (1, 17, 8), (2, 17, 16),
                                (3, 40, 30)]:
        assert rel(prefill(rows, length, chunk), full[:rows, length - 1]) <= MIXED_TOL, (rows, length, chunk)
    # Left-padded rows of 12, 12 and 7 tokens: runs of two rows and of one.
    counts = [12, 12, 7]
    ids = torch.zeros(3, 12, dtype=torch.long)
    mask = torch.zeros(3, 12, dtype=torch.long)
    for row, count in enumerate(counts):
        ids[row, 12 - count :], mask[row, 12 - count :] = tokens[row, :count], 1
    engine = InferenceEngine(model, batch_size=3, max_length=40, prefill_chunk=64, compile_prefill=True)
    expected = torch.stack([full[row, count - 1] for row, count in enumerate(counts)])
    assert rel(engine.prefill(ids, mask), expected) <= MIXED_TOL
    assert counters["stats"]["unique_graphs"] == 2 * len(kinds)
    # A one-token prompt in a row of its own: one more graph per kind (dynamo specialises a size of 1), once.
    for _ in range(2):
        assert rel(prefill(1, 1, 64), full[:1, 0]) <= MIXED_TOL
    assert counters["stats"]["unique_graphs"] == 4 * len(kinds)


def test_prefill_chunks_are_never_of_one_token_but_for_a_one_token_prompt():
    from hyla.inference.engine import _chunk_bounds

    assert _chunk_bounds(17, 8) == [(0, 8), (8, 15), (15, 17)]
    assert _chunk_bounds(16, 8) == [(0, 8), (8, 16)]
    assert _chunk_bounds(9, 64) == [(0, 9)]
    assert _chunk_bounds(1, 8) == [(0, 1)]
    # Chunks of two leave a last token alone: the chunk before it cannot give one up.
    assert _chunk_bounds(5, 2) == [(0, 2), (2, 4), (4, 5)]


def test_decode_attention_reference_matches_softmax_over_valid_prefix():
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(3, 8, 16, generator=gen, dtype=torch.float64)
    keys = torch.randn(3, 2, 50, 16, generator=gen, dtype=torch.float64)
    values = torch.randn(3, 2, 50, 16, generator=gen, dtype=torch.float64)
    length = torch.tensor(37)
    out = decode_attention_reference(q, keys, values, length, scale=0.25)
    ref = softmax_attention_reference(
        q[:, None], keys[:, :, :37].transpose(1, 2), values[:, :, :37].transpose(1, 2), scale=0.25
    )[:, 0]
    assert rel(out, ref) <= TOL


@pytest.mark.parametrize("start", [0, 1, 13])
def test_chunk_attention_merges_prefix_and_diagonal_exactly(start):
    gen = torch.Generator().manual_seed(start)
    chunk, heads, kv_heads, dim = 9, 6, 2, 8
    q = torch.randn(2, chunk, heads, dim, generator=gen, dtype=torch.float64)
    keys = torch.randn(2, kv_heads, start + chunk + 4, dim, generator=gen, dtype=torch.float64)
    values = torch.randn(2, kv_heads, start + chunk + 4, dim, generator=gen, dtype=torch.float64)
    out = chunk_attention(q, keys, values, start=start, scale=0.3, backend="torch")
    visible = slice(0, start + chunk)
    ref = softmax_attention_reference(
        q, keys[:, :, visible].transpose(1, 2), values[:, :, visible].transpose(1, 2), scale=0.3
    )
    assert rel(out, ref) <= TOL


def test_bucket_lengths_add_at_most_a_sixteenth_and_cover_nearby_lengths():
    from hyla.ops.chunk_attention import bucket_length

    for length in [1, 5, 127, 128, 129, 1000, 4095, 4097, 65403, 65536, 65537, 300_001]:
        bucket = bucket_length(length)
        assert length <= bucket and bucket == bucket_length(bucket) and bucket % 128 == 0
        assert bucket - length < max(128, 2 ** (math.ceil(math.log2(length)) - 4))
        assert length <= 1024 or bucket - length < length / 8
    assert {bucket_length(n) for n in (61441, 65403, 65406, 65408, 65536)} == {65536}  # RULER's 64K prompts: one


@pytest.mark.parametrize("causal,queries,keys_", [(True, 37, 37), (True, 128, 128), (False, 37, 300), (False, 5, 7)])
def test_attention_padded_to_a_bucket_equals_the_unpadded_on_the_real_rows(causal, queries, keys_):
    """cudnn-padded's padding (`padded_to_bucket`), through the float64 reference: the real queries' outputs and
    log-sum-exps equal those of the unpadded problem (causal: the zero keys past the end are masked for them;
    otherwise only the queries are padded), and the kernel saw bucketed lengths."""
    from hyla.ops.chunk_attention import bucket_length, padded_to_bucket

    gen = torch.Generator().manual_seed(queries)
    q = torch.randn(2, 3, queries, 8, generator=gen, dtype=torch.float64)
    k = torch.randn(2, 3, keys_, 8, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 3, keys_, 8, generator=gen, dtype=torch.float64)
    seen = []

    def run(q_, k_, v_):
        seen.append((q_.shape[2], k_.shape[2]))
        return attention_with_lse_reference(q_, k_, v_, causal=causal, scale=0.3)

    out, lse = padded_to_bucket(q, k, v, causal=causal, run=run)
    want, want_lse = attention_with_lse_reference(q, k, v, causal=causal, scale=0.3)
    assert seen == [(bucket_length(queries), bucket_length(keys_) if causal else keys_)]
    assert out.shape == want.shape and lse.shape == want_lse.shape
    assert rel(out, want) <= TOL and rel(lse, want_lse) <= TOL
    if causal:
        with pytest.raises(ValueError, match="square"):
            padded_to_bucket(q, k[:, :, :-1], v[:, :, :-1], causal=True, run=run)


def test_attention_with_lse_rejects_unknown_backend():
    q = torch.randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match="backend"):
        attention_with_lse(q, q, q, causal=True, scale=1.0, backend="xformers")


def test_prefill_attention_backend_follows_device_and_dtype():
    from hyla.ops.chunk_attention import pick_attention_backend

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert pick_attention_backend("auto", cuda, torch.bfloat16) == "cudnn"
    assert pick_attention_backend("auto", cuda, torch.float16) == "cudnn"
    # cuDNN's and flash's fused kernels take half precision only: a float32 model on CUDA gets the torch path.
    assert pick_attention_backend("auto", cuda, torch.float32) == "torch"
    assert pick_attention_backend("auto", cpu, torch.bfloat16) == "torch"
    assert pick_attention_backend("flash", cuda, torch.bfloat16) == "flash"
    with pytest.raises(ValueError, match="needs a CUDA model in float16 or bfloat16"):
        pick_attention_backend("cudnn", cuda, torch.float32)
    with pytest.raises(ValueError, match="must be auto or one of"):
        pick_attention_backend("sdpa", cpu, torch.float32)


def test_decode_attention_takes_triton_only_for_heads_its_tiles_fit():
    from hyla.ops.decode_attention import resolve_kernel, triton_available

    cuda = torch.device("cuda")  # a device object only: nothing runs on it
    if triton_available():
        assert resolve_kernel("auto", cuda, 64) == "triton"
        assert resolve_kernel("auto", cuda, None) == "triton"
        # tl.dot needs an inner dimension >= 16; tl.arange a power of two
        assert resolve_kernel("auto", cuda, 8) == "torch" and resolve_kernel("auto", cuda, 80) == "torch"
        with pytest.raises(ValueError, match="power of two >= 16, got 8"):
            resolve_kernel("triton", cuda, 8)
    assert resolve_kernel("auto", torch.device("cpu"), 64) == "torch"
