"""RMSNorm at the shapes of a 64K-token prefill of the converted 135M shape: the reference (six kernels over float32
copies) against torch's fused kernel and the Triton rows kernel (`hyla.ops.rms_norm`), bf16, no gradient, on CUDA (or
the CPU).

    PYTHONPATH=src python bench/rms_norm.py [--tokens 65536] [--repeats 20] [--device cuda]

Shapes: a block's norm [1, T, 576] (61 of them in a prefill: two a block and the final one; a Lightning layer's o norm,
23 of them, has the same shape) and a Lightning layer's q/k norm [1, T, 9, 64] (46). Prints each form's median
milliseconds and its ratio to the reference measured in one run, each fast form's largest difference from the
reference, the bytes of one read and one write (the floor) and each fast form's bandwidth over them, then the three
forms' time over a prefill's 130 norms. Which form the dispatch takes for narrow rows is
`hyla.ops.rms_norm.ROWS_KERNEL_MAX_D`: 256 where the rows kernel is the faster at [1, T, 9, 64]. On the CPU the rows
kernel runs only under Triton's interpreter (TRITON_INTERPRET=1, a correctness run: its times mean nothing);
otherwise its timing is skipped.
"""

from __future__ import annotations

import importlib.util
import os

import torch

from hyla.bench.timing import kernel_bench_arguments, time_ms
from hyla.ops.rms_norm import ROWS_KERNEL_MAX_D, rms_norm_reference

EPS = 1e-6
# (name, shape with T for the tokens, norms of that shape in a prefill)
SHAPES = (("block norm [1, T, 576]", (1, "T", 576), 61 + 23), ("q/k norm [1, T, 9, 64]", (1, "T", 9, 64), 46))


def median_ms(fn, repeats: int, device: torch.device) -> float:
    return time_ms(fn, device=device, warmup=2, repeats=repeats, budget_s=None)["median_ms"]


def rows_kernel_runs_on(device: torch.device) -> bool:
    """The Triton kernel runs on CUDA, and on the CPU under Triton's interpreter."""
    return device.type == "cuda" or os.environ.get("TRITON_INTERPRET") == "1"


def fast_forms(device: torch.device) -> dict:
    """{name: function} of the forms timed against the reference (gpu.py imports triton: none without it)."""
    if importlib.util.find_spec("triton") is None:
        return {}
    from hyla.ops.rms_norm.gpu import rms_norm_fused, rms_norm_rows

    return {"fused": rms_norm_fused, **({"rows": rms_norm_rows} if rows_kernel_runs_on(device) else {})}


def main() -> None:
    args, device, header = kernel_bench_arguments(__doc__.split("\n")[0])
    forms = fast_forms(device)
    print(f"{header}; the dispatch takes the rows kernel for D <= "
          f"{ROWS_KERNEL_MAX_D} (ROWS_KERNEL_MAX_D, 0: never)")
    skip_note = ("" if "rows" in forms else ", rows skipped (needs CUDA, or TRITON_INTERPRET=1 on the CPU)" if forms
                 else ", fused and rows skipped (gpu.py needs triton)")
    prefill = dict.fromkeys(("reference", *forms), 0.0)
    for name, shape, per_prefill in SHAPES:
        shape = tuple(args.tokens if size == "T" else size for size in shape)
        generator = torch.Generator(device).manual_seed(0)
        x = torch.randn(*shape, device=device, generator=generator).bfloat16()
        weight = (torch.rand(shape[-1], device=device, generator=generator) + 0.5).bfloat16()
        moved = 2 * x.numel() * x.element_size() / 1e6  # one read and one write of the rows: the bytes floor
        with torch.no_grad():
            want = rms_norm_reference(x, weight, eps=EPS).float()
            times = {"reference": median_ms(lambda: rms_norm_reference(x, weight, eps=EPS), args.repeats, device)}
            differences = {}
            for form, function in forms.items():
                differences[form] = (function(x, weight, eps=EPS).float() - want).abs().max().item()
                times[form] = median_ms(lambda: function(x, weight, eps=EPS), args.repeats, device)
        for form, ms in times.items():
            prefill[form] += per_prefill * ms
        timed = ", ".join(f"{form} {ms:.3f} ms: {times['reference'] / ms:.2f}x" for form, ms in times.items()
                          if form != "reference")
        print(f"{name}: reference {times['reference']:.3f} ms{', ' if timed else ''}{timed}{skip_note}; largest "
              f"difference from the reference: {', '.join(f'{f} {d:.3g}' for f, d in differences.items()) or '-'}; "
              f"{moved:.0f} MB moved at least{''.join(f', by {f} at {moved / times[f]:.0f} GB/s' for f in forms)}")
    print(f"a prefill's {sum(count for *_, count in SHAPES)} norms: "
          + ", ".join(f"{form} {ms:.1f} ms" for form, ms in prefill.items()))


if __name__ == "__main__":
    main()
