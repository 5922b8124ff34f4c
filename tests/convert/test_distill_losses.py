"""The chunked distillation losses against their written-out formulas (float64, several chunks)."""

import pytest
import torch
import torch.nn.functional as F

import hyla.convert.distill as distill


@pytest.fixture(autouse=True)
def small_chunks(monkeypatch):
    monkeypatch.setattr(distill, "KL_CHUNK_ROWS", 16)  # 2 x 37 rows -> 5 chunks, the last one short


def logits(seed, shape=(2, 37, 50), scale=3.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * scale


def test_chunked_kl_value_and_gradient_match_the_formula():
    teacher, student = logits(0), logits(1).requires_grad_()
    reference_student = student.detach().clone().requires_grad_()
    weight = 0.7  # a non-unit upstream gradient
    (distill.kl_divergence(teacher, student) * weight).backward()
    expected = distill.kl_divergence_reference(teacher, reference_student) * weight
    expected.backward()
    value = distill.kl_divergence(teacher, student.detach())
    # The chunked path works in float32 (as on GPU); the reference here in float32 too, then compared loosely,
    # and the gradient against the closed form (softmax(s) - softmax(t)) / rows in float64.
    assert value.item() == pytest.approx(expected.item() / weight, rel=1e-5)
    closed_form = (F.softmax(student.detach(), -1) - F.softmax(teacher, -1)) * weight / (2 * 37)
    assert torch.allclose(student.grad, closed_form, rtol=1e-5, atol=1e-9)
    assert torch.allclose(reference_student.grad, closed_form, rtol=1e-5, atol=1e-9)
    assert distill.kl_divergence(teacher, teacher.clone()).item() == pytest.approx(0.0, abs=1e-6)


def test_chunked_kl_keeps_the_student_dtype_for_its_gradient():
    teacher, student = logits(2).bfloat16(), logits(3).bfloat16().requires_grad_()
    distill.kl_divergence(teacher, student).backward()
    assert student.grad.dtype == torch.bfloat16 and torch.isfinite(student.grad).all()


def test_chunked_cross_entropy_matches_and_ignores_masked_labels():
    scores = logits(4)
    labels = torch.randint(0, 50, (2, 37), generator=torch.Generator().manual_seed(5))
    labels[0, :5] = -100
    expected = F.cross_entropy(scores.flatten(0, 1), labels.flatten())
    assert distill.chunked_cross_entropy(scores, labels).item() == pytest.approx(expected.item(), rel=1e-6)
