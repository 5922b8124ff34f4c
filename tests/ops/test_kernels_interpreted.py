"""hyla's Triton kernels on CPU through Triton's interpreter, against their float64 references: the split-K decode
attention (shared and per-row lengths, every launch setting the sweep may pick, NaN past each row's length, float32
products kept float32 where the GPU would round them to TF32), the batch-1 matrix-vector kernel with every prologue
and epilogue, the Lightning step, the chunked KL's per-chunk kernel (alone, within error bounds derived from its
float32 arithmetic, NaN past V; and inside the chunked loss against the default path); then the engine's
triton-fused and Triton-matvec decode steps against the model's forward, and the three `hyla bench sweep --smoke`
runs.

Runs only under TRITON_INTERPRET=1 (the interpreter must be on before triton is imported, and hyla's kernels then run
on CPU tensors): `test_kernels_on_cpu.py` starts it in its own process, so that the rest of the suite sees no
interpreter. Directly: TRITON_INTERPRET=1 python -m pytest tests/ops/test_kernels_interpreted.py -q
"""

import math
import os

import numpy as np
import pytest
import torch

pytest.importorskip("triton")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("runs under TRITON_INTERPRET=1 (test_kernels_on_cpu.py starts it)", allow_module_level=True)

from hyla.bench.sweep.common import patch_interpreter  # noqa: E402
from hyla.ops.decode_attention import DecodeKernelConfig, decode_attention_reference  # noqa: E402

patch_interpreter()

# float32 (and float16 for attention) kernels against float64 references: summation order and the kernels' own
# roundings to the inputs' dtype; float16 inputs round q and the probabilities (2^-11 relative).
F32_TOL, F16_TOL = 1e-6, 5e-3


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


CONFIGS = [DecodeKernelConfig()] + [DecodeKernelConfig(block_n=b, programs_per_sm=p)
                                    for b, p in ((64, 4), (32, 1), (128, 8))]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"block{c.block_n}-p{c.programs_per_sm}")
@pytest.mark.parametrize("batch,heads,kv_heads,max_length,lengths,dtype", [
    (1, 4, 2, 300, [1], torch.float32), (1, 4, 2, 300, [300], torch.float32), (2, 4, 2, 500, [277], torch.float16),
    (2, 2, 2, 200, [65], torch.float32), (3, 8, 2, 130, [129], torch.float16),
    (3, 4, 2, 260, [1, 260, 97], torch.float32),
])
def test_decode_attention_kernel(batch, heads, kv_heads, max_length, lengths, dtype, config):
    from hyla.ops.decode_attention.gpu import decode_attention_triton

    gen = torch.Generator().manual_seed(max_length)
    q = torch.randn(batch, heads, 32, generator=gen).to(dtype)
    keys = torch.randn(batch, kv_heads, max_length, 32, generator=gen).to(dtype)
    values = torch.randn(batch, kv_heads, max_length, 32, generator=gen).to(dtype)
    per_row = lengths * batch if len(lengths) == 1 else lengths
    for row, length in enumerate(per_row):
        keys[row, :, length:] = float("nan")  # never to be read
        values[row, :, length:] = float("nan")
    out = decode_attention_triton(q, keys, values, torch.tensor(lengths if len(lengths) > 1 else lengths[0]),
                                  scale=32**-0.5, config=config)
    ref = decode_attention_reference(q.double(), keys.nan_to_num().double(), values.nan_to_num().double(),
                                     torch.tensor(per_row), scale=32**-0.5)
    assert torch.isfinite(out).all()
    assert rel(out, ref) <= (F16_TOL if dtype == torch.float16 else F32_TOL)


