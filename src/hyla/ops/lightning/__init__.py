"""Lightning attention (fixed per-head decay linear attention, docs/method.md, "Lightning layer"): dispatch + decay
constants."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from hyla.ops.dispatch import resolve_backend
from hyla.ops.lightning.reference import lightning_chunked, lightning_decode_step, lightning_recurrent


# fla's chunk kernel returns a NaN final state when |log-decay| per token exceeds ~1.41 and T is not a multiple of
# its chunk size (docs/method.md, "Kernel notes"); such decays go to the recurrent kernel instead.
CHUNK_SAFE_LOG_DECAY = 1.4


def decay_is_chunk_safe(log_decay: torch.Tensor) -> bool:
    """Whether fla's chunk kernel can take this per-head log-decay (a host read where the tensor is on a device)."""
    return bool((log_decay.abs() <= CHUNK_SAFE_LOG_DECAY).all())


def lightning_log_decay(num_heads: int) -> torch.Tensor:
    """HypeNet's fixed per-head log-decay g_h = -2^(-8h/H), h = 1..H (float64 [H]); gamma_h = exp(g_h)."""
    # An explicit CPU device: models are built under a meta-device context when loaded.
    heads = torch.arange(1, num_heads + 1, dtype=torch.float64, device="cpu")
    return -torch.pow(2.0, -8.0 * heads / num_heads)


# Whether training calls (no state in or out, unpacked rows) go through the custom op `hyla::lightning_chunk`
# (hyla.ops.lightning.custom_op), which torch.compile keeps inside a compiled block, instead of fla's own function,
# around which it splits the block. Compiled code reads it as a constant, but only `lightning_attention`'s own frame
# guards on it: blocks compiled in pieces before a change stay in those pieces (each calling a recompiled
# `lightning_attention`), so switch it before compiling, or reset dynamo's cache.
_custom_op = False


@contextlib.contextmanager
def chunk_kernel_as_custom_op(enabled: bool = True) -> Iterator[None]:
    """Inside the block, Lightning's training calls go through the custom op `hyla::lightning_chunk` (same kernels,
    same values; one compiled graph per block instead of five pieces) when `enabled`."""
    global _custom_op
    if enabled:
        import hyla.ops.lightning.custom_op  # noqa: F401  (registers the op before compiled code looks it up)
    previous, _custom_op = _custom_op, enabled
    try:
        yield
    finally:
        _custom_op = previous


def _custom_op_takes(q: torch.Tensor, initial_state, output_final_state: bool, cu_seqlens, chunk_safe) -> bool:
    return (_custom_op and initial_state is None and not output_final_state and cu_seqlens is None
            and chunk_safe is True and q.shape[1] > 1)


def lightning_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    log_decay: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    cu_seqlens: torch.Tensor | None = None,
    chunk_safe: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """o_t = scale * q_t S_t with S_t = exp(g_h) S_{t-1} + k_t^T v_t.

    q, k: [B, T, H, K]; v: [B, T, H, V]; log_decay: [H]; initial_state: [N, H, K, V] float32;
    cu_seqlens: [N + 1] boundaries of packed sequences (B = 1). Returns (o [B, T, H, V], final state or None).
    chunk_safe: the caller's knowledge that the decays suit fla's chunk kernel (the GPU path otherwise reads
    `log_decay` back from the device, a host sync per call); the references ignore it. Under
    `chunk_kernel_as_custom_op`, a call with no state in or out, unpacked and chunk-safe runs as that op.
    """
    if _custom_op_takes(q, initial_state, output_final_state, cu_seqlens, chunk_safe):
        scale = q.shape[-1] ** -0.5 if scale is None else scale
        return torch.ops.hyla.lightning_chunk(q, k, v, log_decay, scale), None
    kwargs = dict(
        log_decay=log_decay,
        scale=scale,
        initial_state=initial_state,
        output_final_state=output_final_state,
        cu_seqlens=cu_seqlens,
    )
    if resolve_backend(q) == "fla":
        from hyla.ops.lightning.gpu import lightning_fla

        return lightning_fla(q, k, v, **kwargs, chunk_safe=chunk_safe)
    if q.shape[1] == 1:
        return lightning_recurrent(q, k, v, **kwargs)
    return lightning_chunked(q, k, v, **kwargs)


__all__ = ["CHUNK_SAFE_LOG_DECAY", "chunk_kernel_as_custom_op", "decay_is_chunk_safe", "lightning_attention",
           "lightning_chunked", "lightning_decode_step", "lightning_log_decay", "lightning_recurrent"]
