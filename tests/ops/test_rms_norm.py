"""RMSNorm: the reference and torch's fused kernel against a float64 oracle, and which one runs when
(`hyla.ops.rms_norm`: the fused kernel for inference in float16/bfloat16 on CUDA). On CPU the fused path's function is
torch's same formula (one rounding to the input's dtype), so its numbers are checked here; which tensors take it is
checked by letting CPU tensors count as CUDA ones. Its CUDA kernel: tests/ops/test_rms_norm_gpu.py."""

from __future__ import annotations

import pytest
import torch

import hyla.ops.rms_norm as rms_norm_op
from hyla.layers.norm import RMSNorm
from hyla.ops.dispatch import use_backend
from hyla.ops.rms_norm import fused_rms_norm_applies, rms_norm, rms_norm_reference
from hyla.ops.rms_norm.gpu import rms_norm_fused

EPS = 1e-6
# bf16 keeps 8 significant bits: one rounding to nearest is within 2^-8 of the value it rounds, relative; the
# reference rounds twice (the normalized rows, then their product with the rounded weight).
BF16_ROUNDING = 2.0**-8


def oracle(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    x64 = x.double()
    return weight.double() * x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS)


def rows(*shape: int, dtype=torch.bfloat16, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    x = (torch.randn(*shape, generator=generator) * 3 + 0.5).to(dtype)
    weight = (torch.rand(shape[-1], generator=generator) + 0.5).to(dtype)
    return x, weight


def worst_relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).abs() / want.abs().clamp_min(1e-3)).max().item()


@pytest.mark.parametrize("shape", [(3, 7, 576), (2, 5, 9, 64), (1, 1, 13)])
def test_both_forms_are_within_their_roundings_of_float64(shape):
    x, weight = rows(*shape)
    want = oracle(x, weight)
    fused, reference = rms_norm_fused(x, weight, eps=EPS), rms_norm_reference(x, weight, eps=EPS)
    assert fused.dtype == reference.dtype == torch.bfloat16 and fused.shape == x.shape
    assert worst_relative(fused, want) <= BF16_ROUNDING
    assert worst_relative(reference, want) <= 2 * BF16_ROUNDING + BF16_ROUNDING**2
    x32, weight32 = x.float(), weight.float()
    assert torch.allclose(rms_norm_fused(x32, weight32, eps=EPS).double(), oracle(x32, weight32), rtol=1e-6, atol=0)
    assert torch.allclose(rms_norm_reference(x32, weight32, eps=EPS).double(), oracle(x32, weight32), rtol=1e-6,
                          atol=0)


@pytest.fixture
def cpu_counts_as_cuda(monkeypatch):
    """CPU tensors count as CUDA ones, and the fused path's calls are counted."""
    calls = []
    monkeypatch.setattr(rms_norm_op, "_on_cuda", lambda tensor: True)
    import hyla.ops.rms_norm.gpu as gpu

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return rms_norm_fused(*args, **kwargs)

    monkeypatch.setattr(gpu, "rms_norm_fused", counted)
    return calls


def test_inference_in_half_precision_on_cuda_takes_the_fused_kernel(cpu_counts_as_cuda):
    x, weight = rows(4, 576)
    with torch.no_grad():
        out = rms_norm(x, weight, eps=EPS)
    assert cpu_counts_as_cuda == [x.shape] and torch.equal(out, rms_norm_fused(x, weight, eps=EPS))
    with torch.inference_mode():
        rms_norm(x, weight, eps=EPS)
    assert len(cpu_counts_as_cuda) == 2
    # no tensor wants a gradient: grad mode alone does not matter
    rms_norm(x, weight, eps=EPS)
    assert len(cpu_counts_as_cuda) == 3


def test_everything_else_takes_the_reference(cpu_counts_as_cuda, monkeypatch):
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
    assert cpu_counts_as_cuda == [x.shape] and out.dtype == torch.bfloat16
