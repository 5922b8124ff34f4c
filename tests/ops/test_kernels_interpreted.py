"""hyla's Triton kernels on CPU through Triton's interpreter, against their float64 references: the split-K decode
attention (shared and per-row lengths, every launch setting the sweep may pick, NaN past each row's length, float32
products kept float32 where the GPU would round them to TF32), the batch-1 matrix-vector kernel with every prologue
and epilogue, the Lightning step; then the engine's triton-fused and Triton-matvec decode steps against the model's
forward, and the three `hyla bench sweep --smoke` runs.

Runs only under TRITON_INTERPRET=1 (the interpreter must be on before triton is imported, and hyla's kernels then run
on CPU tensors): `test_kernels_on_cpu.py` starts it in its own process, so that the rest of the suite sees no
interpreter. Directly: TRITON_INTERPRET=1 python -m pytest tests/ops/test_kernels_interpreted.py -q
"""

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
