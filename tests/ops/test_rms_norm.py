"""RMSNorm: the reference and torch's fused kernel against a float64 oracle, which form runs when (`hyla.ops.rms_norm`:
for inference in float16/bfloat16 on CUDA torch's fused kernel, or the Triton rows kernel for rows of at most
ROWS_KERNEL_MAX_D elements), and the rows kernel itself on CPU tensors through Triton's interpreter, in a process of its
own (the interpreter must be switched on before triton is imported). On CPU torch's fused function is the same formula
(one rounding to the input's dtype), so its numbers are checked here. Which tensors take which kernel is checked by
letting CPU tensors count as CUDA ones, with a stand-in for gpu.py, so that the dispatch tests import no triton. On
CUDA: tests/ops/test_rms_norm_gpu.py."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from interpreted import NEEDS_TRITON, run_under_interpreter
from numerics import FLOAT32_ROUNDING, INTERPRETER_SUBNORMAL_ERROR, INTERPRETER_UNIT_ROUNDING, rms_norm_float64

import hyla.ops.rms_norm as rms_norm_op
from hyla.layers.norm import RMSNorm
from hyla.ops.dispatch import use_backend
from hyla.ops.rms_norm import fused_rms_norm_applies, rms_norm, rms_norm_reference

EPS = 1e-6
# bf16 keeps 8 significant bits: one rounding to nearest is within 2^-8 of the value it rounds, relative; the
# reference rounds twice (the normalized rows, then their product with the rounded weight).
BF16_ROUNDING = 2.0**-8
# The rows kernel's float32 arithmetic (FLOAT32_ROUNDING units, relative): the sum of D squares (D roundings of
# nonnegative terms, D units), halved by the square root, then the mean's division, the epsilon's addition and rsqrt
# (a few units) and the two products (two): under D / 2 + 6 units; (D + 8) units leaves room for any order of
# summation.


def rows(*shape: int, dtype=torch.bfloat16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = (torch.randn(*shape, generator=generator) * 3 + 0.5).to(dtype)
    weight = (torch.rand(shape[-1], generator=generator) + 0.5).to(dtype)
    return x, weight


def worst_relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).abs() / want.abs().clamp_min(1e-3)).max().item()


def rounded_once(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """What both fused kernels compute: normalized and weighted in float32, rounded once to the input's dtype."""
    return F.rms_norm(x, (x.shape[-1],), weight, EPS)


@pytest.mark.parametrize("shape", [(3, 7, 576), (2, 5, 9, 64), (1, 1, 13)])
def test_the_reference_is_within_its_roundings_of_float64(shape):
    x, weight = rows(*shape)
    reference = rms_norm_reference(x, weight, eps=EPS)
    assert reference.dtype == torch.bfloat16 and reference.shape == x.shape
    assert worst_relative(reference, rms_norm_float64(x, weight, EPS)) <= 2 * BF16_ROUNDING + BF16_ROUNDING**2
    x32, weight32 = x.float(), weight.float()
    assert torch.allclose(rms_norm_reference(x32, weight32, eps=EPS).double(), rms_norm_float64(x32, weight32, EPS),
                          rtol=1e-6, atol=0)


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="gpu.py imports triton (the dev extra)")
@pytest.mark.parametrize("shape", [(3, 7, 576), (2, 5, 9, 64), (1, 1, 13)])
def test_torchs_fused_kernel_is_within_one_rounding_of_float64(shape):
    from hyla.ops.rms_norm.gpu import rms_norm_fused

    x, weight = rows(*shape)
    fused = rms_norm_fused(x, weight, eps=EPS)
    assert fused.dtype == torch.bfloat16 and fused.shape == x.shape
    assert worst_relative(fused, rms_norm_float64(x, weight, EPS)) <= BF16_ROUNDING
    x32, weight32 = x.float(), weight.float()
    assert torch.allclose(rms_norm_fused(x32, weight32, eps=EPS).double(), rms_norm_float64(x32, weight32, EPS),
                          rtol=1e-6, atol=0)


