"""The fast inference path on CUDA: the Triton decode kernel, the fused chunk attention, and graph-captured decode,
each against its pure-torch reference."""

import pytest
import torch

from hyla import HypeNetConfig, HypeNetForCausalLM, InferenceOptions
from hyla.inference import InferenceEngine
from hyla.ops.chunk_attention import chunk_attention
from hyla.ops.decode_attention import decode_attention, decode_attention_reference

pytestmark = pytest.mark.gpu

# bf16 inputs and outputs, fp32 accumulation in the kernel: bf16 rounding of the scaled query, of the probabilities
# fed to the second product and of the output (each ~2^-9 relative).
BF16_TOL = 1e-2


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


@pytest.mark.parametrize("batch,heads,kv_heads,max_length,length", [
    (1, 16, 8, 4096, 1), (1, 16, 8, 4096, 4096), (3, 16, 8, 5000, 2777), (2, 4, 4, 300, 65), (32, 16, 8, 1024, 999),
])
def test_triton_decode_matches_reference(batch, heads, kv_heads, max_length, length):
    gen = torch.Generator(device="cuda").manual_seed(length)
    q = torch.randn(batch, heads, 128, device="cuda", generator=gen).bfloat16()
    keys = torch.randn(batch, kv_heads, max_length, 128, device="cuda", generator=gen).bfloat16()
    values = torch.randn(batch, kv_heads, max_length, 128, device="cuda", generator=gen).bfloat16()
    # Poison past the valid length: the kernel must never read it.
    keys[:, :, length:] = float("nan")
    values[:, :, length:] = float("nan")
    valid = torch.tensor(length, device="cuda")
    out = decode_attention(q, keys, values, valid, scale=128**-0.5)
    ref = decode_attention_reference(q.double(), keys[:, :, :length].double(), values[:, :, :length].double(),
                                     length, scale=128**-0.5)
    assert torch.isfinite(out).all()
    assert rel(out, ref) <= BF16_TOL


@pytest.mark.parametrize("head_dim", [64, 128])
def test_float32_triton_decode_keeps_float32_products(head_dim):
    """fp32 inputs get IEEE fp32 products (`hyla.ops.decode_attention.gpu.dot_precision`), not Triton's default TF32
    (3.7e-4 off in the interpreter's emulation, tests/ops/test_kernels_interpreted.py): only fp32 summation order
    differs from the float64 reference, 2.0e-7 there; 1e-5 leaves room for longer sums and stays 30x below TF32."""
    gen = torch.Generator(device="cuda").manual_seed(head_dim)
    lengths = [1, 300, 4096]
    q = torch.randn(3, 8, head_dim, device="cuda", generator=gen)
    keys, values = (torch.randn(3, 2, 4096, head_dim, device="cuda", generator=gen) for _ in range(2))
    out = decode_attention(q, keys, values, torch.tensor(lengths, device="cuda"), scale=head_dim**-0.5)
    for row, length in enumerate(lengths):
        ref = decode_attention_reference(q[row:row + 1].double(), keys[row:row + 1, :, :length].double(),
                                         values[row:row + 1, :, :length].double(), length, scale=head_dim**-0.5)
        assert rel(out[row:row + 1], ref) <= 1e-5, f"row {row}"


def test_triton_decode_reads_each_rows_own_length():
    """Rows of a ragged batch hold different lengths (engine prefill of a left-padded batch): each row reads only its
    own positions, NaN past them."""
    gen = torch.Generator(device="cuda").manual_seed(11)
    lengths = [1, 700, 4096, 2777]
    q = torch.randn(4, 16, 128, device="cuda", generator=gen).bfloat16()
    keys = torch.randn(4, 8, 4096, 128, device="cuda", generator=gen).bfloat16()
    values = torch.randn(4, 8, 4096, 128, device="cuda", generator=gen).bfloat16()
    for row, length in enumerate(lengths):
        keys[row, :, length:] = float("nan")
        values[row, :, length:] = float("nan")
    out = decode_attention(q, keys, values, torch.tensor(lengths, device="cuda"), scale=128**-0.5)
    assert torch.isfinite(out).all()
    for row, length in enumerate(lengths):
        ref = decode_attention_reference(q[row:row + 1].double(), keys[row:row + 1, :, :length].double(),
                                         values[row:row + 1, :, :length].double(), length, scale=128**-0.5)
        assert rel(out[row:row + 1], ref) <= BF16_TOL, f"row {row}"


