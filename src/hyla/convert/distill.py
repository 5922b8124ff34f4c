"""Stage 2 (end-to-end distillation, KL(teacher || student) at T = 1) and stage 3 (long-context fine-tuning with
next-token cross-entropy). The whole student trains (or all but its attention layers: `freeze`); the teacher is
frozen."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn

from hyla.models import HypeNetForCausalLM
from hyla.models.transfer import to_hypenet
from hyla.ops.linear_loss import linear_cross_entropy_chunked, linear_kl_divergence_chunked
from hyla.train.loop import training_autocast


def build_student(
    hf_teacher: nn.Module, attention_layers: list[int], twins_path=None, *, attention_rope: bool = False,
    rnn_mixer: str = "lightning", **config_overrides,
) -> HypeNetForCausalLM:
    """The hybrid: teacher weights everywhere, attention (NoPE unless `attention_rope`, with a new output gate) at
    `attention_layers`, the aligned `rnn_mixer` twins from stage 1 everywhere else (None: the twins as transferred
    from the attention weights, before alignment). `config_overrides` must match what the twins were built with
    (lightning_rope, lightning_qk_norm; gla_rope, gdn_rope; swa_window). "swa" layers are attention layers and get
    the new output gate too."""
    num_layers = hf_teacher.config.num_hidden_layers
    layer_types = ["attention" if i in attention_layers else rnn_mixer for i in range(num_layers)]
    student = to_hypenet(hf_teacher, layer_types, attention_rope=attention_rope, attention_output_gate=True,
                         **config_overrides)
    if twins_path is None:
        return student
    twins = load_file(str(twins_path))
    for i, block in enumerate(student.model.layers):
        if block.layer_type != rnn_mixer:
            continue
        prefix = f"{i}."
        state = {k[len(prefix):]: v for k, v in twins.items() if k.startswith(prefix)}
        # The stage-2 output gate of an "swa" layer is not in its twin (the teacher's attention): it keeps its init.
        own_gate = ({k: v for k, v in block.mixer.state_dict().items() if k.startswith("g_proj.")}
                    if rnn_mixer == "swa" else {})
        block.mixer.load_state_dict({**own_gate, **state})
    return student


FROZEN_LAYER_TYPES = ("attention", "attention_rope")  # the layers kept as softmax attention (NoPE or RoPE)


def freeze(student: HypeNetForCausalLM, part: str) -> list[str]:
    """Keep `part` of `student` at the weights it comes into the stage with (requires_grad off, so no optimizer
    holds them): "attention", the mixers of the layers kept as softmax attention, NoPE or RoPE (q, k, v, o and any
    q/k norms: the teacher's, or the aligned ones after `model.align_attention`; the new output gate `g_proj` still
    trains); "attention-layers", those layers whole (mixer, gate included, MLP, both norms); "none", nothing.
    Returns the names of the parameters frozen; ValueError if a part other than none finds no such layer."""
    if part == "none":
        return []
    if part not in ("attention", "attention-layers"):
        raise ValueError(f"freeze: unknown part {part!r}; choose none, attention or attention-layers")
    frozen = []
    for i, block in enumerate(student.model.layers):
        if block.layer_type not in FROZEN_LAYER_TYPES:
            continue
        module, prefix = (block, f"model.layers.{i}.") if part == "attention-layers" else \
            (block.mixer, f"model.layers.{i}.mixer.")
        for name, param in module.named_parameters():
            if part == "attention" and name.startswith("g_proj."):
                continue
            param.requires_grad_(False)
            frozen.append(prefix + name)
    if not frozen:
        raise ValueError(f"freeze={part}: the student has no attention layer to freeze")
    return frozen


def bf16_teacher(teacher: nn.Module) -> nn.Module:
    """A frozen bfloat16 copy of `teacher` (weights cast once, not at every autocast step), in eval mode."""
    import copy

    return copy.deepcopy(teacher).to(torch.bfloat16).eval().requires_grad_(False)


class StudentWithTeacher(nn.Module):
    """What the training loop optimises: the student; the teacher rides along, frozen and outside the state dict."""

    def __init__(self, student: HypeNetForCausalLM, teacher: nn.Module | None = None):
        super().__init__()
        self.student = student
        self.teacher = [teacher] if teacher is not None else []


# Rows of the [tokens, vocabulary] logits handled at once by the KL and cross-entropy: float32 temporaries stay
# ~4 x 2048 x V x 4 bytes.
KL_CHUNK_ROWS = 2048


def kl_divergence_reference(teacher_logits: torch.Tensor, student_logits: torch.Tensor) -> torch.Tensor:
    """Mean over tokens of KL(p_teacher || p_student) at temperature 1, written out (float32 copies of everything)."""
    teacher_logp = F.log_softmax(teacher_logits.float(), dim=-1)
    student_logp = F.log_softmax(student_logits.float(), dim=-1)
    per_token = (teacher_logp.exp() * (teacher_logp - student_logp)).sum(-1)
    return per_token.mean()


class _ChunkedKL(torch.autograd.Function):
    """KL(teacher || student) averaged over rows, computed and differentiated a chunk of rows at a time in float32,
    so that no float32 copy of the whole logits tensor exists (~20 GB at 16K tokens x 49K classes). The gradient
    with respect to the student logits is (softmax(student) - softmax(teacher)) / rows."""

    @staticmethod
    def forward(ctx, teacher: torch.Tensor, student: torch.Tensor) -> torch.Tensor:
        total = torch.zeros((), dtype=torch.float64, device=student.device)
        for start in range(0, student.shape[0], KL_CHUNK_ROWS):
            t = F.log_softmax(teacher[start : start + KL_CHUNK_ROWS].float(), dim=-1)
            s = F.log_softmax(student[start : start + KL_CHUNK_ROWS].float(), dim=-1)
            total += (t.exp() * (t - s)).sum(dtype=torch.float64)
        ctx.save_for_backward(teacher, student)
        return (total / student.shape[0]).to(torch.float32)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        teacher, student = ctx.saved_tensors
        grad = torch.empty_like(student)
        scale = grad_output.float() / student.shape[0]
        for start in range(0, student.shape[0], KL_CHUNK_ROWS):
            rows = slice(start, start + KL_CHUNK_ROWS)
            difference = F.softmax(student[rows].float(), dim=-1) - F.softmax(teacher[rows].float(), dim=-1)
            grad[rows] = (difference * scale).to(grad.dtype)
        return None, grad


def kl_divergence(teacher_logits: torch.Tensor, student_logits: torch.Tensor) -> torch.Tensor:
    """Mean over tokens of KL(p_teacher || p_student) at temperature 1 (no gradient to the teacher), in row chunks;
    equal to `kl_divergence_reference` up to float32 summation order."""
    vocab = student_logits.shape[-1]
    return _ChunkedKL.apply(teacher_logits.detach().reshape(-1, vocab), student_logits.reshape(-1, vocab))


class _ChunkedCrossEntropy(torch.autograd.Function):
    """Mean cross-entropy over the rows whose label is not -100, computed and differentiated a chunk of rows at a
    time in float32 (no float32 copy of the whole logits tensor). The gradient with respect to the logits is
    (softmax(logits) - onehot(label)) / valid rows, zero on ignored rows."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        count = (labels != -100).sum().clamp(min=1)
        total = torch.zeros((), dtype=torch.float64, device=logits.device)
        for start in range(0, logits.shape[0], KL_CHUNK_ROWS):
            rows = slice(start, start + KL_CHUNK_ROWS)
            total += F.cross_entropy(logits[rows].float(), labels[rows], ignore_index=-100, reduction="sum")
        ctx.save_for_backward(logits, labels, count)
        return (total / count).to(torch.float32)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        logits, labels, count = ctx.saved_tensors
        grad = torch.empty_like(logits)
        scale = grad_output.float() / count
        for start in range(0, logits.shape[0], KL_CHUNK_ROWS):
            rows = slice(start, start + KL_CHUNK_ROWS)
            probabilities = F.softmax(logits[rows].float(), dim=-1)
            chunk_labels = labels[rows]
            valid = chunk_labels != -100
            index = torch.arange(chunk_labels.shape[0], device=logits.device)[valid]
            probabilities[index, chunk_labels[valid]] -= 1.0
            probabilities[~valid] = 0.0
            grad[rows] = (probabilities * scale).to(grad.dtype)
        return grad, None


def cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (labels -100 ignored) in row chunks, differentiable; equal to
    `F.cross_entropy(logits.float(), labels, ignore_index=-100)` up to float32 summation order."""
    vocab = logits.shape[-1]
    return _ChunkedCrossEntropy.apply(logits.reshape(-1, vocab), labels.reshape(-1))


def chunked_cross_entropy(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy without a float32 copy of all logits (for metrics; no gradient)."""
    return cross_entropy(logits.detach(), labels)


def _flat(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.reshape(-1, tensor.shape[-1]) if tensor.dim() > 2 else tensor.reshape(-1)


def distill_loss(model: StudentWithTeacher, batch: dict, *, fused: bool = False,
                 kernel: str = "torch") -> tuple[torch.Tensor, dict]:
    """KL(teacher || student) over every token; the student's cross-entropy as a metric. fused: the LM heads and the
    loss in row chunks (`hyla.ops.linear_loss`), no [tokens, vocabulary] logits, each chunk's arithmetic through
    `kernel` ("torch" or "triton", `linear_kl_divergence_chunked`); otherwise the logits of both models are
    materialised and the loss taken over them (the reference path)."""
    teacher, student = model.teacher[0], model.student
    ids = batch["input_ids"]
    if not fused:
        with torch.no_grad():
            teacher_logits = teacher(ids, use_cache=False).logits
        student_logits = student(ids, use_cache=False).logits
        loss = kl_divergence(teacher_logits, student_logits)
        return loss, {"student_ce": chunked_cross_entropy(student_logits, batch["labels"])}
    with torch.inference_mode():
        teacher_hidden = teacher.model(ids, use_cache=False).last_hidden_state
    hidden = student.model(ids, use_cache=False).last_hidden_state
    loss, ce = linear_kl_divergence_chunked(_flat(hidden), student.lm_head.weight, _flat(teacher_hidden),
                                            teacher.lm_head.weight, _flat(batch["labels"]), kernel=kernel)
    return loss, {"student_ce": ce}


def finetune_loss(model: StudentWithTeacher, batch: dict, *, fused: bool = False) -> tuple[torch.Tensor, dict]:
    """Next-token cross-entropy of the student; fused as in `distill_loss`."""
    student = model.student
    if not fused:
        logits = student(batch["input_ids"], use_cache=False).logits
        return cross_entropy(logits, batch["labels"]), {}
    hidden = student.model(batch["input_ids"], use_cache=False).last_hidden_state
    return linear_cross_entropy_chunked(_flat(hidden), student.lm_head.weight, _flat(batch["labels"])), {}


def hybrid_stage_loss(model: StudentWithTeacher, batch: dict, stage: str, *,
                      fused: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The loss of the stage that trains the whole hybrid, "distill" (`distill_loss`) or "finetune"
    (`finetune_loss`), and the student's cross-entropy where the stage has it as a metric (distill), else None."""
    if stage == "distill":
        loss, metrics = distill_loss(model, batch, fused=fused)
        return loss, metrics["student_ce"]
    if stage == "finetune":
        return finetune_loss(model, batch, fused=fused)[0], None
    raise ValueError(f"stage must be distill or finetune, got {stage!r}")


@torch.no_grad()
def mean_loss(model: HypeNetForCausalLM, sequences: torch.Tensor) -> float:
    """Mean next-token loss over [N, T] sequences, one at a time, at the precision the model trains and is evaluated
    at (bf16 autocast on GPU: attention takes SDPA's flash kernel)."""
    losses = []
    for row in sequences:
        row = row[None].to(model.device)
        with training_autocast(model.device):
            logits = model(row, use_cache=False).logits
        losses.append(F.cross_entropy(logits[0, :-1].float(), row[0, 1:]).item())
    return sum(losses) / len(losses)
