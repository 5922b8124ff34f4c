"""RoPE: the reference against the rotation computed independently in float64 (complex multiplication of each head's
paired halves), which form runs when (`hyla.ops.rope`: one Triton kernel for inference in float16/bfloat16 on CUDA),
and the kernel itself on CPU tensors through Triton's interpreter, in a process of its own (the interpreter must be
switched on before triton is imported). Which tensors take the kernel is checked by letting CPU tensors count as CUDA
ones, with a stand-in for gpu.py, so that this file imports no triton. On CUDA: tests/ops/test_rope_gpu.py."""

from __future__ import annotations

import sys
import types

import pytest
import torch
from interpreted import NEEDS_TRITON, run_under_interpreter
from numerics import FLOAT32_ROUNDING, INTERPRETER_UNIT_ROUNDING, SUBNORMAL_HALF_SPACING, UNIT_ROUNDING

import hyla.ops.rope as rope_op
from hyla.layers.rope import apply_rotary as layer_apply_rotary
from hyla.ops.dispatch import use_backend
from hyla.ops.rope import apply_rotary, apply_rotary_reference, fused_rotary_applies

# The kernel's float32 arithmetic (FLOAT32_ROUNDING): products of two half-precision numbers are exact in float32
# (at most 22 significant bits), their sum is rounded once to float32.


def rotary_tables(batch: int, seq_len: int, head_dim: int, dtype=torch.bfloat16, *, seed: int = 0,
                  batch_of_tables: int | None = None):
    """cos, sin [B, T, D] as RotaryEmbedding makes them (the angles of a pair repeated over both halves) at arbitrary
    positions per row (left padding shifts them), in `dtype`."""
    generator = torch.Generator().manual_seed(seed)
    rows = batch if batch_of_tables is None else batch_of_tables
    positions = torch.randint(0, 70000, (rows, seq_len), generator=generator).double()
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = positions[..., None] * inv_freq
    cos, sin = torch.cat((angles.cos(), angles.cos()), -1), torch.cat((angles.sin(), angles.sin()), -1)
    return cos.to(dtype), sin.to(dtype)


def independent_tables(batch: int, seq_len: int, head_dim: int, dtype=torch.bfloat16, *, seed: int = 3):
    """cos, sin [B, T, D] of random values, their two halves unrelated (the formula does not assume them equal)."""
    generator = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(batch, seq_len, head_dim, generator=generator).to(dtype) for _ in range(2))


def heads(*shape: int, dtype=torch.bfloat16, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed + 1)
    return (torch.randn(*shape, generator=generator) * 2).to(dtype)


