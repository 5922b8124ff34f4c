"""Time and peak memory of each closed form of α~ (hyla.analysis.concentration) on random inputs of a given shape:
the numbers docs/analysis.md quotes for a 32K prompt. Memory is the peak beyond the inputs: CUDA's peak allocation,
or on CPU the growth of the process's peak resident size (so run one form per process there, as below).

    python scripts/analysis_form_memory.py --form gated --length 32K --queries 128
    python scripts/analysis_form_memory.py --form delta --length 32K --queries 1 --device cuda
"""

from __future__ import annotations

import argparse
import resource
import time

import torch

from hyla.analysis.concentration import FORMS, HeadInputs, concentration


def random_inputs(form: str, *, length: int, num_heads: int, num_kv_heads: int, head_dim: int,
                  device: str) -> HeadInputs:
    """q/k as the layers give them (GDN's keys L2-normalised), gates of a slow decay, β in (0, 1)."""
    generator = torch.Generator(device).manual_seed(0)
    kv_heads = num_kv_heads if form == "softmax" else num_heads
    q = torch.randn(1, length, num_heads, head_dim, generator=generator, device=device)
    k = torch.nn.functional.normalize(torch.randn(1, length, kv_heads, head_dim, generator=generator, device=device),
                                      dim=-1)
    gate_shape = (1, length, num_heads, head_dim) if form == "gated" else (1, length, num_heads)
    log_gates = -0.05 * torch.rand(gate_shape, generator=generator, device=device)
    beta = torch.rand(1, length, num_heads, generator=generator, device=device)
    log_decay = -torch.rand(num_heads, dtype=torch.float64, device=device)
    return HeadInputs(form, q, k, scale=head_dim**-0.5, log_decay=log_decay, log_gates=log_gates, beta=beta)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--form", choices=sorted(FORMS), required=True)
    parser.add_argument("--length", default="32K", help="keys L, e.g. 32K")
    parser.add_argument("--queries", type=int, default=128, help="query positions in the block (hitrate: 1)")
    parser.add_argument("--num-heads", type=int, default=9)
    parser.add_argument("--num-kv-heads", type=int, default=3, help="key heads of the softmax form (GQA)")
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()
    length = int(args.length[:-1]) * 1024 if args.length[-1:] in "kK" else int(args.length)
    inputs = random_inputs(args.form, length=length, num_heads=args.num_heads, num_kv_heads=args.num_kv_heads,
                           head_dim=args.head_dim, device=args.device)
    positions = torch.linspace(length // 2, length - 1, args.queries, device=args.device).long()
    cuda = args.device.startswith("cuda")
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    else:
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    started = time.perf_counter()
    alpha = concentration(inputs, positions)
    if cuda:
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    print(f"form={args.form} L={length} queries={args.queries} heads={args.num_heads} head_dim={args.head_dim} "
          f"device={args.device} threads={torch.get_num_threads()}: {time.perf_counter() - started:.2f} s, "
          f"peak +{peak / 2**20:.0f} MiB (the α~ block itself: {alpha.numel() * alpha.element_size() / 2**20:.0f} MiB)")


if __name__ == "__main__":
    main()