@pytest.fixture
def cpu_counts_as_cuda(monkeypatch):
    """CPU tensors count as CUDA ones, and gpu.py is a stand-in that records which kernel each call took (and needs no
    triton): [(kernel, shape)]."""
    calls = []
    monkeypatch.setattr(rms_norm_op, "_on_cuda", lambda tensor: True)
    stand_in = types.ModuleType("hyla.ops.rms_norm.gpu")

    def counted(kernel):
        def norm(hidden_states, weight, *, eps):
            assert eps == EPS
            calls.append((kernel, tuple(hidden_states.shape)))
            return rounded_once(hidden_states, weight)

        return norm

    stand_in.rms_norm_fused, stand_in.rms_norm_rows = counted("fused"), counted("rows")
    monkeypatch.setitem(sys.modules, "hyla.ops.rms_norm.gpu", stand_in)
    return calls


def test_inference_in_half_precision_on_cuda_takes_the_fused_kernel(cpu_counts_as_cuda):
    x, weight = rows(4, 576)
    with torch.no_grad():
        out = rms_norm(x, weight, eps=EPS)
    assert cpu_counts_as_cuda == [("fused", (4, 576))] and torch.equal(out, rounded_once(x, weight))
    with torch.inference_mode():
        rms_norm(x, weight, eps=EPS)
    assert len(cpu_counts_as_cuda) == 2
    # no tensor wants a gradient: grad mode alone does not matter
    rms_norm(x, weight, eps=EPS)
    assert len(cpu_counts_as_cuda) == 3


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rows_up_to_the_threshold_take_the_rows_kernel_and_wider_ones_torchs(cpu_counts_as_cuda, monkeypatch, dtype):
    narrow, at_threshold, wide = rows(2, 5, 9, 64, dtype=dtype), rows(3, 256, dtype=dtype), rows(3, 257, dtype=dtype)
    monkeypatch.setattr(rms_norm_op, "ROWS_KERNEL_MAX_D", 256)
    with torch.no_grad():
        for x, weight in (narrow, at_threshold, wide):
            assert torch.equal(rms_norm(x, weight, eps=EPS), rounded_once(x, weight))
    assert cpu_counts_as_cuda == [("rows", (2, 5, 9, 64)), ("rows", (3, 256)), ("fused", (3, 257))]


def test_the_threshold_zero_sends_every_width_to_torchs_kernel(cpu_counts_as_cuda, monkeypatch):
    monkeypatch.setattr(rms_norm_op, "ROWS_KERNEL_MAX_D", 0)
    with torch.no_grad():
        for shape in ((2, 5, 9, 64), (3, 1), (4, 576), (2, 0)):
            rms_norm(*rows(*shape), eps=EPS)
    assert [kernel for kernel, _ in cpu_counts_as_cuda] == ["fused"] * 4


def test_everything_else_takes_the_reference(cpu_counts_as_cuda, monkeypatch):
    monkeypatch.setattr(rms_norm_op, "ROWS_KERNEL_MAX_D", 1024)
    x, weight = rows(4, 576)
    trained = weight.clone().requires_grad_()
    out = rms_norm(x, trained, eps=EPS)  # training: the gradient flows through the reference
    out.float().sum().backward()
    assert trained.grad is not None
    with torch.no_grad():
        wider = rms_norm(x, weight.float(), eps=EPS)  # a float32 weight on bf16 rows: float32 out, as the teachers
        assert wider.dtype == torch.float32
        stacked = rms_norm(x[None].expand(2, 4, 576), weight.expand(2, 1, 576), eps=EPS)  # per-layer weights
        assert torch.equal(stacked[0], rms_norm_reference(x, weight, eps=EPS))
        rms_norm(x.float(), weight.float(), eps=EPS)  # float32 keeps the teachers' arithmetic
        with use_backend("torch"):
            forced = rms_norm(x, weight, eps=EPS)
        assert torch.equal(forced, rms_norm_reference(x, weight, eps=EPS))
        monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
        rms_norm(x, weight, eps=EPS)  # inside torch.compile: the operations inductor fuses itself
    assert cpu_counts_as_cuda == []