@pytest.mark.parametrize("block_n,num_warps,num_stages,programs_per_sm", [(32, 8, 2, 1), (128, 8, 4, 8), (64, 4, 3, 2)])
def test_triton_decode_launch_settings_match_reference(block_n, num_warps, num_stages, programs_per_sm):
    """Settings that `hyla bench sweep decode-attention` may pick, with the NaN poison past the valid length."""
    from hyla.ops.decode_attention import DecodeKernelConfig
    from hyla.ops.decode_attention.gpu import decode_attention_triton

    config = DecodeKernelConfig(block_n=block_n, num_warps=num_warps, num_stages=num_stages,
                                programs_per_sm=programs_per_sm)
    gen = torch.Generator(device="cuda").manual_seed(block_n)
    q = torch.randn(2, 16, 128, device="cuda", generator=gen).bfloat16()
    keys = torch.randn(2, 8, 5000, 128, device="cuda", generator=gen).bfloat16()
    values = torch.randn(2, 8, 5000, 128, device="cuda", generator=gen).bfloat16()
    keys[:, :, 2777:] = float("nan")
    values[:, :, 2777:] = float("nan")
    out = decode_attention_triton(q, keys, values, torch.tensor(2777, device="cuda"), scale=128**-0.5,
                                  config=config)
    ref = decode_attention_reference(q.double(), keys[:, :, :2777].double(), values[:, :, :2777].double(), 2777,
                                     scale=128**-0.5)
    assert torch.isfinite(out).all()
    assert rel(out, ref) <= BF16_TOL


@pytest.mark.parametrize("backend", ["cudnn", "cudnn-padded", "flash"])
@pytest.mark.parametrize("start", [0, 640, 1000])
def test_fused_chunk_attention_matches_reference(backend, start):
    gen = torch.Generator(device="cuda").manual_seed(start)
    chunk = 377  # not a bucket length: cudnn-padded pads it to 384
    q = torch.randn(2, chunk, 16, 128, device="cuda", generator=gen).bfloat16()
    keys = torch.randn(2, 8, start + chunk, 128, device="cuda", generator=gen).bfloat16()
    values = torch.randn(2, 8, start + chunk, 128, device="cuda", generator=gen).bfloat16()
    out = chunk_attention(q, keys, values, start=start, scale=128**-0.5, backend=backend)
    ref = chunk_attention(q.double(), keys.double(), values.double(), start=start, scale=128**-0.5, backend="torch")
    assert rel(out, ref) <= BF16_TOL


def small_model(layer_types, **overrides):
    torch.manual_seed(0)
    config = HypeNetConfig(
        vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=len(layer_types),
        num_attention_heads=4, num_key_value_heads=2, head_dim=64, layer_types=layer_types,
        attention_logit_scaling_a=500.0, attention_output_gate=True, attention_qk_norm=True, **overrides,
    )
    return HypeNetForCausalLM(config).to("cuda", torch.float32).eval()


@pytest.mark.parametrize("compile_decode", [False, True])
@pytest.mark.parametrize("batch", [1, 3])
def test_graph_decode_matches_model_forward(batch, compile_decode):
    model = small_model(["lightning", "attention", "lightning", "lightning"])
    tokens = torch.randint(0, 1000, (batch, 300), device="cuda")
    with torch.no_grad():
        full = model(tokens, use_cache=False).logits
    engine = InferenceEngine(model, batch_size=batch, max_length=320, prefill_chunk=128 * batch, decode_step="eager",
                             compile_decode=compile_decode, compile_prefill=False)
    pieces = [engine.prefill(tokens[:, :250])]
    engine.capture_graph()
    for t in range(250, 300):
        pieces.append(engine.decode(tokens[:, t : t + 1]).clone())
    # fp32 model; fla's chunk kernel runs its matmuls in TF32 (~1.5e-3, docs/method.md, "Kernel notes").
    assert rel(torch.stack(pieces, 1), full[:, 249:]) <= 3e-3


