"""The calls hyla's GLA / GDN wrappers make into fla 0.6.0, checked on CPU with stand-ins for fla's functions (the
real kernels in Triton's CPU interpreter: test_fla_interpreter.py)."""

import sys
import types

import pytest
import torch
import torch.nn.functional as F

from hyla.ops.gdn import gpu as gdn_gpu
from hyla.ops.gdn.reference import gdn_chunked, gdn_recurrent
from hyla.ops.gla import gpu as gla_gpu
from hyla.ops.gla.reference import gla_recurrent

BATCH, HEADS, KEY_DIM, VALUE_DIM = 2, 3, 8, 5


def gdn_inputs(length, dtype=torch.float32):
    gen = torch.Generator().manual_seed(length)
    shape = (BATCH, length, HEADS)
    q, k = (F.normalize(torch.randn(*shape, KEY_DIM, generator=gen), dim=-1).to(dtype) for _ in range(2))
    v = torch.randn(*shape, VALUE_DIM, generator=gen).to(dtype)
    g = -F.softplus(torch.randn(*shape, generator=gen))
    return dict(q=q, k=k, v=v, g=g, beta=torch.rand(*shape, generator=gen))


def install(monkeypatch, name, **functions):
    module = types.ModuleType(name)
    for key, value in functions.items():
        setattr(module, key, value)
    monkeypatch.setitem(sys.modules, name, module)


def check_fla_gdn_call(q, k, v, *, g, beta, scale, initial_state, output_final_state, cu_seqlens, **extra):
    """fla 0.6.0's contract (fla/ops/gated_delta_rule/chunk.py): q, k [B, T, H, K]; v [B, T, H, V]; g [B, T, H]
    log-space decay; beta [B, T, H] after the sigmoid; state [N, H, K, V]; cu_seqlens int64. No in-kernel l2norm,
    gate or sigmoid, and the [K, V] state layout: the extras must stay at their defaults."""
    assert not extra, extra
    assert g.shape == beta.shape == q.shape[:3] and g.dtype == torch.float32 and bool((g <= 0).all())
    assert beta.dtype == q.dtype and isinstance(scale, float)
    assert initial_state is None or initial_state.dtype == torch.float32
    assert cu_seqlens is None or cu_seqlens.dtype == torch.int64
    return gdn_recurrent(q, k, v, g=g, beta=beta, scale=scale, initial_state=initial_state,
                         output_final_state=output_final_state, cu_seqlens=cu_seqlens)


@pytest.fixture
def fla_gdn(monkeypatch):
    """Stand-ins for fla's GDN kernels; returns the names of the kernels called, in order."""
    calls = []

    def kernel(name):
        def call(*args, **kwargs):
            calls.append(name)
            return check_fla_gdn_call(*args, **kwargs)
        return call

    install(monkeypatch, "fla.ops.gated_delta_rule", chunk_gated_delta_rule=kernel("chunk"),
            fused_recurrent_gated_delta_rule=kernel("fused_recurrent"))
    monkeypatch.setattr(gdn_gpu, "fla_backward_blocker", lambda: None)
    return calls


@pytest.mark.parametrize("length", [1, 65])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_gdn_fla_call_follows_fla_conventions(fla_gdn, length, dtype):
    inputs = gdn_inputs(length, dtype)
    state = torch.randn(BATCH, HEADS, KEY_DIM, VALUE_DIM, dtype=torch.float64)
    out, final = gdn_gpu.gdn_fla(**inputs, initial_state=state, output_final_state=True)
    assert out.shape == inputs["v"].shape and final.shape == state.shape
    with torch.no_grad():
        gdn_gpu.gdn_fla(**inputs)
    assert fla_gdn == ["chunk", "fused_recurrent" if length == 1 else "chunk"]


def test_gdn_fla_packed_call_gets_int64_boundaries(fla_gdn):
    inputs = {n: x[:1] for n, x in gdn_inputs(9).items()}
    gdn_gpu.gdn_fla(**inputs, cu_seqlens=torch.tensor([0, 4, 9], dtype=torch.int32))
    assert fla_gdn == ["chunk"]


