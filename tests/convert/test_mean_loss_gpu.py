"""The scaling stage's held-out loss on CUDA: a float32 student (as `load_student` gives it) must not materialise
[heads, T, T] attention scores, and the bf16 loss must stay close to the float32 one."""

import pytest
import torch
import torch.nn.functional as F

from hyla import HypeNetConfig, HypeNetForCausalLM
from hyla.convert.distill import mean_loss

pytestmark = pytest.mark.gpu


def student() -> HypeNetForCausalLM:
    torch.manual_seed(0)
    config = HypeNetConfig(
        vocab_size=1000, hidden_size=256, intermediate_size=512, num_hidden_layers=2, num_attention_heads=8,
        num_key_value_heads=2, head_dim=32, layer_types=["lightning", "attention"], attention_logit_scaling_a=500.0,
    )
    return HypeNetForCausalLM(config).to("cuda").float().eval()


def test_mean_loss_does_not_hold_full_attention_scores():
    model, length = student(), 16384
    tokens = torch.randint(0, 1000, (1, length), generator=torch.Generator().manual_seed(1))
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    mean_loss(model, tokens)
    extra = torch.cuda.max_memory_allocated() - before
    scores = 8 * length * length * 4  # one float32 [heads, T, T] score matrix: 8 GiB
    assert extra < scores / 8, f"peak {extra / 2**30:.2f} GiB over the weights"


def test_mean_loss_matches_float32_forward():
    model = student()
    tokens = torch.randint(0, 1000, (2, 700), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        reference = sum(
            F.cross_entropy(model(row[None].cuda(), use_cache=False).logits[0, :-1].double(), row[1:].cuda()).item()
            for row in tokens
        ) / 2
    assert abs(mean_loss(model, tokens) - reference) <= 2e-2 * abs(reference)
