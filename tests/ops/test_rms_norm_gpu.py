"""RMSNorm on CUDA: inference in bf16 takes torch's fused kernel, within one bf16 rounding of float64 (the reference:
two), and training keeps the reference (`hyla.ops.rms_norm`). Speed: `python bench/rms_norm.py`."""

from __future__ import annotations

import pytest
import torch

import hyla.ops.rms_norm.gpu as gpu
from hyla.ops.rms_norm import rms_norm, rms_norm_reference

pytestmark = pytest.mark.gpu

EPS = 1e-6
BF16_ROUNDING = 2.0**-8  # one rounding to nearest keeps 8 significant bits


@pytest.mark.parametrize("shape", [(1, 4099, 576), (2, 1031, 9, 64)])
def test_inference_takes_the_fused_kernel_within_one_rounding(shape, monkeypatch):
    calls = []
    real = gpu.rms_norm_fused
    monkeypatch.setattr(gpu, "rms_norm_fused", lambda *a, **k: calls.append(1) or real(*a, **k))
    generator = torch.Generator("cuda").manual_seed(0)
    x = (torch.randn(*shape, device="cuda", generator=generator) * 3 + 0.5).bfloat16()
    weight = (torch.rand(shape[-1], device="cuda", generator=generator) + 0.5).bfloat16()
    x64 = x.double()
    want = weight.double() * x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + EPS)
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
