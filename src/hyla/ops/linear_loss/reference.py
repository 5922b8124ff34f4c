"""The language-model losses written out: logits materialised, float32 log-softmax, the plain formulas. The oracle
of the chunked fused versions (`hyla.ops.linear_loss.chunked`) and the training stages' eager reference path.

hidden: [N, H] final hidden states; weight: [V, H] the LM head; labels: [N] next-token ids, -100 ignored.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _wide(tensor: torch.Tensor) -> torch.Tensor:
    """float32, or float64 for float64 inputs."""
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


def linear_kl_divergence_reference(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    teacher_hidden: torch.Tensor,
    teacher_weight: torch.Tensor,
    labels: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(mean over the N rows of KL(p_teacher || p_student) at temperature 1, mean student cross-entropy over the
    rows whose label is not -100 or None without labels). No gradient reaches the teacher; the cross-entropy is a
    metric (no gradient)."""
    student_logits = hidden @ weight.T
    with torch.no_grad():
        teacher_logp = F.log_softmax(_wide(teacher_hidden @ teacher_weight.T), dim=-1)
    student_logp = F.log_softmax(_wide(student_logits), dim=-1)
    kl = (teacher_logp.exp() * (teacher_logp - student_logp)).sum(-1).mean()
    ce = None
    if labels is not None:
        ce = F.cross_entropy(_wide(student_logits.detach()), labels, ignore_index=-100)
    return kl, ce


def linear_cross_entropy_reference(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the rows whose label is not -100."""
    return F.cross_entropy(_wide(hidden @ weight.T), labels, ignore_index=-100)