@pytest.mark.parametrize("options", [None, InferenceOptions(logit_scaling_a=50.0),
                                     InferenceOptions(logit_scaling="per_length", logit_scaling_train_length=64)],
                         ids=["default", "per-query-a50", "per-length-L0-64"])
def test_compiled_prefill_and_decode_match_model_forward_under_inference_options(options):
    # The engine's shipped path on CUDA (compiled prefill with the chunk length symbolic, compiled graph-captured
    # decode), prompts of two lengths, under each kind of inference option: what the evaluations and the
    # conversion's selection and scaling stages run.
    model = small_model(["lightning", "attention", "attention_rope", "lightning"])
    tokens = torch.randint(0, 1000, (1, 300), device="cuda")
    with torch.no_grad():
        full = model(tokens, use_cache=False, inference_options=options).logits
    engine = InferenceEngine(model, batch_size=1, max_length=320, prefill_chunk=128, decode_step="eager",
                             compile_decode=True, compile_prefill=True, inference_options=options)
    assert rel(engine.prefill(tokens[:, :190]), full[:, 189]) <= 3e-3
    engine.reset()
    pieces = [engine.prefill(tokens[:, :250])]
    engine.capture_graph()
    for t in range(250, 300):
        pieces.append(engine.decode(tokens[:, t : t + 1]).clone())
    assert rel(torch.stack(pieces, 1), full[:, 249:]) <= 3e-3


def _matvec_test_model(layer_types, spread_norms=False):
    """A float32 model on CUDA whose widths are multiples of the matrix-vector kernel's default step, 300 tokens, and
    its forward's logits. spread_norms: norm weights drawn from [0.5, 1.5] instead of ones."""
    torch.manual_seed(0)
    config = HypeNetConfig(
        vocab_size=1000, hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
        num_key_value_heads=4, head_dim=64, layer_types=layer_types, attention_logit_scaling_a=500.0,
        attention_output_gate=True, attention_qk_norm=True,
    )
    model = HypeNetForCausalLM(config).to("cuda", torch.float32).eval()
    with torch.no_grad():
        if spread_norms:
            for name, param in model.named_parameters():
                if name.endswith("norm.weight"):
                    param.uniform_(0.5, 1.5)
        tokens = torch.randint(0, 1000, (1, 300), device="cuda")
        full = model(tokens, use_cache=False).logits
    return model, tokens, full


@pytest.mark.parametrize("compile_decode,table", [(False, False), (True, False), (True, True)])
def test_graph_decode_with_triton_matvec_matches_model_forward(compile_decode, table):
    """matvec="triton": every product of the batch-1 step through hyla's kernel (widths multiples of its block_k),
    eager and compiled (the custom op inside torch.compile's graph), under the CUDA graph; with a per-shape table,
    other settings for one shape and cuBLAS for the LM head."""
    from hyla.ops.matvec import MatvecConfig

    model, tokens, full = _matvec_test_model(["lightning", "attention", "lightning", "lightning"])
    shapes = (((2048, 512), MatvecConfig(block_n=16, block_k=256, num_warps=8, num_stages=4)), ((1000, 512), None))
    engine = InferenceEngine(model, batch_size=1, max_length=320, prefill_chunk=128, compile_decode=compile_decode,
                             compile_prefill=False, decode_step="fused-projections", matvec="triton",
                             launch_pdl=None, matvec_shapes=shapes if table else ())
    pieces = [engine.prefill(tokens[:, :250])]
    engine.capture_graph()
    for t in range(250, 300):
        pieces.append(engine.decode(tokens[:, t : t + 1]).clone())
    assert rel(torch.stack(pieces, 1), full[:, 249:]) <= 3e-3


