"""The fused LM-head losses on CUDA (compiled chunk arithmetic, or the KL's Triton kernel; bf16 autocast) against the
plain formulas at SmolLM2-135M's head size."""

import pytest
import torch

from hyla.ops.linear_loss import (
    linear_cross_entropy_chunked,
    linear_cross_entropy_reference,
    linear_kl_divergence_chunked,
    linear_kl_divergence_reference,
)
from hyla.train.step import training_autocast

pytestmark = pytest.mark.gpu

ROWS, HIDDEN, VOCAB = 6007, 576, 49152  # odd rows: a short last chunk


def tensors():
    g = torch.Generator(device="cuda").manual_seed(0)
    hidden = torch.randn(ROWS, HIDDEN, device="cuda", generator=g)
    weight = torch.randn(VOCAB, HIDDEN, device="cuda", generator=g) * 0.05
    teacher_hidden = torch.randn(ROWS, HIDDEN, device="cuda", generator=g)
    teacher_weight = torch.randn(VOCAB, HIDDEN, device="cuda", generator=g) * 0.05
    labels = torch.randint(0, VOCAB, (ROWS,), device="cuda", generator=g)
    labels[::7] = -100
    return hidden, weight, teacher_hidden, teacher_weight, labels


def value_and_grads(fn, hidden, weight):
    hidden = hidden.clone().requires_grad_()
    weight = weight.clone().requires_grad_()
    with training_autocast(hidden.device):
        value = fn(hidden, weight)
    value.backward()
    return [value.detach(), hidden.grad, weight.grad]


def relative(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# Both sides take bf16 logits from the same bf16 products; they differ by the float32 order of the sums and by the
# gradient's rounding to bf16 before its products (the plain path rounds the same quantity once, chunk by chunk).
TOLERANCE = 1e-2


@pytest.mark.parametrize("kernel", ["torch", "triton"])
@pytest.mark.parametrize("chunk_rows", [None, 1000])
def test_fused_kl_on_cuda_matches_the_plain_loss(chunk_rows, kernel):
    hidden, weight, teacher_hidden, teacher_weight, labels = tensors()
    fused = value_and_grads(lambda h, w: linear_kl_divergence_chunked(h, w, teacher_hidden, teacher_weight, labels,
                                                                      chunk_rows=chunk_rows, kernel=kernel)[0],
                            hidden, weight)
    plain = value_and_grads(lambda h, w: linear_kl_divergence_reference(h, w, teacher_hidden, teacher_weight)[0],
                            hidden, weight)
    assert fused[0].item() == pytest.approx(plain[0].item(), rel=1e-4)
    for got, want in zip(fused[1:], plain[1:]):
        assert got.dtype == torch.float32 and relative(got, want) <= TOLERANCE


def test_fused_cross_entropy_on_cuda_matches_the_plain_loss():
    hidden, weight, _, _, labels = tensors()
    fused = value_and_grads(lambda h, w: linear_cross_entropy_chunked(h, w, labels), hidden, weight)
    plain = value_and_grads(lambda h, w: linear_cross_entropy_reference(h, w, labels), hidden, weight)
    assert fused[0].item() == pytest.approx(plain[0].item(), rel=1e-4)
    for got, want in zip(fused[1:], plain[1:]):
        assert relative(got, want) <= TOLERANCE
