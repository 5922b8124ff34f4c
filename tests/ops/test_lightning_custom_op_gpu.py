"""`hyla::lightning_chunk` on CUDA: the op runs fla's chunk kernels as fla's own `chunk_simple_gla` runs them (same
output and gradients). The fast path's steps with the op: tests/train/test_fast_path_gpu.py."""

import pytest
import torch

from hyla.ops.lightning import chunk_kernel_as_custom_op, lightning_attention, lightning_log_decay

pytestmark = pytest.mark.gpu

# The same fla kernels on the same inputs, in the same order: equal up to the last bits of float32 (the decay's
# pre-scaling by 1 / ln 2 is computed in one place or the other).
SAME_KERNELS_RTOL = 1e-6


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("length", [63, 65, 300, 1000])
def test_custom_op_runs_flas_kernels_as_fla_does(dtype, length):
    gen = torch.Generator(device="cuda").manual_seed(length)
    q, k, v = (torch.randn(2, length, 9, 64, device="cuda", generator=gen).to(dtype) for _ in range(3))
    weights = torch.randn(2, length, 9, 64, device="cuda", generator=gen)
    log_decay = lightning_log_decay(9).cuda()
    results = []
    for enabled in (False, True):
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        with chunk_kernel_as_custom_op(enabled):
            output, _ = lightning_attention(*inputs, log_decay=log_decay, scale=0.125, chunk_safe=True)
        (output.float() * weights).sum().backward()
        results.append((output, *(t.grad for t in inputs)))
    for name, got, want in zip(("output", "dq", "dk", "dv"), results[1], results[0]):
        assert got.dtype == want.dtype and torch.isfinite(got).all(), name
        assert rel(got, want) <= SAME_KERNELS_RTOL, name
