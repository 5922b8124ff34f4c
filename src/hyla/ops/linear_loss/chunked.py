"""The LM head and its loss fused, a chunk of rows at a time: no [N, V] logits tensor exists, in any precision.

Each chunk computes its logits with the head's matrix product (in the autocast dtype under autocast, as the eager
head does), its loss terms in float32, and at once the gradients with respect to the hidden states and the head's
weight (the loss is a scalar, so the backward pass only scales them). One [chunk, V] logits tensor per model is alive
at a time. The float32 arithmetic of a chunk is one plain-torch function, compiled on CUDA so that it runs as a few
fused kernels instead of a dozen passes over [chunk, V]. The KL's arithmetic can instead run as hyla's Triton
kernel (`kernel="triton"`, `hyla.ops.linear_loss.gpu`), which reads the logits twice where the compiled
function reads them three times; `_kl_terms` is its reference.

Shapes as in `hyla.ops.linear_loss.reference`: hidden [N, H], weight [V, H], labels [N] (-100 ignored).
"""

from __future__ import annotations

import functools
import os

import torch

# Elements of one chunk's [rows, V] logits: ~0.5 GB per bf16 tensor, three alive at once in the KL (student,
# teacher, gradient); large enough that the head's matrix products run at full rate.
CHUNK_ELEMENTS = 2**28
# The KL's per-chunk arithmetic: "torch", `_kl_terms` (compiled on CUDA), or "triton", hyla's kernel (CUDA only).
KL_KERNELS = ("torch", "triton")


def default_chunk_rows(vocab_size: int) -> int:
    return max(256, CHUNK_ELEMENTS // vocab_size // 256 * 256)


def _wide(tensor: torch.Tensor) -> torch.Tensor:
    """float32, or float64 for float64 inputs (the tests' oracle precision)."""
    return tensor.to(torch.promote_types(tensor.dtype, torch.float32))


def _kl_terms(student_logits, teacher_logits, labels, scale):
    """Per chunk: sum over rows of KL(teacher || student), sum of the student's cross-entropy over labelled rows,
    and d(scale * KL sum)/d(student logits) = scale * (softmax(student) - softmax(teacher))."""
    student, teacher = _wide(student_logits), _wide(teacher_logits)
    student_lse = torch.logsumexp(student, dim=-1, keepdim=True)
    teacher_logp = teacher - torch.logsumexp(teacher, dim=-1, keepdim=True)
    student_logp = student - student_lse
    teacher_p = teacher_logp.exp()
    kl = (teacher_p * (teacher_logp - student_logp)).sum()
    valid = labels != -100
    picked = student.gather(-1, labels.clamp(min=0)[:, None])[:, 0]
    ce = torch.where(valid, student_lse[:, 0] - picked, 0.0).sum()
    grad = ((student_logp.exp() - teacher_p) * scale).to(student_logits.dtype)
    return kl, ce, grad


def _ce_terms(logits, labels, scale):
    """Per chunk: sum of the cross-entropy over labelled rows and d(scale * that sum)/d(logits) =
    scale * (softmax(logits) - onehot(label)), zero on ignored rows."""
    values = _wide(logits)
    lse = torch.logsumexp(values, dim=-1, keepdim=True)
    valid = labels != -100
    picked = values.gather(-1, labels.clamp(min=0)[:, None])[:, 0]
    ce = torch.where(valid, lse[:, 0] - picked, 0.0).sum()
    target = torch.arange(values.shape[-1], device=values.device)[None, :] == labels[:, None]
    grad = ((values - lse).exp() - target.to(values.dtype)) * (valid[:, None].to(values.dtype) * scale)
    return ce, grad.to(logits.dtype)


@functools.cache
def _compiled(fn):
    return torch.compile(fn, dynamic=False)


def _terms(fn, compiled: bool):
    return _compiled(fn) if compiled else fn


def _kl_terms_for(kernel: str, compiled: bool, device: torch.device):
    """The function computing `_kl_terms` per chunk for `kernel` (one of KL_KERNELS) on `device`."""
    if kernel not in KL_KERNELS:
        raise ValueError(f"unknown KL kernel {kernel!r}; known: {', '.join(KL_KERNELS)}")
    if kernel == "torch":
        return _terms(_kl_terms, compiled)
    # Triton's interpreter runs the kernel on CPU tensors: the tests' way to check it without a GPU.
    if device.type != "cuda" and not (device.type == "cpu" and os.environ.get("TRITON_INTERPRET") == "1"):
        raise ValueError(f'the KL kernel "triton" runs on CUDA, not {device.type}; use kernel="torch"')
    from hyla.ops.linear_loss.gpu import kl_terms_triton

    return kl_terms_triton


def _compute_dtype(tensor: torch.Tensor) -> torch.dtype:
    """The dtype the head's matrix product runs in: autocast's where it is on, else the hidden states' own."""
    device_type = tensor.device.type
    if torch.is_autocast_enabled(device_type):
        return torch.get_autocast_dtype(device_type)
    return tensor.dtype


def _head_gradients(grad_logits, hidden_chunk, weight, grad_hidden, grad_weight, rows: slice) -> None:
    if grad_hidden is not None:
        grad_hidden[rows] = grad_logits @ weight
    if grad_weight is not None:
        # Each chunk's [V, H] product in the compute dtype, summed over chunks in float32.
        grad_weight += grad_logits.T @ hidden_chunk


def _accumulation_dtype(tensor: torch.Tensor) -> torch.dtype:
    return torch.promote_types(tensor.dtype, torch.float32)


def _gradient_buffers(ctx, hidden, weight):
    grad_hidden = torch.empty_like(hidden) if ctx.needs_input_grad[0] else None
    grad_weight = (torch.zeros(weight.shape, dtype=_accumulation_dtype(weight), device=weight.device)
                   if ctx.needs_input_grad[1] else None)
    return grad_hidden, grad_weight


def _scaled_gradients(ctx, grad_output, num_inputs: int):
    grad_hidden, grad_weight = ctx.saved_tensors
    scale = grad_output
    grads = [None] * num_inputs
    if grad_hidden is not None:
        grads[0] = (grad_hidden * scale).to(ctx.hidden_dtype)
    if grad_weight is not None:
        grads[1] = (grad_weight * scale).to(ctx.weight_dtype)
    return tuple(grads)


class _LinearKL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, teacher_hidden, teacher_weight, labels, chunk_rows, terms):
        dtype = _compute_dtype(hidden)
        ctx.hidden_dtype, ctx.weight_dtype = hidden.dtype, weight.dtype
        with torch.autocast(hidden.device.type, enabled=False):
            hidden, weight = hidden.to(dtype), weight.to(dtype)
            teacher_hidden, teacher_weight = teacher_hidden.to(dtype), teacher_weight.to(dtype)
            rows = hidden.shape[0]
            grad_hidden, grad_weight = _gradient_buffers(ctx, hidden, weight)
            kl = torch.zeros((), dtype=_accumulation_dtype(hidden), device=hidden.device)
            ce = torch.zeros_like(kl)
            scale = torch.full((), 1.0 / max(rows, 1), dtype=kl.dtype, device=hidden.device)
            for start in range(0, rows, chunk_rows):
                chunk = slice(start, start + chunk_rows)
                chunk_kl, chunk_ce, grad_logits = terms(hidden[chunk] @ weight.T,
                                                        teacher_hidden[chunk] @ teacher_weight.T,
                                                        labels[chunk], scale)
                kl += chunk_kl
                ce += chunk_ce
                _head_gradients(grad_logits, hidden[chunk], weight, grad_hidden, grad_weight, chunk)
        ctx.save_for_backward(grad_hidden, grad_weight)
        ce = ce / (labels != -100).sum().clamp(min=1)
        ctx.mark_non_differentiable(ce)
        return kl * scale, ce

    @staticmethod
    def backward(ctx, grad_kl, grad_ce):
        return _scaled_gradients(ctx, grad_kl, 7)


