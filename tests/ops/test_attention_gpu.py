"""Softmax attention on CUDA in float32 with grouped-query heads: the memory-efficient kernel, not SDPA's math path
(which would hold [B, H, T, T] float32 scores), with the reference's output."""

import pytest
import torch

from hyla.ops.attention import softmax_attention, softmax_attention_reference

pytestmark = pytest.mark.gpu


def qkv(length: int, heads: int = 8, kv_heads: int = 2, dim: int = 64):
    generator = torch.Generator("cuda").manual_seed(0)
    q = torch.randn(1, length, heads, dim, device="cuda", generator=generator)
    k = torch.randn(1, length, kv_heads, dim, device="cuda", generator=generator)
    v = torch.randn(1, length, kv_heads, dim, device="cuda", generator=generator)
    return q, k, v


def test_float32_grouped_attention_does_not_hold_the_score_matrix():
    length = 16384
    q, k, v = qkv(length)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    with torch.no_grad():
        softmax_attention(q, k, v)
    extra = torch.cuda.max_memory_allocated() - before
    scores = 8 * length * length * 4  # one float32 [H, T, T] score matrix: 8 GiB
    assert extra < scores / 16, f"peak {extra / 2**30:.2f} GiB"


@pytest.mark.parametrize("length", [1, 100, 333])  # 1 and 100 (<= 2 x head dim) stay on enable_gqa's path
def test_float32_grouped_attention_matches_reference(length):
    q, k, v = qkv(length)
    fast = softmax_attention(q, k, v)
    ref = softmax_attention_reference(q.double(), k.double(), v.double())
    assert ((fast.double() - ref).norm() / ref.norm()).item() <= 1e-4
    decode = softmax_attention(q[:, -1:], k, v)  # one query over a cache
    assert ((decode.double() - ref[:, -1:]).norm() / ref[:, -1:].norm()).item() <= 1e-4