def test_gdn_runs_the_reference_when_fla_cannot_differentiate(monkeypatch):
    """fla 0.6.0 raises in GDN's backward on Hopper with Triton 3.6 (the H200's): a differentiated call runs the
    chunked reference, with a warning; calls without grad still take fla's kernels."""
    calls = []
    install(monkeypatch, "fla.ops.gated_delta_rule",
            chunk_gated_delta_rule=lambda *a, **kw: calls.append("chunk") or gdn_recurrent(*a, **kw),
            fused_recurrent_gated_delta_rule=lambda *a, **kw: calls.append("fused") or gdn_recurrent(*a, **kw))
    monkeypatch.setattr(gdn_gpu, "fla_backward_blocker", lambda: "no backward here")
    inputs = gdn_inputs(7)
    leaves = {n: x.clone().requires_grad_() for n, x in inputs.items()}
    with pytest.warns(UserWarning, match="pure-torch chunked form: no backward here"):
        out, _ = gdn_gpu.gdn_fla(**leaves)
    assert calls == [] and torch.equal(out, gdn_chunked(**inputs)[0])
    out.sum().backward()
    assert all(x.grad is not None for x in leaves.values())
    gdn_gpu.gdn_fla(**inputs)
    assert calls == ["chunk"]


@pytest.mark.parametrize(
    ("hopper", "triton", "tilelang", "dispatch_off", "blocked"),
    [
        (True, "3.6.0", False, False, True),
        (True, "3.7.1", False, False, False),
        (False, "3.6.0", False, False, False),
        (True, "3.6.0", True, False, False),
        (True, "3.6.0", True, True, True),
    ],
)
def test_fla_backward_blocker_mirrors_fla_guard(monkeypatch, hopper, triton, tilelang, dispatch_off, blocked):
    """The guard of fla 0.6.0's chunk_bwd_dqkwg: Hopper, 3.4.0 <= Triton < 3.7.1, and no usable TileLang backend."""
    utils = types.SimpleNamespace(IS_NVIDIA_HOPPER=hopper, TRITON_ABOVE_3_4_0=True,
                                  TRITON_ABOVE_3_7_1=triton == "3.7.1")
    backend = type("CommonTileLangBackend", (), {"is_available": staticmethod(lambda: tilelang),
                                                 "is_enabled": lambda self: True})
    install(monkeypatch, "fla", utils=utils)
    install(monkeypatch, "fla.ops.common.backends.tilelang", CommonTileLangBackend=backend)
    install(monkeypatch, "triton", __version__=triton)
    monkeypatch.setenv("FLA_DISABLE_BACKEND_DISPATCH", "1" if dispatch_off else "0")
    gdn_gpu.fla_backward_blocker.cache_clear()
    try:
        reason = gdn_gpu.fla_backward_blocker()
    finally:
        gdn_gpu.fla_backward_blocker.cache_clear()
    assert (reason is not None) == blocked
    assert reason is None or ("#640" in reason and triton in reason)


def test_gla_fla_call_follows_fla_conventions(monkeypatch):
    """chunk_gla takes the per-key log-gate as `g`, fused_recurrent_gla as `gk`; both [B, T, H, K] float32."""
    calls = []

    def kernel(name, gate):
        def call(q, k, v, *, scale, initial_state, output_final_state, cu_seqlens, **gates):
            assert list(gates) == [gate] and gates[gate].dtype == torch.float32 and gates[gate].shape == q.shape
            calls.append(name)
            return gla_recurrent(q, k, v, g=gates[gate], scale=scale, initial_state=initial_state,
                                 output_final_state=output_final_state, cu_seqlens=cu_seqlens)
        return call

    install(monkeypatch, "fla.ops.gla", chunk_gla=kernel("chunk", "g"), fused_recurrent_gla=kernel("fused", "gk"))
    q, k, v = (torch.randn(BATCH, 1, HEADS, KEY_DIM) for _ in range(3))
    g = F.logsigmoid(torch.randn(BATCH, 1, HEADS, KEY_DIM)).double()
    gla_gpu.gla_fla(q, k, v.requires_grad_(), g=g)
    with torch.no_grad():
        gla_gpu.gla_fla(q, k, v, g=g)
    assert calls == ["chunk", "fused"]