class _LinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, labels, chunk_rows, compiled):
        dtype = _compute_dtype(hidden)
        ctx.hidden_dtype, ctx.weight_dtype = hidden.dtype, weight.dtype
        with torch.autocast(hidden.device.type, enabled=False):
            hidden, weight = hidden.to(dtype), weight.to(dtype)
            grad_hidden, grad_weight = _gradient_buffers(ctx, hidden, weight)
            ce = torch.zeros((), dtype=_accumulation_dtype(hidden), device=hidden.device)
            scale = 1.0 / (labels != -100).sum().clamp(min=1).to(ce.dtype)
            terms = _terms(_ce_terms, compiled)
            for start in range(0, hidden.shape[0], chunk_rows):
                chunk = slice(start, start + chunk_rows)
                chunk_ce, grad_logits = terms(hidden[chunk] @ weight.T, labels[chunk], scale)
                ce += chunk_ce
                _head_gradients(grad_logits, hidden[chunk], weight, grad_hidden, grad_weight, chunk)
        ctx.save_for_backward(grad_hidden, grad_weight)
        return ce * scale

    @staticmethod
    def backward(ctx, grad_output):
        return _scaled_gradients(ctx, grad_output, 5)


def _no_labels(hidden: torch.Tensor) -> torch.Tensor:
    return torch.full(hidden.shape[:1], -100, dtype=torch.long, device=hidden.device)


def linear_kl_divergence_chunked(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    teacher_hidden: torch.Tensor,
    teacher_weight: torch.Tensor,
    labels: torch.Tensor | None = None,
    *,
    chunk_rows: int | None = None,
    compiled: bool | None = None,
    kernel: str = "torch",
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """`linear_kl_divergence_reference` in row chunks. kernel: each chunk's float32 arithmetic as plain torch
    ("torch", the default) or as hyla's Triton kernel ("triton": CUDA only; `hyla.ops.linear_loss.gpu`).
    compiled: the "torch" arithmetic through torch.compile (default: on CUDA)."""
    chunk_rows = chunk_rows or default_chunk_rows(weight.shape[0])
    compiled = hidden.is_cuda if compiled is None else compiled
    terms = _kl_terms_for(kernel, compiled, hidden.device)
    kl, ce = _LinearKL.apply(hidden, weight, teacher_hidden.detach(), teacher_weight.detach(),
                             _no_labels(hidden) if labels is None else labels, chunk_rows, terms)
    return kl, (None if labels is None else ce)


def linear_cross_entropy_chunked(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    *,
    chunk_rows: int | None = None,
    compiled: bool | None = None,
) -> torch.Tensor:
    """`linear_cross_entropy_reference` in row chunks."""
    chunk_rows = chunk_rows or default_chunk_rows(weight.shape[0])
    compiled = hidden.is_cuda if compiled is None else compiled
    return _LinearCrossEntropy.apply(hidden, weight, labels, chunk_rows, compiled)
