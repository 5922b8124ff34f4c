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


@pytest.mark.parametrize("ignored", [False, True])
def test_chunked_cross_entropy_value_and_gradient_match_the_formula(ignored):
    scores = logits(4).requires_grad_()
    labels = torch.randint(0, 50, (2, 37), generator=torch.Generator().manual_seed(5))
    if ignored:
        labels[0, :9] = -100
        labels[1, 30:] = -100
    reference = scores.detach().clone().requires_grad_()
    weight = 1.3
    (distill.cross_entropy(scores, labels) * weight).backward()
    expected = F.cross_entropy(reference.reshape(-1, 50), labels.reshape(-1), ignore_index=-100) * weight
    expected.backward()
    assert distill.cross_entropy(scores.detach(), labels).item() == pytest.approx(expected.item() / weight, rel=1e-6)
    # Written out: (softmax - onehot) / valid rows on valid rows, zero on ignored ones.
    valid = labels != -100
    closed_form = F.softmax(scores.detach(), -1) - F.one_hot(labels.clamp(min=0), 50).double()
    closed_form = closed_form * valid[..., None] * weight / valid.sum()
    assert torch.allclose(scores.grad, closed_form, rtol=1e-5, atol=1e-9)
    assert torch.allclose(reference.grad, closed_form, rtol=1e-9, atol=1e-12)


class FixedLogitsStudent(torch.nn.Module):
    """A student whose logits are `logits(6)` whatever its input."""

    def forward(self, input_ids, use_cache=False):
        return type("Output", (), {"logits": logits(6, shape=(*input_ids.shape, 50))})()


def fixed_logits_pair_and_batch() -> tuple[distill.StudentWithTeacher, dict]:
    batch = {"input_ids": torch.zeros(2, 37, dtype=torch.long),
             "labels": torch.randint(0, 50, (2, 37), generator=torch.Generator().manual_seed(7))}
    return distill.StudentWithTeacher(FixedLogitsStudent()), batch


def test_finetune_loss_is_the_models_next_token_cross_entropy():
    pair, batch = fixed_logits_pair_and_batch()
    loss, _ = distill.finetune_loss(pair, batch)
    expected = F.cross_entropy(logits(6).reshape(-1, 50), batch["labels"].reshape(-1))
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)


def test_hybrid_stage_loss_is_the_stages_loss_and_metric_by_name():
    pair, batch = fixed_logits_pair_and_batch()
    loss, metric = distill.hybrid_stage_loss(pair, batch, "finetune")
    assert loss.item() == distill.finetune_loss(pair, batch)[0].item() and metric is None
    with pytest.raises(ValueError, match="stage must be distill or finetune, got 'align'"):
        distill.hybrid_stage_loss(pair, batch, "align")