@pytest.mark.parametrize("n,k,has_bias", [(100, 2048, False), (6144, 2048, True), (2048, 6144, False)])
def test_triton_matvec_matches_reference(n, k, has_bias):
    """The batch-1 matrix-vector kernel against a float64 product, with a row count that is not a multiple of
    block_n and a bias."""
    import torch.nn.functional as F

    from hyla.ops.matvec.gpu import matvec_triton

    gen = torch.Generator(device="cuda").manual_seed(n)
    weight = (torch.randn(n, k, device="cuda", generator=gen) / k**0.5).bfloat16()
    bias = torch.randn(n, device="cuda", generator=gen).bfloat16() if has_bias else None
    x = torch.randn(1, 1, k, device="cuda", generator=gen).bfloat16()
    out = matvec_triton(x, weight, bias)
    ref = F.linear(x.double(), weight.double(), bias.double() if has_bias else None)
    assert out.shape == (1, 1, n) and out.dtype == torch.bfloat16
    assert rel(out, ref) <= BF16_TOL


# programmatic dependent launch needs compute capability 9.0
needs_pdl = pytest.mark.skipif(not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9),
                               reason="programmatic dependent launch needs compute capability 9.0")


def _pdl_params():
    """Programmatic dependent launch off, and on where the GPU has it."""
    return [False, pytest.param(True, marks=needs_pdl)]


@pytest.mark.parametrize("pdl", _pdl_params())
@pytest.mark.parametrize("prologue,epilogue", [(0, "none"), (1, "glu"), (1, "none"), (2, "residual"),
                                               (4, "residual")])
@pytest.mark.parametrize("n,k,has_bias", [(12288, 2048, False), (2048, 6144, True), (1000, 2000, False)])
def test_triton_matvec_prologues_match_reference(prologue, epilogue, n, k, has_bias, pdl):
    """The matrix-vector kernel in the engine's combinations (normed with and without the GLU epilogue, scaled plus
    residual, sigmoid-gated plus residual) against the float64 reference, bf16, K a multiple of block_k and not;
    launched plainly and with programmatic dependent launch."""
    from hyla.ops.matvec import NORM, SCALED, MatvecConfig, fused_matvec_reference
    from hyla.ops.matvec.gpu import fused_matvec_triton

    gen = torch.Generator(device="cuda").manual_seed(n + prologue)
    weight = (torch.randn(n, k, device="cuda", generator=gen) / k**0.5).bfloat16()
    x, x2 = (torch.randn(1, 1, k, device="cuda", generator=gen).bfloat16() for _ in range(2))
    bias = torch.randn(n, device="cuda", generator=gen).bfloat16() if has_bias else None
    norm_weight = (torch.rand(k, device="cuda", generator=gen) + 0.5).bfloat16() if prologue == NORM else None
    partials = torch.rand(64, device="cuda", generator=gen) * k / 64 if prologue == SCALED else None
    residual = torch.randn(1, 1, n, device="cuda", generator=gen).bfloat16() if epilogue == "residual" else None
    kwargs = dict(prologue=prologue, x2=x2, norm_weight=norm_weight, partials=partials, eps=1e-6, residual=residual,
                  glu=epilogue == "glu")
    y = fused_matvec_triton(x, weight, bias, config=MatvecConfig(block_n=2, block_k=1024), pdl=pdl, **kwargs)
    ref = fused_matvec_reference(x, weight, bias, **kwargs)
    assert y.shape == ref.shape and y.dtype == torch.bfloat16
    assert rel(y, ref) <= BF16_TOL