def exact_rotation(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """float64: each head's pair (x[d], x[d + D/2]) as the complex number x[d] + i x[d + D/2], times
    cos[d] + i sin[d] (tables whose halves repeat, as RotaryEmbedding makes them)."""
    half = x.shape[-1] // 2
    pairs = torch.complex(x[..., :half].double(), x[..., half:].double())
    turns = torch.complex(cos[..., :half].double(), sin[..., :half].double())[:, :, None]
    turned = pairs * turns
    return torch.cat((turned.real, turned.imag), -1)


def exact_per_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """float64, for any tables: (x1 * cos1 - x2 * sin1, x2 * cos2 + x1 * sin2), x1/x2 (cos1/cos2, sin1/sin2) the first
    and second halves of each head (of each table row)."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].double(), x[..., half:].double()
    cos, sin = cos.double()[:, :, None], sin.double()[:, :, None]
    return torch.cat((x1 * cos[..., :half] - x2 * sin[..., :half], x2 * cos[..., half:] + x1 * sin[..., half:]), -1)


def products(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """|x * cos| + |rotate_half(x) * sin| in float64, exactly: the size of the two terms of each output element."""
    half = x.shape[-1] // 2
    x64, cos64, sin64 = x.double(), cos.double()[:, :, None], sin.double()[:, :, None]
    swapped = torch.cat((x64[..., half:], x64[..., :half]), -1)
    return (x64 * cos64).abs() + (swapped * sin64).abs()


def within_one_rounding(got: torch.Tensor, exact: torch.Tensor, unit: float) -> float:
    """The largest |got - exact| over its bound for float32 arithmetic rounded once to got's dtype (> 1: outside)."""
    bound = (unit + FLOAT32_ROUNDING * (1 + unit)) * exact.abs() + SUBNORMAL_HALF_SPACING[got.dtype]
    return ((got.double() - exact).abs() / bound).max().item()


@pytest.mark.parametrize("shape", [(2, 7, 3, 8), (1, 5, 9, 64), (3, 1, 2, 2), (2, 3, 4, 6)])
def test_the_reference_turns_each_pair_of_halves_by_its_angle(shape):
    batch, seq_len, _, head_dim = shape
    x = heads(*shape, dtype=torch.float64)
    cos, sin = rotary_tables(batch, seq_len, head_dim, torch.float64)
    # float64 against float64: a few roundings of numbers of size ~|x|
    torch.testing.assert_close(apply_rotary_reference(x, cos, sin), exact_rotation(x, cos, sin), rtol=0, atol=1e-13)


def test_the_reference_takes_each_half_of_cos_and_sin_as_given():
    x = heads(2, 5, 3, 8, dtype=torch.float64)
    cos, sin = independent_tables(2, 5, 8, torch.float64)
    torch.testing.assert_close(apply_rotary_reference(x, cos, sin), exact_per_half(x, cos, sin), rtol=0, atol=1e-13)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_reference_in_half_precision_is_within_its_three_roundings(dtype):
    x = heads(3, 11, 9, 64, dtype=dtype)
    cos, sin = rotary_tables(3, 11, 64, dtype)
    got = apply_rotary_reference(x, cos, sin)
    assert got.dtype == dtype and got.shape == x.shape
    unit = UNIT_ROUNDING[dtype]
    # each product rounded once (unit * |term|), then their sum once (unit * |sum of the rounded terms|)
    bound = unit * (2 + unit) * products(x, cos, sin) + 4 * SUBNORMAL_HALF_SPACING[dtype]
    assert ((got.double() - exact_rotation(x, cos, sin)).abs() <= bound).all()


def rounded_once(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """What the kernel computes: the rotation in float32, rounded once to x's dtype."""
    return apply_rotary_reference(x.float(), cos.float(), sin.float()).to(x.dtype)


@pytest.fixture
def cpu_counts_as_cuda(monkeypatch):
    """CPU tensors count as CUDA ones, and gpu.py is a stand-in that counts its calls (and needs no triton)."""
    calls = []
    monkeypatch.setattr(rope_op, "_on_cuda", lambda tensor: True)
    stand_in = types.ModuleType("hyla.ops.rope.gpu")

    def counted(x, cos, sin):
        calls.append(tuple(x.shape))
        return rounded_once(x, cos, sin)

    stand_in.apply_rotary_fused = counted
    monkeypatch.setitem(sys.modules, "hyla.ops.rope.gpu", stand_in)
    return calls


def test_inference_in_half_precision_on_cuda_takes_the_fused_kernel(cpu_counts_as_cuda):
    x = heads(2, 5, 9, 64)
    cos, sin = rotary_tables(2, 5, 64)
    with torch.no_grad():
        out = apply_rotary(x, cos, sin)
    assert cpu_counts_as_cuda == [(2, 5, 9, 64)] and torch.equal(out, rounded_once(x, cos, sin))
    with torch.inference_mode():
        apply_rotary(x.half(), cos.half(), sin.half())
    # no tensor wants a gradient: grad mode alone does not matter
    apply_rotary(x, cos, sin)
    # one table row for every row of the batch (position ids [1, T])
    shared_cos, shared_sin = rotary_tables(1, 5, 64)
    apply_rotary(x, shared_cos, shared_sin)
    apply_rotary(x, shared_cos.expand(2, 5, 64), shared_sin.expand(2, 5, 64))
    assert len(cpu_counts_as_cuda) == 5


def test_everything_else_takes_the_reference(cpu_counts_as_cuda, monkeypatch):
    x = heads(2, 5, 9, 64)
    cos, sin = rotary_tables(2, 5, 64)
    trained = x.clone().requires_grad_()
    apply_rotary(trained, cos, sin).float().sum().backward()  # training: the gradient flows through the reference
    assert trained.grad is not None
    with torch.no_grad():
        apply_rotary(x.float(), cos.float(), sin.float())  # float32 keeps the teachers' arithmetic
        wider = apply_rotary(x, cos.float(), sin.float())  # float32 tables on bf16 heads: float32 out, as before
        assert wider.dtype == torch.float32
        odd = torch.ones(2, 5, 7, dtype=torch.bfloat16)
        apply_rotary(heads(2, 5, 9, 7), odd, odd)  # odd D: no pairs of halves
        apply_rotary(x, cos[..., :1], sin[..., :1])  # tables that only broadcast
        with use_backend("torch"):
            forced = apply_rotary(x, cos, sin)
        assert torch.equal(forced, apply_rotary_reference(x, cos, sin))
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
        apply_rotary(x, cos, sin)  # inside torch.compile: the operations inductor fuses itself
    assert cpu_counts_as_cuda == []


def test_off_cuda_nothing_takes_the_fused_kernel():
    x = heads(2, 5, 9, 64)
    cos, sin = rotary_tables(2, 5, 64)
    with torch.no_grad():
        assert not fused_rotary_applies(x, cos, sin)
        assert torch.equal(apply_rotary(x, cos, sin), apply_rotary_reference(x, cos, sin))


def test_the_layers_rotation_goes_through_the_dispatch(cpu_counts_as_cuda):
    x = heads(1, 4, 3, 16)
    cos, sin = rotary_tables(1, 4, 16)
    with torch.no_grad():
        out = layer_apply_rotary(x, cos, sin)
    assert cpu_counts_as_cuda == [(1, 4, 3, 16)] and out.dtype == torch.bfloat16


def check_the_kernel_interpreted() -> None:
    """The Triton kernel on CPU tensors (run with TRITON_INTERPRET=1): odd lengths, D/2 not a power of two, heads
    split over programs, x a strided view inside a NaN-filled buffer, tables shared by the batch."""
    from hyla.ops.rope.gpu import apply_rotary_fused

    cases = [((1, 37, 9, 64), torch.bfloat16, "rotary"), ((3, 5, 3, 6), torch.float16, "rotary"),
             ((2, 4, 2, 2), torch.bfloat16, "rotary"), ((1, 3, 130, 256), torch.float16, "rotary"),
             ((3, 9, 4, 32), torch.bfloat16, "shared"), ((2, 6, 5, 16), torch.bfloat16, "independent")]
    for (batch, seq_len, num_heads, head_dim), dtype, tables in cases:
        # x as the middle third of a fused projection's output [B, T, 3 * H * D]; the rest is NaN, never read
        buffer = torch.full((batch, seq_len, 3 * num_heads * head_dim), float("nan"), dtype=dtype)
        x = buffer[..., num_heads * head_dim:2 * num_heads * head_dim].view(batch, seq_len, num_heads, head_dim)
        x.copy_(heads(batch, seq_len, num_heads, head_dim, dtype=dtype))
        if tables == "independent":
            cos, sin = independent_tables(batch, seq_len, head_dim, dtype)
        else:
            cos, sin = rotary_tables(batch, seq_len, head_dim, dtype, batch_of_tables=1 if tables == "shared" else None)
        got = apply_rotary_fused(x, cos, sin)
        assert got.shape == x.shape and got.dtype == dtype and got.is_contiguous()
        ratio = within_one_rounding(got, exact_per_half(x, cos, sin), INTERPRETER_UNIT_ROUNDING[dtype])
        assert ratio <= 1, (x.shape, dtype, ratio)
        print(f"{tuple(x.shape)} {dtype}: error over bound {ratio:.3f}")


@NEEDS_TRITON
def test_the_kernel_matches_the_rotation_under_tritons_interpreter():
    stdout = run_under_interpreter(__file__)
    assert stdout.count("error over bound") == 6, stdout


if __name__ == "__main__":
    check_the_kernel_interpreted()
