"""RoPE at the shape of a 64K-token prefill of the converted 135M shape: the reference (five kernels: negation,
concatenation, two products, a sum) against the Triton kernel (`hyla.ops.rope`), bf16, no gradient, on CUDA.

    PYTHONPATH=src python bench/rope.py [--tokens 65536] [--repeats 20] [--device cuda]

Shape: q or k of a RoPE layer, [1, T, 9, 64] with cos/sin [1, T, 64] (46 rotations in a prefill). Prints each form's
median milliseconds, their ratio measured in one run, the largest difference between the two, the bytes of one read
of x, cos and sin and one write of the output (the floor) and the fused form's bandwidth over them. On the CPU the
kernel runs only under Triton's interpreter (TRITON_INTERPRET=1, a correctness run: its times mean nothing);
otherwise its timing is skipped.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from hyla.bench.timing import kernel_bench_arguments, time_ms
from hyla.ops.rope import apply_rotary_reference

ROTATIONS_PER_PREFILL = 46


def median_ms(fn, repeats: int, device: torch.device) -> float:
    return time_ms(fn, device=device, warmup=2, repeats=repeats, budget_s=None)["median_ms"]


def kernel_runs_on(device: torch.device) -> bool:
    """The Triton kernel runs on CUDA, and on the CPU under Triton's interpreter."""
    if importlib.util.find_spec("triton") is None:
        return False
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def main() -> None:
    args, device, header = kernel_bench_arguments(__doc__.split("\n")[0])
    print(header)
    shape = (1, args.tokens, 9, 64)
    generator = torch.Generator(device).manual_seed(0)
    x = torch.randn(*shape, device=device, generator=generator).bfloat16()
    positions = torch.arange(args.tokens, device=device, dtype=torch.float32)
    inv_freq = 1.0 / 10000.0 ** (torch.arange(0, 64, 2, device=device, dtype=torch.float32) / 64)
    angles = torch.cat((positions[:, None] * inv_freq,) * 2, -1)[None]
    cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
    moved = (2 * x.numel() + cos.numel() + sin.numel()) * x.element_size() / 1e6  # the bytes floor
    name = "q/k rotation [1, T, 9, 64]"
    with torch.no_grad():
        reference = median_ms(lambda: apply_rotary_reference(x, cos, sin), args.repeats, device)
        if not kernel_runs_on(device):
            print(f"{name}: reference {reference:.3f} ms, fused skipped (needs CUDA, or TRITON_INTERPRET=1 on the "
                  f"CPU; {moved:.0f} MB moved at least)")
            return
        from hyla.ops.rope.gpu import apply_rotary_fused

        difference = (apply_rotary_fused(x, cos, sin).float()
                      - apply_rotary_reference(x, cos, sin).float()).abs().max().item()
        fused = median_ms(lambda: apply_rotary_fused(x, cos, sin), args.repeats, device)
    print(f"{name}: reference {reference:.3f} ms, fused {fused:.3f} ms: {reference / fused:.2f}x "
          f"(largest difference {difference:.3g}; {moved:.0f} MB moved at least, by the fused at "
          f"{moved / fused:.0f} GB/s)")
    print(f"{ROTATIONS_PER_PREFILL} rotations (a prefill): reference {ROTATIONS_PER_PREFILL * reference:.1f} ms, "
          f"fused {ROTATIONS_PER_PREFILL * fused:.1f} ms")


if __name__ == "__main__":
    main()