def test_off_cuda_nothing_takes_the_fused_kernel():
    x, weight = rows(4, 576)
    with torch.no_grad():
        assert not fused_rms_norm_applies(x, weight)
        assert torch.equal(rms_norm(x, weight, eps=EPS), rms_norm_reference(x, weight, eps=EPS))


def test_the_module_norms_through_the_dispatch(cpu_counts_as_cuda):
    norm = RMSNorm(576, eps=EPS).to(torch.bfloat16)
    x, _ = rows(2, 3, 576)
    with torch.no_grad():
        out = norm(x)
    assert cpu_counts_as_cuda == [("fused", (2, 3, 576))] and out.dtype == torch.bfloat16


def interpreted_error_over_bound(got: torch.Tensor, exact: torch.Tensor) -> float:
    """The largest |got - exact| over its bound for the rows kernel's float32 arithmetic rounded once, as Triton's
    interpreter rounds, to got's dtype (> 1: outside)."""
    unit, float32_error = INTERPRETER_UNIT_ROUNDING[got.dtype], FLOAT32_ROUNDING * (exact.shape[-1] + 8)
    bound = (unit + float32_error * (1 + unit)) * exact.abs() + INTERPRETER_SUBNORMAL_ERROR[got.dtype]
    return ((got.double() - exact).abs() / bound).max().item()


def check_the_rows_kernel_interpreted() -> None:
    """The Triton rows kernel on CPU tensors (run with TRITON_INTERPRET=1): widths 64, 96 and 576 (the last two not
    powers of two) and tiny ones, odd row counts, rows of a head split read in place from a NaN-filled buffer (two
    strided levels), a permuted view that takes a copy, a single row."""
    from hyla.ops.rms_norm.gpu import rms_norm_rows

    cases = [((1, 37, 9, 64), torch.bfloat16, "slice"), ((3, 77, 9, 64), torch.float16, "slice"),
             ((2, 5, 3, 96), torch.bfloat16, "slice"), ((5, 13, 96), torch.float16, "contiguous"),
             ((3, 7, 576), torch.bfloat16, "contiguous"), ((1, 11, 576), torch.float16, "contiguous"),
             ((2, 9, 3, 64), torch.bfloat16, "permuted"), ((576,), torch.float16, "contiguous"),
             ((11, 3), torch.bfloat16, "contiguous")]
    for shape, dtype, layout in cases:
        values, weight = rows(*shape, dtype=dtype, seed=len(shape) + shape[-1])
        if layout == "slice":
            # the middle third of a fused projection's output [B, T, 3 * H * D]; the rest is NaN, never read
            batch, seq_len, num_heads, head_dim = shape
            width = num_heads * head_dim
            buffer = torch.full((batch, seq_len, 3 * width), float("nan"), dtype=dtype)
            x = buffer[..., width:2 * width].view(shape)
            x.copy_(values)
        elif layout == "permuted":
            x = values.transpose(1, 2).contiguous().transpose(1, 2)  # [B, T, H, D] with H outside T in memory
        else:
            x = values
        got = rms_norm_rows(x, weight, eps=EPS)
        assert got.shape == x.shape and got.dtype == dtype and got.is_contiguous()
        ratio = interpreted_error_over_bound(got, rms_norm_float64(values, weight, EPS))
        assert ratio <= 1, (shape, dtype, layout, ratio)
        print(f"{shape} {dtype} {layout}: error over bound {ratio:.3f}")


@NEEDS_TRITON
def test_the_rows_kernel_matches_the_float64_norm_under_tritons_interpreter():
    stdout = run_under_interpreter(__file__)
    assert stdout.count("error over bound") == 9, stdout


if __name__ == "__main__":
    check_the_rows_kernel_interpreted()
