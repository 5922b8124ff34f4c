"""The fla path of Lightning attention against the pure-torch reference on CUDA: output, final state, gradients."""

import pytest
import torch

from hyla.ops.dispatch import use_backend
from hyla.ops.lightning import lightning_attention, lightning_log_decay

pytestmark = pytest.mark.gpu

# fp32 inputs: fla's chunk kernels run their matmuls in TF32 on Hopper (~1.5e-3 relative, docs/method.md,
# "Kernel notes").
# bf16 inputs: bf16 rounding of q, k, v and of the kernel's intermediate products.
TOLERANCE = {torch.float32: 2e-3, torch.bfloat16: 1e-2}


def rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def make(batch, length, heads, dim, dtype, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    tensors = [torch.randn(batch, length, heads, dim, device="cuda", generator=gen) for _ in range(3)]
    # unit-scale q/k as after HypeNet's RMSNorm
    return [t.to(dtype).requires_grad_() for t in tensors]


def run(backend, q, k, v, state, cu_seqlens):
    with use_backend(backend):
        out, final = lightning_attention(
            q, k, v, log_decay=lightning_log_decay(q.shape[2]).cuda(), initial_state=state,
            output_final_state=True, cu_seqlens=cu_seqlens,
        )
    return out, final


def compare(q, k, v, state, cu_seqlens, dtype):
    tol = TOLERANCE[dtype]
    results = {}
    for backend in ("torch", "fla"):
        inputs = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        init = None if state is None else state.detach().clone().requires_grad_()
        out, final = run(backend, *inputs, init, cu_seqlens)
        weights = torch.randn_like(out, dtype=torch.float32, generator=torch.Generator(device="cuda").manual_seed(9))
        ((out.float() * weights).sum() + final.sum()).backward()
        grads = [t.grad for t in inputs] + ([init.grad] if init is not None else [])
        results[backend] = (out, final, grads)
    ref, fast = results["torch"], results["fla"]
    assert torch.isfinite(fast[0]).all() and torch.isfinite(fast[1]).all()
    assert rel(fast[0], ref[0]) <= tol, "output"
    assert rel(fast[1], ref[1]) <= tol, "final state"
    for name, g_fast, g_ref in zip(["dq", "dk", "dv", "dh0"], fast[2], ref[2]):
        assert rel(g_fast, g_ref) <= tol, name


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("length", [1, 63, 65, 300, 1000])
@pytest.mark.parametrize("with_state", [False, True])
def test_fla_matches_reference(dtype, length, with_state):
    q, k, v = make(2, length, 4, 64, dtype, seed=length)
    state = torch.randn(2, 4, 64, 64, device="cuda") * 0.1 if with_state else None
    compare(q, k, v, state, None, dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fla_packed_sequences_match_reference(dtype):
    q, k, v = make(1, 7 + 65 + 200 + 1, 4, 64, dtype, seed=1)
    cu = torch.tensor([0, 7, 72, 272, 273], device="cuda")
    state = torch.randn(4, 4, 64, 64, device="cuda") * 0.1
    compare(q, k, v, state, cu, dtype)


def test_single_token_decode_uses_recurrent_kernel_and_matches():
    q, k, v = make(3, 1, 16, 128, torch.bfloat16, seed=3)
    state = torch.randn(3, 16, 128, 128, device="cuda") * 0.1
    with torch.no_grad():
        ref = run("torch", q, k, v, state, None)
        fast = run("fla", q, k, v, state, None)
    assert rel(fast[0], ref[0]) <= 1e-2 and rel(fast[1], ref[1]) <= 1e-2
