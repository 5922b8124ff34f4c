"""Decode attention: one query per row over a static KV cache whose valid lengths (one per row) live on the device.

The lengths live on the device so that one captured CUDA graph serves every decode step: the kernel reads them, and
no host synchronisation or re-capture is needed as the cache grows. SDPA cannot do this without an explicit mask,
and a mask sends it to its math backend (~30x slower at 512K, docs/method.md, "Reference GPU"). `gpu.py`: split-K
flash decoding in Triton; `reference.py`: the masked pure-torch form. Importing this package does not import triton.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch

from hyla.ops.decode_attention.reference import decode_attention_reference, row_lengths

KERNELS = ("auto", "triton", "torch")


@dataclass(frozen=True)
class DecodeKernelConfig:
    """Launch settings of the split kernel: positions per loop step (block_n), warps and software-pipeline stages
    per program, and programs per multiprocessor (which sets the number of splits). `programs_per_sm=None` picks by
    occupancy: 2 when the batch has fewer (sequence, KV head) pairs than the GPU has multiprocessors, else 4. Those
    were the fastest of {2, 4, 8} on the H200 (`hyla bench sweep decode-attention`, 2026-11-30): at batch 1,
    2 beat 4 by 10% at 128K and 12% at 512K (4.4 TB/s); at batch 32, 32K, 4 beat 2 by 14%."""

    block_n: int = 64
    num_warps: int = 4
    num_stages: int = 3
    programs_per_sm: int | None = None

    def programs_for(self, pairs: int, num_sms: int) -> int:
        """Programs per multiprocessor for `pairs` (sequence, KV head) pairs on `num_sms` multiprocessors."""
        if self.programs_per_sm is not None:
            return self.programs_per_sm
        return 2 if pairs < num_sms else 4


def triton_available() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_head_dim(head_dim: int | None) -> bool:
    """Whether the Triton kernel takes heads of `head_dim` (None: unknown, taken): its tiles span the head
    (`tl.arange` needs a power of two) and `tl.dot` needs an inner dimension of at least 16."""
    return head_dim is None or (head_dim >= 16 and head_dim & (head_dim - 1) == 0)


def resolve_kernel(kernel: str, device: torch.device, head_dim: int | None = None) -> str:
    """"triton" or "torch" for `kernel` ("auto": Triton on CUDA when it is importable and takes `head_dim`)."""
    if kernel not in KERNELS:
        raise ValueError(f"decode attention kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
    if kernel == "auto":
        usable = device.type == "cuda" and triton_available() and triton_head_dim(head_dim)
        return "triton" if usable else "torch"
    if kernel == "triton" and not (device.type == "cuda" and triton_available()):
        raise ValueError(f"the Triton decode attention kernel needs CUDA and triton; the cache is on {device}")
    if kernel == "triton" and not triton_head_dim(head_dim):
        raise ValueError(f"the Triton decode attention kernel needs a head dimension that is a power of two >= 16, "
                         f"got {head_dim}")
    return kernel


def decode_attention(
    q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, length: torch.Tensor | int, *, scale: float,
    kernel: str = "auto", config=None,
) -> torch.Tensor:
    """Same contract as `decode_attention_reference`; `kernel` "auto" runs the Triton split-K kernel on CUDA.
    config: the kernel's launch settings (`gpu.DecodeKernelConfig`; None: its default)."""
    if resolve_kernel(kernel, q.device, q.shape[-1]) == "triton":
        from hyla.ops.decode_attention.gpu import DEFAULT_CONFIG, decode_attention_triton

        return decode_attention_triton(q, keys, values, length, scale=scale, config=config or DEFAULT_CONFIG)
    return decode_attention_reference(q, keys, values, length, scale=scale)


__all__ = ["KERNELS", "DecodeKernelConfig", "decode_attention", "decode_attention_reference", "resolve_kernel",
           "row_lengths", "triton_available"]
