"""GDN's chunked form against an earlier commit's, forward + backward, float32 on the CPU.

    python bench/gdn_chunked_cpu.py [--before 763b49e] [--repeats 20] [--length 1024] [--batch 2] [--heads 4]

--before: 763b49e (the default) holds the per-chunk form before the batched rewrite (fb95138); c7cd81c the batched
form whose loop over chunks read each chunk's matrices by index, before the state scan with its own backward. The
earlier form is read from git (`git show COMMIT:src/hyla/ops/gdn/reference.py`), so run it in a checkout. Prints the
two results' relative differences and the median seconds of each, as a ratio measured in one run.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import time
import types
from pathlib import Path

import torch
import torch.nn.functional as F

from hyla.ops.gdn import reference as new_reference

def earlier_reference(commit: str) -> types.ModuleType:
    root = Path(__file__).resolve().parent.parent
    source = subprocess.run(["git", "show", f"{commit}:src/hyla/ops/gdn/reference.py"], cwd=root, check=True,
                            capture_output=True, text=True).stdout
    module = types.ModuleType("gdn_reference_before")
    exec(compile(source, f"{commit}:reference.py", "exec"), module.__dict__)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="763b49e", help="the commit whose form is timed against this checkout's")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    args = parser.parse_args()
    batch, heads, dim = args.batch, args.heads, 64
    generator = torch.Generator().manual_seed(0)
    q = F.normalize(torch.randn(batch, args.length, heads, dim, generator=generator), dim=-1) * dim**-0.5
    k = F.normalize(torch.randn(batch, args.length, heads, dim, generator=generator), dim=-1)
    v = torch.randn(batch, args.length, heads, dim, generator=generator)
    g = F.logsigmoid(torch.randn(batch, args.length, heads, generator=generator))
    beta = torch.rand(batch, args.length, heads, generator=generator)
    state = torch.randn(batch, heads, dim, dim, generator=generator)
    weights = torch.randn_like(v)

    def run(step):
        leaves = [x.clone().requires_grad_() for x in (q, k, v, g, beta, state)]
        o, final = step(*leaves)
        ((o * weights).sum() + final.sum()).backward()
        return [o.detach(), final.detach(), *(x.grad for x in leaves)]

    def seconds(step):
        run(step)  # warm-up
        times = []
        for _ in range(args.repeats):
            start = time.perf_counter()
            run(step)
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    before = earlier_reference(args.before)._chunked_step
    after = new_reference._chunked_step
    differences = [((a - b).norm() / b.norm()).item() for a, b in zip(run(after), run(before))]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; B={batch} T={args.length} H={heads} "
          f"K=V={dim}, float32, forward + backward")
    print("relative difference after vs before (o, state, dq, dk, dv, dg, dbeta, dstate): "
          + " ".join(f"{d:.1e}" for d in differences))
    old, new = seconds(before), seconds(after)
    print(f"before ({args.before}) {old * 1e3:.1f} ms, after {new * 1e3:.1f} ms (medians of {args.repeats}): {old / new:.2f}x")


if __name__ == "__main__":
    main()