def _round_to_tf32(x):
    # round to nearest on the 13 low mantissa bits, as Hopper's tensor cores take float32 inputs (cvt.rna.tf32.f32)
    bits = x.astype(np.float32).view(np.uint32)
    return ((bits + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


@pytest.fixture
def tf32_dots(monkeypatch):
    """The interpreter computes every float32 `tl.dot` in float32; with this, dots that ask for TF32 (Triton's
    default) get their inputs rounded to TF32 as on the GPU."""
    import triton.runtime.interpreter as interpreter
    from triton._C.libtriton import ir

    create_dot = interpreter.InterpreterBuilder.create_dot

    def rounded(self, a, b, d, input_precision, max_num_imprecise_acc):
        if input_precision == ir.INPUT_PRECISION.TF32 and a.data.dtype == np.float32:
            a = interpreter.TensorHandle(_round_to_tf32(a.data), a.dtype)
            b = interpreter.TensorHandle(_round_to_tf32(b.data), b.dtype)
        return create_dot(self, a, b, d, input_precision, max_num_imprecise_acc)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", rounded)


@pytest.mark.parametrize("precision", ["ieee", "tf32"])
def test_float32_decode_attention_keeps_float32_products(tf32_dots, monkeypatch, precision):
    """An fp32 model's decode attention in fp32: the kernel asks for IEEE products (`dot_precision`) and stays within
    F32_TOL of the float64 reference (2.0e-7 measured); with TF32 products, Triton's default, the same call is
    3.7e-4 off (the "tf32" case, which also shows that the rounding above takes effect)."""
    import hyla.ops.decode_attention.gpu as decode_gpu

    if precision == "tf32":
        monkeypatch.setattr(decode_gpu, "dot_precision", lambda dtype: "tf32")
    gen = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 32, generator=gen)
    keys, values = (torch.randn(2, 2, 200, 32, generator=gen) for _ in range(2))
    lengths = torch.tensor([200, 77])
    out = decode_gpu.decode_attention_triton(q, keys, values, lengths, scale=32**-0.5)
    ref = decode_attention_reference(q.double(), keys.double(), values.double(), lengths, scale=32**-0.5)
    if precision == "ieee":
        assert rel(out, ref) <= F32_TOL
    else:
        assert rel(out, ref) > 1e-4


@pytest.mark.parametrize("n,k,has_bias,block_n,block_k", [(100, 128, True, 8, 64), (7, 64, False, 4, 32),
                                                           (33, 96, True, 16, 32)])
def test_matvec_kernel(n, k, has_bias, block_n, block_k):
    import torch.nn.functional as F

    from hyla.ops.matvec import MatvecConfig, supports
    from hyla.ops.matvec.gpu import matvec_triton

    gen = torch.Generator().manual_seed(n)
    weight, x = torch.randn(n, k, generator=gen), torch.randn(1, 1, k, generator=gen)
    bias = torch.randn(n, generator=gen) if has_bias else None
    out = matvec_triton(x, weight, bias, config=MatvecConfig(block_n=block_n, block_k=block_k))
    assert rel(out, F.linear(x.double(), weight.double(), bias.double() if has_bias else None)) <= F32_TOL
    assert not supports(torch.randn(2, 1, 512), torch.randn(8, 512))  # two rows: F.linear's job


@pytest.mark.parametrize("epilogue", ["none", "residual", "glu"])
@pytest.mark.parametrize("prologue", [0, 1, 2, 4])
def test_fused_matvec_prologues_and_epilogues(prologue, epilogue):
    """Every prologue and epilogue, with K a multiple of block_k and not, with and without a bias and a norm
    weight."""
    from hyla.ops.matvec import NORM, SCALED, MatvecConfig, fused_matvec_reference
    from hyla.ops.matvec.gpu import fused_matvec_triton

    gen = torch.Generator().manual_seed(1)
    for n, k, has_bias, config in ((24, 64, True, MatvecConfig(block_n=4, block_k=32)),
                                   (8, 80, False, MatvecConfig(block_n=2, block_k=32)),
                                   (10, 48, True, MatvecConfig(block_n=8, block_k=64))):
        weight, x, x2 = (torch.randn(n, k, generator=gen), torch.randn(1, 1, k, generator=gen),
                         torch.randn(1, 1, k, generator=gen))
        bias = torch.randn(n, generator=gen) if has_bias else None
        norm_weight = torch.rand(k, generator=gen) + 0.5 if prologue == NORM and has_bias else None
        partials = torch.rand(5, generator=gen) * k if prologue == SCALED else None
        residual = torch.randn(1, 1, n, generator=gen) if epilogue == "residual" else None
        kwargs = dict(prologue=prologue, x2=x2, norm_weight=norm_weight, partials=partials, eps=1e-6,
                      residual=residual, glu=epilogue == "glu")
        y = fused_matvec_triton(x, weight, bias, config=config, **kwargs)
        ref = fused_matvec_reference(x, weight, bias, **kwargs)
        assert y.shape == ref.shape and rel(y, ref) <= F32_TOL, (n, k)


@pytest.mark.parametrize("norms,rope,gate", [(True, True, True), (False, False, False), (True, False, True),
                                             (False, True, False)])
def test_lightning_step_kernel(norms, rope, gate):
    """Output, the norm's partial sums and the state written back."""
    from hyla.ops.lightning_step import BLOCK_V, lightning_step_reference
    from hyla.ops.lightning_step.gpu import lightning_step_triton

    gen = torch.Generator().manual_seed(2)
    heads, dim = 3, 64
    y = torch.randn(1, 1, (4 if gate else 3) * heads * dim, generator=gen)
    angle = torch.rand(dim // 2, generator=gen) * 6
    cos, sin = (torch.cat([angle.cos(), angle.cos()]).view(1, 1, dim),
                torch.cat([angle.sin(), angle.sin()]).view(1, 1, dim)) if rope else (None, None)
    qw, kw = (torch.rand(dim, generator=gen) + 0.5 for _ in range(2)) if norms else (None, None)
    state = torch.randn(1, heads, dim, dim, generator=gen)
    decay = torch.rand(heads, generator=gen)
    ref_state = state.clone()
    u, partials = lightning_step_triton(y, cos, sin, qw, kw, state, decay, scale=dim**-0.5, eps=1e-6, has_gate=gate)
    ref_u, ref_partials = lightning_step_reference(y, cos, sin, qw, kw, ref_state, decay, scale=dim**-0.5, eps=1e-6,
                                                   has_gate=gate, block_v=BLOCK_V)
    assert rel(u, ref_u) <= F32_TOL and rel(partials, ref_partials) <= F32_TOL and rel(state, ref_state) <= F32_TOL


@pytest.fixture
def bf16_rounds_to_nearest(monkeypatch):
    """The interpreter casts float32 to bf16 by truncation; the GPU rounds to nearest even (Triton's default,
    cvt.rn.bf16.f32 in the kernel's PTX). With this, the interpreter rounds as the GPU does."""
    import triton.language as tl
    import triton.runtime.interpreter as interpreter

    cast_impl = interpreter.InterpreterBuilder.cast_impl

    def rounded(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            values = torch.from_numpy(np.array(src.data, dtype=np.float32))
            return interpreter.TensorHandle(values.to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16),
                                            dst_type.scalar)
        return cast_impl(self, src, dst_type)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "cast_impl", rounded)


# float32's unit roundoff; the gradient's rounding to its dtype (to nearest: half a unit in the last place, relative),
# and fp16's absolute spacing below its smallest normal number (2^-14), where its relative rounding no longer holds.
UNIT = 2.0**-24
OUTPUT_ROUNDING = {torch.float32: UNIT, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
OUTPUT_FLOOR = {torch.float32: 0.0, torch.bfloat16: 0.0, torch.float16: 2.0**-25}


def _kl_kernel_bounds(student, teacher, labels, scale, block_v, grad_dtype):
    """First-order bounds on the KL kernel's errors against float64 `_kl_terms` on the same values (bf16 and fp16
    logits are exact in float32). In a row whose largest |logit| is M, float32 leaves each log-probability off by at
    most eps = 2^-24 (4 (M + ln V) + n + log2(block) + 4): the per-lane sums of n = V / block terms and their tree
    merge, the add M + log(sum) (|lse| <= M + ln V) and the subtraction logit - lse (|log p| <= 2M + ln V) each round.
    A probability is then off by eps relative (and its exp rounds); the KL row sum_v p_t (log p_t - log p_s) by 2 eps
    plus eps and the summation's rounding times sum_v |term|; the cross-entropy lse - logit by eps; float32 sums over
    rows add 2^-24 per row. Returns (kl bound, ce bound, elementwise grad bound)."""
    s, t = student.double(), teacher.double()
    vocab = s.shape[-1]
    block = min(block_v, 1 << (vocab - 1).bit_length())
    blocks = -(-vocab // block)
    largest = torch.maximum(s.abs().amax(-1), t.abs().amax(-1))
    eps = UNIT * (4 * (largest + math.log(vocab)) + blocks + math.log2(block) + 4)
    logp_s, logp_t = s.log_softmax(-1), t.log_softmax(-1)
    p_s, p_t = logp_s.exp(), logp_t.exp()
    kl_terms = p_t * (logp_t - logp_s)
    kl_bound = 2 * eps + (eps + (blocks + math.log2(block) + 3) * UNIT) * kl_terms.abs().sum(-1)
    kl_bound = kl_bound.sum() + len(s) * UNIT * kl_terms.sum(-1).abs().sum()
    labelled = labels != -100
    ce_rows = torch.logsumexp(s, -1) - s.gather(-1, labels.clamp(min=0)[:, None])[:, 0]
    ce_bound = torch.where(labelled, eps + UNIT * ce_rows.abs(), 0.0).sum() + len(s) * UNIT * ce_rows.abs().sum()
    rounding = OUTPUT_ROUNDING[grad_dtype]
    float32_error = scale.double() * (p_s + p_t) * (eps[:, None] + 2 * UNIT)
    grad_bound = (1 + rounding) * float32_error + rounding * (scale.double() * (p_s - p_t)).abs()
    return kl_bound.item(), ce_bound.item(), grad_bound + OUTPUT_FLOOR[grad_dtype]


def _kl_logits(rows, vocab, dtype, kind, generator):
    """[rows, V] logits of std 3 ("normal"), or ("large", 4 rows or more) rows shifted by +100 and -110, where exp
    overflows float32 (e^88.7) or underflows to 0 without the max subtracted, and a row peaked on one entry."""
    logits = torch.randn(rows, vocab, generator=generator) * 3
    if kind == "large":
        logits += torch.tensor([100.0, -110.0, 0.0, 60.0])[torch.arange(rows) % 4, None]
        logits[2, 5] += 40.0
    return logits.to(dtype)


def _nan_padded(values):
    """`values` as the first columns of a wider NaN-filled buffer: a kernel that reads past V sees NaN."""
    buffer = torch.full((values.shape[0], values.shape[1] + 5), float("nan"), dtype=values.dtype)
    buffer[:, : values.shape[1]] = values
    return buffer[:, : values.shape[1]]


@pytest.mark.parametrize("rows,vocab,dtype,block_v,kind,ignored,scale", [
    (5, 300, torch.float32, 128, "normal", "some", 0.37),  # three blocks, the last one partial
    (4, 1000, torch.bfloat16, 256, "normal", "some", 0.25),
    (3, 512, torch.float32, 128, "normal", "all", 1.7),  # V a multiple of the block; no labelled row
    (4, 513, torch.float32, 128, "large", "some", 0.37),  # one entry in the last block
    (4, 700, torch.bfloat16, 2048, "large", "none", 0.25),  # one block (1024) over V
    (3, 400, torch.float16, 128, "normal", "some", 0.37),
    (2, 7, torch.float32, 2048, "normal", "all", 1.0),
])
def test_kl_kernel_matches_its_reference(bf16_rounds_to_nearest, rows, vocab, dtype, block_v, kind, ignored, scale):
    """KL sum, cross-entropy sum and gradient of `kl_terms_triton` against `_kl_terms` in float64 on the same values,
    within `_kl_kernel_bounds`."""
    from hyla.ops.linear_loss.chunked import _kl_terms
    from hyla.ops.linear_loss.gpu import kl_terms_triton

    gen = torch.Generator().manual_seed(vocab)
    student, teacher = (_kl_logits(rows, vocab, dtype, kind, gen) for _ in range(2))
    labels = torch.randint(0, vocab, (rows,), generator=gen)
    labels[{"some": slice(None, None, 2), "all": slice(None), "none": slice(0)}[ignored]] = -100
    scale = torch.tensor(scale)
    # Lanes past V compute exp(0 - lse), which overflows in rows of large negative logits, and then inf - inf;
    # neither is stored or summed.
    with np.errstate(over="ignore", invalid="ignore"):
        kl, ce, grad = kl_terms_triton(_nan_padded(student), _nan_padded(teacher), labels, scale, block_v=block_v)
    ref_kl, ref_ce, ref_grad = _kl_terms(student.double(), teacher.double(), labels, scale.double())
    kl_bound, ce_bound, grad_bound = _kl_kernel_bounds(student, teacher, labels, scale, block_v, dtype)
    assert kl.dtype == ce.dtype == torch.float32 and kl.shape == ce.shape == () and grad.dtype == dtype
    assert abs(kl.item() - ref_kl.item()) <= kl_bound
    assert abs(ce.item() - ref_ce.item()) <= ce_bound and (ignored != "all" or ce.item() == 0.0)
    assert ((grad.double() - ref_grad).abs() <= grad_bound).all()


@pytest.mark.parametrize("autocast", [False, True], ids=["float32", "bf16-autocast"])
def test_chunked_kl_with_the_triton_kernel_matches_the_default_path(bf16_rounds_to_nearest, autocast):
    """Loss, cross-entropy and the gradients of the hidden states and the head through `kernel="triton"` against the
    default per-chunk arithmetic (plain torch on CPU), three chunks with a short last one. Both paths compute in
    float32 on the same logits: each is within ~5e-6 of float64 here (`_kl_kernel_bounds`, |logit| < 15, V = 300), so
    1e-5 apart. Under bf16 autocast both round the same logits and their gradients to bf16, so the gradients may
    differ by one rounding: 2^-8."""
    from hyla.ops.linear_loss import linear_kl_divergence_chunked

    gen = torch.Generator().manual_seed(3)
    hidden, teacher_hidden = torch.randn(37, 24, generator=gen), torch.randn(37, 24, generator=gen)
    weight, teacher_weight = torch.randn(300, 24, generator=gen) * 0.5, torch.randn(300, 24, generator=gen) * 0.5
    labels = torch.randint(0, 300, (37,), generator=gen)
    labels[::4] = -100

    def run(kernel):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            kl, ce = linear_kl_divergence_chunked(h, w, teacher_hidden, teacher_weight, labels, chunk_rows=16,
                                                  kernel=kernel)
        (0.7 * kl).backward()
        return kl.detach(), ce, h.grad, w.grad

    got, want = run("triton"), run("torch")
    tolerances = (1e-5, 1e-5) + ((2.0**-8,) * 2 if autocast else (1e-5,) * 2)
    for value, reference, tolerance in zip(got, want, tolerances):
        assert value.dtype == reference.dtype and rel(value, reference) <= tolerance


def test_bench_loss_checks_the_triton_kl():
    """`hyla bench loss`'s check of hyla-triton (which the bench runs on CUDA only) passes on its toy shapes."""
    from hyla.bench import loss

    settings = loss.LossBenchSettings(**loss.TOY_SETTINGS, device="cpu", implementations=("hyla-triton",))
    checks, skipped = loss.check_case(loss.LossCase("kl", 1, 16), settings.implementations, settings,
                                      torch.device("cpu"), lambda line: None)
    assert not skipped and checks[0]["passed"]
    assert max(checks[0]["relative_errors"].values()) < 1e-5  # float32 on CPU, as hyla-chunked's check


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("step", ["triton-fused", "triton-matvec"])
def test_engine_decode_with_hyla_kernels_matches_model_forward(step, bias):
    """The triton-fused step (norm weights away from 1, so that folding them is checked) and the fused-projections
    step through the Triton matrix-vector kernel, float32, against the model's forward; eager (no CUDA graph on CPU),
    every kernel interpreted."""
    from hyla import HypeNetConfig, HypeNetForCausalLM
    from hyla.inference import InferenceEngine

    torch.manual_seed(0)
    config = HypeNetConfig(
        vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=3, num_attention_heads=2,
        num_key_value_heads=1, head_dim=32, layer_types=["lightning", "attention", "lightning"],
        attention_logit_scaling_a=5.0, attention_output_gate=True, attention_qk_norm=True, qkv_bias=bias,
    )
    model = HypeNetForCausalLM(config).float().eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(0.5, 1.5)
    tokens = torch.randint(0, 101, (1, 14))
    settings = dict(decode_step="triton-fused") if step == "triton-fused" else dict(
        decode_step="fused-projections", matvec="triton")
    with torch.no_grad():
        full = model(tokens, use_cache=False).logits
        engine = InferenceEngine(model, batch_size=1, max_length=16, prefill_chunk=4, **settings)
        engine.prefill(tokens[:, :10])
        steps = [engine.decode(tokens[:, t : t + 1]).clone() for t in range(10, 14)]
    # float32 throughout; the kernels round each product's output to float32 as the model does
    assert rel(torch.stack(steps, 1), full[:, 10:]) <= 1e-5


@pytest.mark.parametrize("kernel", ["matvec", "fused", "decode-attention"])
def test_bench_sweep_smoke_writes_an_engine_settings_file(tmp_path, kernel):
    from hyla.cli import main
    from hyla.inference.settings import load_settings

    assert main(["bench", "sweep", kernel, "--smoke", "--out", str(tmp_path)]) == 0
    settings = load_settings(tmp_path / "settings.json")
    assert f"hyla bench sweep {kernel}" in settings.name
    if kernel in ("matvec", "fused"):
        assert settings.matvec_shapes
