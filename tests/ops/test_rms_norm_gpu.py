"""RMSNorm on CUDA: inference in float16/bfloat16 takes torch's fused kernel or, for rows of at most
ROWS_KERNEL_MAX_D elements, the Triton rows kernel, each within one rounding of float64 (the reference: two), and
training keeps the reference (`hyla.ops.rms_norm`). Speed: `python bench/rms_norm.py`."""

from __future__ import annotations

import pytest
import torch
from numerics import FLOAT32_ROUNDING, SUBNORMAL_HALF_SPACING, UNIT_ROUNDING, rms_norm_float64

import hyla.ops.rms_norm as rms_norm_op
import hyla.ops.rms_norm.gpu as gpu
from hyla.ops.rms_norm import rms_norm, rms_norm_reference

pytestmark = pytest.mark.gpu

EPS = 1e-6
BF16_ROUNDING = 2.0**-8  # one rounding to nearest keeps 8 significant bits
# The rows kernel's float32 arithmetic (FLOAT32_ROUNDING units, relative): the sum of D squares (D roundings of
# nonnegative terms, D units), halved by the square root, then the mean's division, the epsilon's addition and rsqrt
# (a few units) and the two products (two): under D / 2 + 6 units; (D + 8) units leaves room for any order of
# summation. At float16's 11 bits it is not negligible: over millions of elements some fall within it of a
# rounding's worst case.


def error_over_bound(got: torch.Tensor, exact: torch.Tensor) -> float:
    """The largest |got - exact| over its bound for float32 arithmetic rounded once to got's dtype (> 1: outside)."""
    unit, float32_error = UNIT_ROUNDING[got.dtype], FLOAT32_ROUNDING * (exact.shape[-1] + 8)
    bound = (unit + float32_error * (1 + unit)) * exact.abs() + SUBNORMAL_HALF_SPACING[got.dtype]
    return ((got.double() - exact).abs() / bound).max().item()


@pytest.mark.parametrize("shape", [(1, 4099, 576), (2, 1031, 9, 64)])
def test_inference_takes_the_fused_kernel_within_one_rounding(shape, monkeypatch):
    monkeypatch.setattr(rms_norm_op, "ROWS_KERNEL_MAX_D", 0)
    calls = []
    real = gpu.rms_norm_fused
    monkeypatch.setattr(gpu, "rms_norm_fused", lambda *a, **k: calls.append(1) or real(*a, **k))
    generator = torch.Generator("cuda").manual_seed(0)
    x = (torch.randn(*shape, device="cuda", generator=generator) * 3 + 0.5).bfloat16()
    weight = (torch.rand(shape[-1], device="cuda", generator=generator) + 0.5).bfloat16()
    want = rms_norm_float64(x, weight, EPS)
    with torch.no_grad():
        fused = rms_norm(x, weight, eps=EPS)
    reference = rms_norm_reference(x, weight, eps=EPS)
    assert calls == [1] and fused.dtype == torch.bfloat16
    relative = ((fused.double() - want).abs() / want.abs().clamp_min(1e-3)).max().item()
    assert relative <= BF16_ROUNDING, relative
    relative = ((reference.double() - want).abs() / want.abs().clamp_min(1e-3)).max().item()
    assert relative <= 2 * BF16_ROUNDING + BF16_ROUNDING**2, relative
    trained = weight.clone().requires_grad_()
    rms_norm(x, trained, eps=EPS).float().sum().backward()
    assert calls == [1] and trained.grad is not None


def head_split_of_a_wider_output(shape: tuple[int, ...], dtype, generator) -> torch.Tensor:
    """x [B, T, H, D] as the middle third of a fused projection's output [B, T, 3 * H * D], the rest NaN (never
    read): rows read in place through two strided levels."""
    batch, seq_len, num_heads, head_dim = shape
    width = num_heads * head_dim
    buffer = torch.full((batch, seq_len, 3 * width), float("nan"), device="cuda", dtype=dtype)
    x = buffer[..., width:2 * width].view(shape)
    x.copy_(torch.randn(shape, device="cuda", generator=generator) * 3 + 0.5)
    return x


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape,layout", [
    ((1, 65536, 9, 64), "contiguous"),  # a Lightning layer's q/k norm in a 64K prefill of the converted 135M shape
    ((3, 77, 9, 64), "head split"),
    ((1, 4096, 576), "contiguous"),  # a block's norm
    ((2, 9, 3, 64), "permuted"),  # three strided levels: copied first
    ((5, 1, 96), "contiguous"), ((1, 1, 9, 64), "contiguous"),  # decode steps, D not a power of two
])
def test_the_rows_kernel_is_within_one_rounding(shape, layout, dtype):
    generator = torch.Generator("cuda").manual_seed(1)
    if layout == "head split":
        x = head_split_of_a_wider_output(shape, dtype, generator)
    elif layout == "permuted":
        x = (torch.randn(shape, device="cuda", generator=generator) * 3 + 0.5).to(dtype)
        x = x.transpose(1, 2).contiguous().transpose(1, 2)
    else:
        x = (torch.randn(shape, device="cuda", generator=generator) * 3 + 0.5).to(dtype)
    weight = (torch.rand(shape[-1], device="cuda", generator=generator) + 0.5).to(dtype)
    with torch.no_grad():
        out = gpu.rms_norm_rows(x, weight, eps=EPS)
    assert out.shape == x.shape and out.dtype == dtype and out.is_contiguous()
    exact = rms_norm_float64(x, weight, EPS)
    ratio = error_over_bound(out, exact)
    assert ratio <= 1, ratio
    # The reference rounds twice (the normalized rows, then their product with the weight): over a thousand elements
    # or more its largest error is not below the kernel's.
    if x.numel() >= 1000:
        reference = rms_norm_reference(x, weight, eps=EPS)
        assert (out.double() - exact).abs().max() <= (reference.double() - exact).abs().max()


def test_inference_takes_the_rows_kernel_up_to_the_threshold(monkeypatch):
    monkeypatch.setattr(rms_norm_op, "ROWS_KERNEL_MAX_D", 256)
    calls = []
    for name in ("rms_norm_fused", "rms_norm_rows"):
        real = getattr(gpu, name)
        monkeypatch.setattr(gpu, name, lambda *a, name=name, real=real, **k: calls.append(name) or real(*a, **k))
    generator = torch.Generator("cuda").manual_seed(2)
    q = head_split_of_a_wider_output((2, 33, 9, 64), torch.bfloat16, generator)
    hidden = torch.randn(2, 33, 576, device="cuda", generator=generator).bfloat16()
    weight_q, weight_hidden = torch.ones(64, device="cuda").bfloat16(), torch.ones(576, device="cuda").bfloat16()
    with torch.no_grad():
        assert error_over_bound(rms_norm(q, weight_q, eps=EPS), rms_norm_float64(q, weight_q, EPS)) <= 1
        rms_norm(hidden, weight_hidden, eps=EPS)
    assert calls == ["rms_norm_rows", "rms_norm_fused"]
    trained = weight_q.clone().requires_grad_()
    rms_norm(q, trained, eps=EPS).float().sum().backward()
    assert calls == ["rms_norm_rows", "rms_norm_fused"] and trained.grad is not None
