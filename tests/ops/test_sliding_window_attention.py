"""Sliding-window softmax attention: the SDPA path and the reference against a brute-force recomputation of each
query over its own window, for prefill, queries over a cache, GQA and padding masks."""

import pytest
import torch

from hyla.ops.attention import softmax_attention, softmax_attention_reference

# float64 end to end: only the order of summation differs.
ATOL = 1e-12


def qkv(batch, query_length, key_length, heads=4, kv_heads=2, dim=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, query_length, heads, dim, generator=gen, dtype=torch.float64)
    k = torch.randn(batch, key_length, kv_heads, dim, generator=gen, dtype=torch.float64)
    v = torch.randn(batch, key_length, kv_heads, dim, generator=gen, dtype=torch.float64)
    return q, k, v


def brute_force(q, k, v, window):
    """Query i at key position p = Tk - Tq + i attends, with full softmax, to keys max(0, p - W + 1) .. p only."""
    offset = k.shape[1] - q.shape[1]
    out = torch.empty_like(q)
    for i in range(q.shape[1]):
        p = offset + i
        lo = max(0, p - window + 1)
        out[:, i : i + 1] = softmax_attention_reference(q[:, i : i + 1], k[:, lo : p + 1], v[:, lo : p + 1])
    return out


@pytest.mark.parametrize(("query_length", "key_length"), [(23, 23), (1, 23), (5, 30), (3, 3)])
@pytest.mark.parametrize("window", [1, 4, 7, 40])
def test_windowed_attention_equals_brute_force(query_length, key_length, window):
    q, k, v = qkv(2, query_length, key_length, seed=query_length + window)
    expected = brute_force(q, k, v, window)
    for op in (softmax_attention, softmax_attention_reference):
        out = op(q, k, v, window=window)
        assert (out - expected).abs().max().item() <= ATOL, op.__name__


def test_windowed_attention_with_a_padding_mask():
    q, k, v = qkv(2, 20, 20, seed=1)
    mask = torch.ones(2, 1, 1, 20, dtype=torch.bool)
    mask[1, ..., :6] = False
    out = softmax_attention(q, k, v, window=5, attention_mask=mask)
    expected = softmax_attention_reference(q, k, v, window=5, attention_mask=mask)
    assert (out[:, 6:] - expected[:, 6:]).abs().max().item() <= ATOL
    alone = brute_force(q[1:, 6:], k[1:, 6:], v[1:, 6:], 5)
    assert (out[1:, 6:] - alone).abs().max().item() <= ATOL


def test_window_needs_causal_attention():
    q, k, v = qkv(1, 4, 4)
    with pytest.raises(ValueError, match="window"):
        softmax_attention(q, k, v, window=2, causal=False)
    with pytest.raises(ValueError, match="window"):
        softmax_attention(q, k, v, window=0)


def test_fla_path_gets_one_dtype(monkeypatch):
    """Under autocast, RoPE leaves q and k in float32 while v is bf16; fla's parallel_attn needs them equal (it failed
    on the H200 with "Both operands must be same dtype"). The call is checked with a stand-in for the kernel."""
    import sys
    import types

    import hyla.ops.attention as attention

    seen = {}

    def parallel_attn(q, k, v, scale=None, window_size=None):
        seen.update(dtypes=(q.dtype, k.dtype, v.dtype), window=window_size)
        return v.new_zeros(q.shape)

    fake = types.ModuleType("fla.ops.attn")
    fake.parallel_attn = parallel_attn
    monkeypatch.setitem(sys.modules, "fla.ops.attn", fake)
    monkeypatch.setattr(attention, "resolve_backend", lambda tensor: "fla")
    q, k, v = qkv(1, 16, 16)
    out = softmax_attention(q.float(), k.float(), v.bfloat16(), window=4)
    assert seen == {"dtypes": (torch.bfloat16,) * 3, "window": 4} and out.dtype == torch.bfloat16
