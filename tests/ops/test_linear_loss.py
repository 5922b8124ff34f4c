"""The LM head fused with its loss, in row chunks, against the plain formulas: value and every gradient, odd row
counts, ignored labels, float32 and bf16, several chunks with a short last one; and no [rows, V] tensor exists. The
Triton KL kernel (`kernel="triton"`) runs in tests/ops/test_kernels_interpreted.py; here, only its refusal off CUDA."""

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from hyla.ops.linear_loss import (
    linear_cross_entropy_chunked,
    linear_cross_entropy_reference,
    linear_kl_divergence_chunked,
    linear_kl_divergence_reference,
)

ROWS, HIDDEN, VOCAB = 37, 24, 61  # odd: 37 rows in chunks of 8 leave a short last chunk


def inputs(dtype, seed=0, ignored=True):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(ROWS, HIDDEN, generator=g, dtype=torch.float64)
    weight = torch.randn(VOCAB, HIDDEN, generator=g, dtype=torch.float64) * 0.5
    teacher_hidden = torch.randn(ROWS, HIDDEN, generator=g, dtype=torch.float64)
    teacher_weight = torch.randn(VOCAB, HIDDEN, generator=g, dtype=torch.float64) * 0.5
    labels = torch.randint(0, VOCAB, (ROWS,), generator=g)
    if ignored:
        labels[::4] = -100
    return [t.to(dtype) for t in (hidden, weight, teacher_hidden, teacher_weight)] + [labels]


def kl_formula(hidden, weight, teacher_hidden, teacher_weight):
    """KL(p_t || p_s) averaged over rows, written from its definition (float64)."""
    p_t = F.softmax(teacher_hidden @ teacher_weight.T, -1)
    log_q = F.log_softmax(hidden @ weight.T, -1)
    return (p_t * (p_t.log() - log_q)).sum(-1).mean()


def ce_formula(hidden, weight, labels):
    logits = hidden @ weight.T
    valid = labels != -100
    picked = logits[valid].gather(-1, labels[valid, None])[:, 0]
    return (torch.logsumexp(logits[valid], -1) - picked).mean()


def gradients(fn, hidden, weight, upstream=0.7):
    hidden = hidden.detach().clone().requires_grad_()
    weight = weight.detach().clone().requires_grad_()
    value = fn(hidden, weight)
    (value * upstream).backward()
    return value.detach(), hidden.grad, weight.grad