@pytest.mark.parametrize("pdl", _pdl_params())
@pytest.mark.parametrize("norms,rope,gate", [(True, True, True), (False, False, False)])
def test_lightning_step_kernel_matches_reference(norms, rope, gate, pdl):
    """The Lightning step at HypeNet-2B's head shape: bf16 projections, float32 state updated in place."""
    from hyla.ops.lightning_step import BLOCK_V, lightning_step_reference
    from hyla.ops.lightning_step.gpu import lightning_step_triton

    gen = torch.Generator(device="cuda").manual_seed(7)
    heads, dim = 16, 128
    y = torch.randn(1, 1, (4 if gate else 3) * heads * dim, device="cuda", generator=gen).bfloat16()
    angle = torch.rand(dim // 2, device="cuda", generator=gen) * 6
    cos, sin = ((torch.cat([angle.cos(), angle.cos()]).view(1, 1, dim).bfloat16(),
                 torch.cat([angle.sin(), angle.sin()]).view(1, 1, dim).bfloat16()) if rope else (None, None))
    qw, kw = ((torch.rand(dim, device="cuda", generator=gen) + 0.5).bfloat16() for _ in range(2)) if norms else (None,
                                                                                                                 None)
    state = torch.randn(1, heads, dim, dim, device="cuda", generator=gen)
    decay = torch.rand(heads, device="cuda", generator=gen)
    ref_state = state.clone()
    u, partials = lightning_step_triton(y, cos, sin, qw, kw, state, decay, scale=dim**-0.5, eps=1e-6, has_gate=gate,
                                        pdl=pdl, state_ready=pdl)
    ref_u, ref_partials = lightning_step_reference(y, cos, sin, qw, kw, ref_state, decay, scale=dim**-0.5, eps=1e-6,
                                                   has_gate=gate, block_v=BLOCK_V)
    # float32 state and partial sums: only summation order differs; u is rounded to bf16
    assert u.dtype == torch.bfloat16 and rel(u, ref_u) <= BF16_TOL
    assert rel(partials, ref_partials) <= 1e-5 and rel(state, ref_state) <= 1e-6


@pytest.mark.parametrize("compile_decode", [False, True])
def test_graph_decode_triton_fused_matches_model_forward(compile_decode):
    """matvec="triton-fused": residual adds, norms (weights folded), SiLU, gates and the Lightning step in hyla's
    kernels, eager and compiled, under the CUDA graph, against the float32 model's forward; batch 2 refused."""
    # norm weights away from 1: they are folded into the maps, and the fold is checked
    model, tokens, full = _matvec_test_model(["lightning", "attention", "lightning", "attention_rope"],
                                             spread_norms=True)
    engine = InferenceEngine(model, batch_size=1, max_length=320, prefill_chunk=128, compile_decode=compile_decode,
                             decode_step="triton-fused")
    pieces = [engine.prefill(tokens[:, :250])]
    engine.capture_graph()
    for t in range(250, 300):
        pieces.append(engine.decode(tokens[:, t : t + 1]).clone())
    assert rel(torch.stack(pieces, 1), full[:, 249:]) <= 3e-3
    with pytest.raises(ValueError, match="batch_size=1"):
        InferenceEngine(model, batch_size=2, max_length=8, decode_step="triton-fused")


@needs_pdl
def test_triton_fused_decode_with_programmatic_launch_equals_plain_launch():
    """Under programmatic dependent launch a kernel starts while the one before it finishes and reads only its
    weights until it waits for that kernel: any read before the wait of something the step writes would show as a
    difference here. The same kernels in the same order with and without it, 60 graph-replayed steps: the logits
    and the Lightning states must be bitwise equal."""
    model, tokens, _ = _matvec_test_model(["lightning", "attention", "lightning", "attention_rope"],
                                          spread_norms=True)
    runs = []
    for launch_pdl in (False, True):
        engine = InferenceEngine(model, batch_size=1, max_length=320, prefill_chunk=128, compile_decode=True,
                                 decode_step="triton-fused", launch_pdl=launch_pdl)
        assert engine.launch_pdl is launch_pdl
        pieces = [engine.prefill(tokens[:, :240])]
        engine.capture_graph()
        for t in range(240, 300):
            pieces.append(engine.decode(tokens[:, t : t + 1]).clone())
        runs.append((torch.stack(pieces, 1), [s.clone() for s in engine.cache.states.values()]))
        del engine
    (plain, plain_states), (pdl, pdl_states) = runs
    assert torch.equal(plain, pdl)
    assert all(torch.equal(a, b) for a, b in zip(plain_states, pdl_states, strict=True))
