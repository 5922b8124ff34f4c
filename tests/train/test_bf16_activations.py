"""Training with the hybrid's activations in bf16 (`use_autocast_activations`, the stage setting
`distill.bf16_activations` / `finetune.bf16_activations`) under CPU bf16 autocast, against the default (float32
residual stream) and a float64 oracle: the loss, the student's cross-entropy metric and every gradient, on an odd
token count with ignored labels; which tensors are bf16; and no change outside autocast."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from hyla.bench.train import TOY
from hyla.convert.distill import StudentWithTeacher, build_student, hybrid_stage_loss
from hyla.models.modeling import use_autocast_activations
from hyla.models.transfer import to_hypenet

# bf16 keeps 8 significant bits: one rounding moves a value by at most 2^-8 of itself.
BF16_UNIT_ROUNDOFF = 2.0**-8
# Under autocast the default path already rounds every product's inputs to bf16 (one rounding per value per matrix
# product); bf16 activations add one rounding per value where the residual stream, a norm's output or the residual
# gradient is written. That at most doubles the roundings a value sees: independent errors then grow by sqrt(2),
# errors all of one sign by 2 at most, so the gradients' error against float64 at most doubles (measured 1.10-1.45x
# on this model over seeds 0-3; 1.14x at seed 0). The default's error is ~2e-2 here: a lost or detached term, or a
# gradient in the wrong place, moves the gradients by far more.
GRADIENT_ERROR_GROWTH = 2.0
TOKENS = 37  # odd: a short last Lightning chunk, rows of the fused loss not a multiple of anything


@pytest.fixture(scope="module")
def models():
    """The toy teacher's HypeNet equivalent and a hybrid student (an attention block, Lightning with q/k norms and
    RoPE elsewhere), float64."""
    torch.manual_seed(0)
    hf_teacher = LlamaForCausalLM(LlamaConfig(**TOY)).eval()
    teacher = to_hypenet(hf_teacher, attention_rope=True).double().eval()
    student = build_student(hf_teacher, [1], None, lightning_rope=True, lightning_qk_norm=True).double().train()
    ids = torch.randint(0, TOY["vocab_size"], (2, TOKENS + 1), generator=torch.Generator().manual_seed(1))
    labels = ids[:, 1:].clone()
    labels[:, ::5] = -100
    return teacher, student, {"input_ids": ids[:, :-1], "labels": labels}


def step(models, stage: str, *, dtype: torch.dtype, autocast: bool, bf16_activations: bool):
    """(loss, metric or None, {name: gradient}, {where: dtype}) of one training step's loss of `stage`; the dtypes
    of the first block's output (the residual stream) and of a Lightning q-norm's output."""
    teacher, student, batch = models
    student = copy.deepcopy(student).to(dtype)
    use_autocast_activations(student, bf16_activations)
    seen = {}

    def record(where):
        def hook(module, inputs, output):
            seen.setdefault(where, output.dtype)
        return hook

    lightning = next(block for block in student.model.layers if block.layer_type == "lightning")
    hooks = [student.model.layers[0].register_forward_hook(record("residual")),
             lightning.mixer.q_norm.register_forward_hook(record("q_norm"))]
    pair = StudentWithTeacher(student, teacher.to(dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss, metric = hybrid_stage_loss(pair, batch, stage, fused=True)
    loss.backward()
    metric = None if metric is None else metric.item()
    for hook in hooks:
        hook.remove()
    grads = {name: p.grad for name, p in student.named_parameters()}
    return loss.item(), metric, grads, seen


def gradient_error(grads, oracle) -> float:
    got = torch.cat([g.double().flatten() for g in grads.values()])
    want = torch.cat([g.flatten() for g in oracle.values()])
    return ((got - want).norm() / want.norm()).item()


@pytest.mark.parametrize("stage", ["distill", "finetune"])
def test_bf16_activations_move_loss_and_gradients_by_bf16_rounding_only(models, stage):
    oracle = step(models, stage, dtype=torch.float64, autocast=False, bf16_activations=False)
    default = step(models, stage, dtype=torch.float32, autocast=True, bf16_activations=False)
    half = step(models, stage, dtype=torch.float32, autocast=True, bf16_activations=True)
    assert default[3] == {"residual": torch.float32, "q_norm": torch.float32}
    assert half[3] == {"residual": torch.bfloat16, "q_norm": torch.bfloat16}
    assert half[0] != default[0]  # the setting was applied
    # The loss is a mean over tokens of values each within a few bf16 roundings of the truth.
    for run in (default, half):
        assert abs(run[0] - oracle[0]) <= BF16_UNIT_ROUNDOFF * abs(oracle[0])
        if stage == "distill":  # the student's cross-entropy over the labelled tokens only
            assert abs(run[1] - oracle[1]) <= BF16_UNIT_ROUNDOFF * abs(oracle[1])
    # Master weights stay float32: so do their gradients, every one of them reached.
    assert all(g is not None and g.dtype == torch.float32 and torch.isfinite(g).all() for g in half[2].values())
    assert gradient_error(half[2], oracle[2]) <= GRADIENT_ERROR_GROWTH * gradient_error(default[2], oracle[2])


def test_without_autocast_bf16_activations_change_nothing(models):
    """CPU training runs without autocast (`training_autocast`): the setting leaves the step bitwise as it was."""
    plain = step(models, "distill", dtype=torch.float32, autocast=False, bf16_activations=False)
    set_ = step(models, "distill", dtype=torch.float32, autocast=False, bf16_activations=True)
    assert set_[0] == plain[0] and set_[3] == plain[3] == {"residual": torch.float32, "q_norm": torch.float32}
    assert all(torch.equal(set_[2][name], grad) for name, grad in plain[2].items())
