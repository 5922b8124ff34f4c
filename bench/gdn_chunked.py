"""GDN's chunked form against an earlier one, forward + backward, float32, on the CPU or a GPU.

    python bench/gdn_chunked.py [--before 763b49e | --before-file PATH] [--repeats 20] [--length 1024] [--batch 2]
                                [--heads 4] [--device cpu|cuda] [--profile] [--compile-forms]

--before: 763b49e (the default) holds the per-chunk form before the batched rewrite (fb95138); c7cd81c the batched
form whose loop over chunks read each chunk's matrices by index, before the state scan with its own backward;
5d8cb67 a form that inverted the chunk systems in batched products instead of the triangular solve (slower on an
H100: 0.86x; see docs/log/2026-12-04-seed003-smollm2.md). The earlier form is read from git (`git show
COMMIT:src/hyla/ops/gdn/reference.py`), so run it in a checkout, or from a file (`--before-file`, for a copy of the
tree without git: `git show COMMIT:src/hyla/ops/gdn/reference.py > FILE` first). Prints the two results' relative
differences and the median seconds of each, as a ratio measured in one run; `--profile` adds each form's top
kernels (CUDA) or operators (CPU) of one forward + backward. `--compile-forms` times, as the "after", this checkout's
form with its work within chunks (`_chunk_forms`, no loop) compiled by torch.compile: a candidate for the GPU
fallback, whose time is float32 elementwise traffic.
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


def reference_module(commit: str | None = None, path: str | None = None) -> types.ModuleType:
    """A fresh copy of the GDN reference module: from a file, from a commit, or (neither) this checkout's."""
    if path is None and commit is None:
        path = new_reference.__file__
    if path is not None:
        source = Path(path).read_text()
        name = path
    else:
        root = Path(__file__).resolve().parent.parent
        source = subprocess.run(["git", "show", f"{commit}:src/hyla/ops/gdn/reference.py"], cwd=root, check=True,
                                capture_output=True, text=True).stdout
        name = f"{commit}:reference.py"
    module = types.ModuleType("gdn_reference_before")
    exec(compile(source, name, "exec"), module.__dict__)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default="763b49e", help="the commit whose form is timed against this checkout's")
    parser.add_argument("--before-file", help="the earlier form's reference.py, instead of --before's commit")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--length", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--profile", action="store_true", help="print each form's top kernels of one step")
    parser.add_argument("--compile-forms", action="store_true",
                        help="the after: this checkout's form with _chunk_forms compiled")
    args = parser.parse_args()
    device = torch.device(args.device)
    batch, heads, dim = args.batch, args.heads, 64
    generator = torch.Generator().manual_seed(0)
    q = F.normalize(torch.randn(batch, args.length, heads, dim, generator=generator), dim=-1) * dim**-0.5
    k = F.normalize(torch.randn(batch, args.length, heads, dim, generator=generator), dim=-1)
    v = torch.randn(batch, args.length, heads, dim, generator=generator)
    g = F.logsigmoid(torch.randn(batch, args.length, heads, generator=generator))
    beta = torch.rand(batch, args.length, heads, generator=generator)
    state = torch.randn(batch, heads, dim, dim, generator=generator)
    weights = torch.randn_like(v)
    q, k, v, g, beta, state, weights = (x.to(device) for x in (q, k, v, g, beta, state, weights))

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def run(step):
        leaves = [x.clone().requires_grad_() for x in (q, k, v, g, beta, state)]
        o, final = step(*leaves)
        ((o * weights).sum() + final.sum()).backward()
        return [o.detach(), final.detach(), *(x.grad for x in leaves)]

    def seconds(step):
        run(step)  # warm-up
        times = []
        for _ in range(args.repeats):
            sync()
            start = time.perf_counter()
            run(step)
            sync()
            times.append(time.perf_counter() - start)
        return statistics.median(times)

    def profile(name, step):
        activities = [torch.profiler.ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as profiler:
            run(step)
            sync()
        key = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
        print(f"--- {name}: one forward + backward, top 12 by {key}")
        print(profiler.key_averages().table(sort_by=key, row_limit=12, max_name_column_width=60))

    label = args.before_file or args.before
    before = reference_module(args.before, args.before_file)._chunked_step
    after = new_reference._chunked_step
    if args.compile_forms:
        compiled = reference_module()  # this checkout's form, its chunk forms compiled
        compiled._chunk_forms = torch.compile(compiled._chunk_forms, dynamic=False)
        after = compiled._chunked_step
    differences = [((a - b).norm() / b.norm()).item() for a, b in zip(run(after), run(before))]
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} threads"
    print(f"torch {torch.__version__}, {where}; B={batch} T={args.length} H={heads} K=V={dim}, float32, "
          "forward + backward")
    print("relative difference after vs before (o, state, dq, dk, dv, dg, dbeta, dstate): "
          + " ".join(f"{d:.1e}" for d in differences))
    old, new = seconds(before), seconds(after)
    what = "after, chunk forms compiled" if args.compile_forms else "after"
    print(f"before ({label}) {old * 1e3:.1f} ms, {what} {new * 1e3:.1f} ms (medians of {args.repeats}): {old / new:.2f}x")
    if args.profile:
        profile(f"before ({label})", before)
        profile("after", after)


if __name__ == "__main__":
    main()
