"""RMSNorm at the shapes of a 64K-token prefill of the converted 135M shape: the reference (six kernels over float32
copies) against torch's fused kernel (`hyla.ops.rms_norm`), bf16, no gradient, on CUDA (or the CPU).

    PYTHONPATH=src python bench/rms_norm.py [--tokens 65536] [--repeats 20] [--device cuda]

Shapes: a block's norm [1, T, 576] (61 of them in a prefill: two a block and the final one) and a Lightning layer's
q/k norm [1, T, 9, 64] and o norm [1, T, 576] (23 layers). Prints each form's median milliseconds, their ratio
measured in one run, the largest difference between the two and the bytes of one read and one write (the floor).
"""

from __future__ import annotations

import argparse

import torch

from hyla.bench.timing import time_ms
from hyla.ops.rms_norm import rms_norm_reference
from hyla.ops.rms_norm.gpu import rms_norm_fused


def median_ms(fn, repeats: int, device: torch.device) -> float:
    return time_ms(fn, device=device, warmup=2, repeats=repeats, budget_s=None)["median_ms"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=65536)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name(device) if device.type == 'cuda' else 'cpu'}; "
          f"{args.tokens} tokens, bfloat16, no gradient")
    for name, shape in (("block norm [1, T, 576]", (1, args.tokens, 576)),
                        ("q/k norm [1, T, 9, 64]", (1, args.tokens, 9, 64))):
        generator = torch.Generator(device).manual_seed(0)
        x = torch.randn(*shape, device=device, generator=generator).bfloat16()
        weight = (torch.rand(shape[-1], device=device, generator=generator) + 0.5).bfloat16()
        with torch.no_grad():
            difference = (rms_norm_fused(x, weight, eps=1e-6).float()
                          - rms_norm_reference(x, weight, eps=1e-6).float()).abs().max().item()
            reference = median_ms(lambda: rms_norm_reference(x, weight, eps=1e-6), args.repeats, device)
            fused = median_ms(lambda: rms_norm_fused(x, weight, eps=1e-6), args.repeats, device)
        moved = 2 * x.numel() * x.element_size() / 1e6  # one read and one write of the rows: the bytes floor
        print(f"{name}: reference {reference:.3f} ms, fused {fused:.3f} ms: {reference / fused:.2f}x "
              f"(largest difference {difference:.3g}; {moved:.0f} MB moved at least)")


if __name__ == "__main__":
    main()
