"""RoPE on CUDA: inference in float16/bfloat16 takes the Triton kernel, within one rounding of the float64 rotation
(the reference: three roundings), and training keeps the reference (`hyla.ops.rope`). Speed: `python bench/rope.py`."""

from __future__ import annotations

import pytest
import torch
from numerics import FLOAT32_ROUNDING, SUBNORMAL_HALF_SPACING, UNIT_ROUNDING

import hyla.ops.rope.gpu as gpu
from hyla.ops.rope import apply_rotary, apply_rotary_reference

pytestmark = pytest.mark.gpu

# The kernel's float32 arithmetic (FLOAT32_ROUNDING): products of two half-precision numbers are exact in float32,
# their sum (or the fused multiply-add) is rounded once to float32.


def rotary_tables(rows: int, seq_len: int, head_dim: int, dtype, generator) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [rows, T, D] as RotaryEmbedding makes them, at arbitrary positions per row (left padding shifts
    them)."""
    positions = torch.randint(0, 70000, (rows, seq_len), device="cuda", generator=generator).double()
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, head_dim, 2, device="cuda", dtype=torch.float64) / head_dim)
    angles = positions[..., None] * inv_freq
    return (torch.cat((angles.cos(), angles.cos()), -1).to(dtype),
            torch.cat((angles.sin(), angles.sin()), -1).to(dtype))


def exact_rotation(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """float64: each head's pair (x[d], x[d + D/2]) as x[d] + i x[d + D/2], times cos[d] + i sin[d]."""
    half = x.shape[-1] // 2
    pairs = torch.complex(x[..., :half].double(), x[..., half:].double())
    turned = pairs * torch.complex(cos[..., :half].double(), sin[..., :half].double())[:, :, None]
    return torch.cat((turned.real, turned.imag), -1)


def exact_per_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """float64, for any tables: (x1 * cos1 - x2 * sin1, x2 * cos2 + x1 * sin2) over each head's halves."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].double(), x[..., half:].double()
    cos, sin = cos.double()[:, :, None], sin.double()[:, :, None]
    return torch.cat((x1 * cos[..., :half] - x2 * sin[..., :half], x2 * cos[..., half:] + x1 * sin[..., half:]), -1)


def error_over_bound(got: torch.Tensor, exact: torch.Tensor) -> float:
    """The largest |got - exact| over its bound for float32 arithmetic rounded once to got's dtype (> 1: outside)."""
    unit = UNIT_ROUNDING[got.dtype]
    bound = (unit + FLOAT32_ROUNDING * (1 + unit)) * exact.abs() + SUBNORMAL_HALF_SPACING[got.dtype]
    return ((got.double() - exact).abs() / bound).max().item()


@pytest.fixture
def kernel_calls(monkeypatch):
    calls = []
    real = gpu.apply_rotary_fused
    monkeypatch.setattr(gpu, "apply_rotary_fused", lambda *a: calls.append(tuple(a[0].shape)) or real(*a))
    return calls


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape,table_rows", [
    ((1, 65536, 9, 64), 1),  # a 64K prefill of the converted 135M shape
    ((3, 1031, 9, 64), 3),  # a left-padded batch: positions differ per row
    ((3, 517, 3, 64), 1),  # one table row for the batch (position ids [1, T])
    ((2, 1, 9, 64), 2),  # a decode step
    ((2, 77, 5, 128), 2), ((1, 33, 130, 256), 1), ((2, 19, 4, 96), 2), ((1, 8, 2, 2), 1),
])
def test_inference_takes_the_kernel_within_one_rounding(shape, table_rows, dtype, kernel_calls):
    generator = torch.Generator("cuda").manual_seed(0)
    batch, seq_len, _, head_dim = shape
    x = (torch.randn(*shape, device="cuda", generator=generator) * 2).to(dtype)
    cos, sin = rotary_tables(table_rows, seq_len, head_dim, dtype, generator)
    with torch.no_grad():
        fused = apply_rotary(x, cos, sin)
    assert kernel_calls == [shape] and fused.dtype == dtype and fused.shape == x.shape
    exact = exact_rotation(x, cos.expand(batch, -1, -1), sin.expand(batch, -1, -1))
    ratio = error_over_bound(fused, exact)
    assert ratio <= 1, ratio
    # The reference rounds each product and their sum (an error on the scale of the terms, not of the result): over
    # a thousand elements or more its largest error is not below the kernel's.
    if x.numel() >= 1000:
        reference = apply_rotary_reference(x, cos, sin)
        assert (fused.double() - exact).abs().max() <= (reference.double() - exact).abs().max()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_strided_heads_expanded_and_independent_tables(dtype, kernel_calls):
    """x a view into a fused projection's output whose other columns are NaN (never read), tables expanded over the
    batch (stride 0), and tables whose halves differ (the formula takes each half as given)."""
    generator = torch.Generator("cuda").manual_seed(1)
    batch, seq_len, num_heads, head_dim = 3, 1000, 9, 64
    width = num_heads * head_dim
    buffer = torch.full((batch, seq_len, 3 * width), float("nan"), device="cuda", dtype=dtype)
    x = buffer[..., width:2 * width].view(batch, seq_len, num_heads, head_dim)
    x.copy_(torch.randn(x.shape, device="cuda", generator=generator))
    cos, sin = rotary_tables(1, seq_len, head_dim, dtype, generator)
    cos, sin = cos.expand(batch, -1, -1), sin.expand(batch, -1, -1)
    with torch.no_grad():
        fused = apply_rotary(x, cos, sin)
    assert error_over_bound(fused, exact_rotation(x, cos, sin)) <= 1
    cos, sin = (torch.randn(batch, seq_len, head_dim, device="cuda", generator=generator).to(dtype) for _ in range(2))
    with torch.no_grad():
        fused = apply_rotary(x, cos, sin)
    assert error_over_bound(fused, exact_per_half(x, cos, sin)) <= 1
    assert len(kernel_calls) == 2


def test_training_keeps_the_reference(kernel_calls):
    generator = torch.Generator("cuda").manual_seed(2)
    x = torch.randn(2, 33, 9, 64, device="cuda", generator=generator).bfloat16().requires_grad_()
    cos, sin = rotary_tables(2, 33, 64, torch.bfloat16, generator)
    out = apply_rotary(x, cos, sin)
    assert torch.equal(out, apply_rotary_reference(x, cos, sin))
    out.float().sum().backward()
    assert kernel_calls == [] and x.grad is not None