def relative(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


# float32: float32 arithmetic against float64 (summation order only); bf16: the head's products round operands and
# logits to bf16 (~4e-3 a value), so both the chunked loss and the plain one land within ~1e-2 of float64.
TOLERANCES = {torch.float32: 1e-5, torch.bfloat16: 3e-2}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk_rows", [8, 64])
def test_chunked_kl_matches_the_formula_in_value_and_gradients(dtype, chunk_rows):
    hidden, weight, teacher_hidden, teacher_weight, labels = inputs(dtype)
    truth = gradients(lambda h, w: kl_formula(h, w, teacher_hidden.double(), teacher_weight.double()),
                      hidden.double(), weight.double())
    fused = gradients(lambda h, w: linear_kl_divergence_chunked(h, w, teacher_hidden, teacher_weight, labels,
                                                                chunk_rows=chunk_rows)[0], hidden, weight)
    plain = gradients(lambda h, w: linear_kl_divergence_reference(h, w, teacher_hidden, teacher_weight)[0],
                      hidden, weight)
    for got, want, base in zip(fused, truth, plain):
        assert got.dtype == base.dtype  # gradients come back in the inputs' dtypes
        assert relative(got, want) <= TOLERANCES[dtype]
        # ...and no worse than the plain formula at the same precision, beyond rounding
        assert relative(got, want) <= 2 * relative(base, want) + 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("ignored", [True, False])
def test_chunked_cross_entropy_matches_the_formula_in_value_and_gradients(dtype, ignored):
    hidden, weight, _, _, labels = inputs(dtype, seed=1, ignored=ignored)
    truth = gradients(lambda h, w: ce_formula(h, w, labels), hidden.double(), weight.double())
    fused = gradients(lambda h, w: linear_cross_entropy_chunked(h, w, labels, chunk_rows=8), hidden, weight)
    plain = gradients(lambda h, w: linear_cross_entropy_reference(h, w, labels), hidden, weight)
    for got, want, base in zip(fused, truth, plain):
        assert relative(got, want) <= TOLERANCES[dtype]
        assert relative(got, want) <= 2 * relative(base, want) + 1e-6
    if ignored:  # rows without a label get no gradient
        assert fused[1][labels == -100].abs().max().item() == 0.0


def test_kl_reports_the_students_cross_entropy_and_leaves_the_teacher_alone():
    hidden, weight, teacher_hidden, teacher_weight, labels = inputs(torch.float64)
    hidden.requires_grad_()
    teacher_weight.requires_grad_()
    kl, ce = linear_kl_divergence_chunked(hidden, weight, teacher_hidden, teacher_weight, labels, chunk_rows=8)
    assert ce.item() == pytest.approx(ce_formula(hidden, weight, labels).item(), rel=1e-12)
    assert not ce.requires_grad
    kl.backward()
    assert teacher_weight.grad is None
    assert linear_kl_divergence_chunked(hidden, weight, teacher_hidden, teacher_weight)[1] is None


def test_autocast_runs_the_head_in_the_autocast_dtype_like_the_plain_loss():
    hidden, weight, teacher_hidden, teacher_weight, labels = inputs(torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fused = linear_kl_divergence_chunked(hidden, weight, teacher_hidden, teacher_weight, labels, chunk_rows=8)
        plain = linear_kl_divergence_reference(hidden, weight, teacher_hidden, teacher_weight, labels)
        fused_ce = linear_cross_entropy_chunked(hidden, weight, labels, chunk_rows=8)
        plain_ce = linear_cross_entropy_reference(hidden, weight, labels)
    # Both take bf16 logits; they differ by float32 summation order only.
    assert fused[0].item() == pytest.approx(plain[0].item(), rel=1e-5)
    assert fused_ce.item() == pytest.approx(plain_ce.item(), rel=1e-5)
    assert fused[0].item() != pytest.approx(kl_formula(*(t.double() for t in inputs(torch.float32)[:4])).item(),
                                            rel=1e-6)  # bf16 logits really were used


class LargestTensor(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(tensor, torch.Tensor):
                self.largest = max(self.largest, tensor.numel())
        return out


def test_no_tensor_of_rows_by_vocabulary_exists_in_forward_or_backward():
    hidden, weight, teacher_hidden, teacher_weight, labels = inputs(torch.float32)
    hidden.requires_grad_()
    weight.requires_grad_()
    with LargestTensor() as probe:
        kl, _ = linear_kl_divergence_chunked(hidden, weight, teacher_hidden, teacher_weight, labels, chunk_rows=8)
        kl.backward()
        linear_cross_entropy_chunked(hidden, weight, labels, chunk_rows=8).backward()
    assert probe.largest <= max(8 * VOCAB, VOCAB * HIDDEN)
    with LargestTensor() as probe:
        linear_kl_divergence_reference(hidden, weight, teacher_hidden, teacher_weight)[0].backward()
    assert probe.largest >= ROWS * VOCAB  # the probe sees the plain loss's logits


def test_the_triton_kl_kernel_is_refused_off_cuda_and_unknown_kernels_are_refused(monkeypatch):
    """kernel="triton" runs on CUDA (and, in tests/ops/test_kernels_interpreted.py, under Triton's interpreter);
    elsewhere, and for a kernel it does not know, the chunked KL says so before any work."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    hidden, weight, teacher_hidden, teacher_weight, labels = inputs(torch.float32)
    with pytest.raises(ValueError, match="runs on CUDA, not cpu"):
        linear_kl_divergence_chunked(hidden, weight, teacher_hidden, teacher_weight, labels, kernel="triton")
    with pytest.raises(ValueError, match="unknown KL kernel 'liger'"):
        linear_kl_divergence_chunked(hidden, weight, teacher_hidden, teacher_weight, labels, kernel="liger")
