"""The KL's per-chunk arithmetic (`hyla.ops.linear_loss.chunked._kl_terms`, its reference) as one Triton kernel that
reads each logit twice instead of three times.

torch.compile's kernel for `_kl_terms` reads the student's and the teacher's logits once for each log-sum-exp (max,
then sum) and once more for the gradient and the KL. Here one program per row reads both rows once, keeping a running
maximum and a sum rescaled to it (an online log-sum-exp), then once more to write the gradient and sum the row's KL
and cross-entropy terms. The row's results go to a float32 buffer per row, summed in torch afterwards (no atomics:
the sums are deterministic). Arithmetic in float32 whatever the logits' dtype; the gradient is written in the student
logits' dtype. `scale` is read from device memory, so the caller needs no host synchronisation.
Imported only on CUDA (or under Triton's interpreter): `import hyla` never imports triton.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# Vocabulary entries per loop step (at most; a smaller power of two covers a smaller vocabulary) and warps per row:
# one 16-byte load per thread and tensor a step in bf16, 62 registers a thread for sm_90 (ptxas), so four rows'
# programs fit a multiprocessor. Not yet tuned on a GPU.
BLOCK_V = 2048
NUM_WARPS = 8
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# A lane's running maximum before its first entry: below any logit, and exp(logit - EMPTY_MAX) underflows to 0.
EMPTY_MAX = tl.constexpr(-1e30)


@triton.jit
def _online_logsumexp(running_max, running_sum, values):
    """One step of a per-lane log-sum-exp: running_sum = sum of exp(value - running_max) over the lane's values so
    far. Of the two factors a step needs, exp(old max - new max) and exp(value - new max), one is exp(0) = 1: one
    exponential per element. A value of -inf (a masked entry) adds exp(-inf) = 0 and leaves the maximum."""
    distance = tl.exp(-tl.abs(values - running_max))
    larger = values > running_max
    running_sum = tl.where(larger, running_sum * distance + 1.0, running_sum + distance)
    return tl.maximum(running_max, values), running_sum


@triton.jit
def _merged_logsumexp(running_max, running_sum):
    """The row's log-sum-exp from its lanes' states (a lane that saw no entry holds EMPTY_MAX and sum 0)."""
    row_max = tl.max(running_max, 0)
    return row_max + tl.log(tl.sum(running_sum * tl.exp(running_max - row_max), 0))


@triton.jit
def _kl_rows_kernel(
    student_ptr, teacher_ptr, labels_ptr, scale_ptr, grad_ptr, kl_ptr, ce_ptr, vocab_size,
    stride_student, stride_teacher, stride_grad, BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0)
    student_row = student_ptr + row.to(tl.int64) * stride_student
    teacher_row = teacher_ptr + row.to(tl.int64) * stride_teacher
    grad_row = grad_ptr + row.to(tl.int64) * stride_grad
    cols = tl.arange(0, BLOCK_V)
    # Lanes start at a finite maximum, not -inf, so that a masked entry (-inf) never computes -inf - -inf.
    student_max = tl.full([BLOCK_V], EMPTY_MAX, tl.float32)
    teacher_max = tl.full([BLOCK_V], EMPTY_MAX, tl.float32)
    student_sum = tl.zeros([BLOCK_V], tl.float32)
    teacher_sum = tl.zeros([BLOCK_V], tl.float32)
    num_blocks = tl.cdiv(vocab_size, BLOCK_V)
    for block in range(0, num_blocks):
        offs = block * BLOCK_V + cols
        mask = offs < vocab_size
        student = tl.load(student_row + offs, mask=mask, other=float("-inf")).to(tl.float32)
        teacher = tl.load(teacher_row + offs, mask=mask, other=float("-inf")).to(tl.float32)
        student_max, student_sum = _online_logsumexp(student_max, student_sum, student)
        teacher_max, teacher_sum = _online_logsumexp(teacher_max, teacher_sum, teacher)
    student_lse = _merged_logsumexp(student_max, student_sum)
    teacher_lse = _merged_logsumexp(teacher_max, teacher_sum)
    scale = tl.load(scale_ptr).to(tl.float32)
    kl = tl.zeros([BLOCK_V], tl.float32)
    # Backwards: the blocks the first pass read last are the likeliest to still be in L2.
    for step in range(0, num_blocks):
        offs = (num_blocks - 1 - step) * BLOCK_V + cols
        mask = offs < vocab_size
        student_logp = tl.load(student_row + offs, mask=mask, other=0.0).to(tl.float32) - student_lse
        teacher_logp = tl.load(teacher_row + offs, mask=mask, other=0.0).to(tl.float32) - teacher_lse
        teacher_p = tl.exp(teacher_logp)
        grad = (tl.exp(student_logp) - teacher_p) * scale
        tl.store(grad_row + offs, grad.to(grad_ptr.dtype.element_ty), mask=mask)
        kl += tl.where(mask, teacher_p * (teacher_logp - student_logp), 0.0)
    tl.store(kl_ptr + row, tl.sum(kl, 0))
    label = tl.load(labels_ptr + row)
    labelled = label != -100
    picked = tl.load(student_row + tl.where(labelled, label, 0)).to(tl.float32)
    tl.store(ce_ptr + row, tl.where(labelled, student_lse - picked, 0.0))


def kl_terms_triton(student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor,
                    scale: torch.Tensor, *, block_v: int = BLOCK_V, num_warps: int = NUM_WARPS):
    """`_kl_terms` for one chunk: (sum over rows of KL(teacher || student), sum of the student's cross-entropy over
    the rows whose label is not -100, scale * (softmax(student) - softmax(teacher)) in the student logits' dtype).

    student_logits, teacher_logits: [rows, V], float32, bfloat16 or float16, the last dimension contiguous; labels:
    [rows] integers in [0, V) or -100; scale: one float element on the logits' device. The sums come back as float32
    0-dim tensors. block_v: vocabulary entries per loop step (a power of two; capped at V's next power of two)."""
    if student_logits.dim() != 2 or teacher_logits.shape != student_logits.shape:
        raise ValueError(f"the KL kernel takes student and teacher logits of one shape [rows, V], got "
                         f"{tuple(student_logits.shape)} and {tuple(teacher_logits.shape)}")
    if student_logits.dtype not in DTYPES or teacher_logits.dtype not in DTYPES:
        raise ValueError(f"the KL kernel takes logits in {DTYPES}, got {student_logits.dtype} and "
                         f"{teacher_logits.dtype}")
    if labels.shape != student_logits.shape[:1] or scale.numel() != 1:
        raise ValueError("the KL kernel takes one label per row and a one-element scale")
    student_logits, teacher_logits = (t if t.stride(-1) == 1 else t.contiguous() for t in (student_logits,
                                                                                         teacher_logits))
    rows, vocab_size = student_logits.shape
    grad = torch.empty_like(student_logits, memory_format=torch.contiguous_format)
    kl_rows = torch.empty(rows, dtype=torch.float32, device=student_logits.device)
    ce_rows = torch.empty_like(kl_rows)
    if rows:
        _kl_rows_kernel[(rows,)](
            student_logits, teacher_logits, labels.contiguous(), scale, grad, kl_rows, ce_rows, vocab_size,
            student_logits.stride(0), teacher_logits.stride(0), grad.stride(0),
            BLOCK_V=min(block_v, triton.next_power_of_2(vocab_size)), num_warps=num_warps,
        )
    return kl_rows.sum(), ce_rows.sum(), grad
