import math

import pytest
import torch

from hyla.ops.attention import softmax_attention, softmax_attention_reference
from hyla.ops.scaling import attention_logit_scale, length_logit_scale


def _qkv(batch, q_len, k_len, heads, kv_heads, dim=8, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, q_len, heads, dim, generator=gen)
    k = torch.randn(batch, k_len, kv_heads, dim, generator=gen)
    v = torch.randn(batch, k_len, kv_heads, dim, generator=gen)
    return q, k, v


@pytest.mark.parametrize("q_len,k_len", [(9, 9), (1, 9), (4, 9)])
@pytest.mark.parametrize("kv_heads", [1, 2, 4])
def test_sdpa_path_matches_reference(q_len, k_len, kv_heads):
    q, k, v = _qkv(2, q_len, k_len, 4, kv_heads)
    expected = softmax_attention_reference(q, k, v)
    assert torch.allclose(softmax_attention(q, k, v), expected, atol=1e-6)


def test_padding_mask_matches_reference_on_real_rows():
    q, k, v = _qkv(2, 6, 6, 4, 2)
    mask = torch.ones(2, 1, 1, 6, dtype=torch.bool)
    mask[0, ..., :3] = False
    out = softmax_attention(q, k, v, attention_mask=mask)
    expected = softmax_attention_reference(q, k, v, attention_mask=mask)
    assert torch.allclose(out[0, 3:], expected[0, 3:], atol=1e-6)
    assert torch.allclose(out[1], expected[1], atol=1e-6)
    assert torch.isfinite(out).all()


def test_gqa_uses_kv_head_of_its_group():
    """Query head j must read KV head j // (H / Hkv): put a distinct constant in each KV head's values."""
    q, k, _ = _qkv(1, 3, 3, 4, 2)
    v = torch.stack([torch.full((1, 3, 8), float(h)) for h in range(2)], dim=2)
    out = softmax_attention(q, k, v)
    assert torch.allclose(out[0, :, :, 0], torch.tensor([0.0, 0.0, 1.0, 1.0]).expand(3, 4))


def test_dynamic_logit_scale_values():
    """docs/method.md, "Attention layer and logit scaling" / seed 000: s_t = log(t + a) / log(a); a = 500: s_0 = 1,
    s_512 ~ 1.11, s_256K ~ 2.01."""
    positions = torch.tensor([[0, 512, 262144]])
    s = attention_logit_scale(positions, a=500.0)[0]
    assert s[0].item() == pytest.approx(1.0)
    assert s[1].item() == pytest.approx(math.log(1012) / math.log(500))
    assert round(s[1].item(), 2) == 1.11
    assert round(s[2].item(), 2) == 2.01
    with pytest.raises(ValueError):
        attention_logit_scale(positions, a=1.0)


def test_length_logit_scale():
    """docs/method.md, "EME": c(L) = log L / log L0 for L >= L0: 4/3 at 64K from 4K; 1 inside the training range."""
    assert length_logit_scale(65536, train_length=4096) == pytest.approx(4 / 3)
    assert length_logit_scale(2048, train_length=4096) == 1.0
