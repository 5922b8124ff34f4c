"""What a prefill attention backend costs the first time it sees a sequence length: `hyla.ops.chunk_attention`'s
causal attention (the engine's prefill of a NoPE layer) at a few nearby lengths, each called twice, in a fresh
process per backend. cuDNN's SDPA builds an execution plan per shape; if that costs tenths of a second, every new
prompt length in an evaluation pays it (RULER's 64K prompts differ by a few tokens), where flash's kernel does not;
`cudnn-padded` pads each length to a bucket, so that nearby lengths share one plan.

    python bench/attention_first_call.py --lengths 65408,65406,65403,65408 --out DIR   # on a CUDA machine

Prints and writes DIR/attention-first-call.{json,md}: per backend and length, the first and the second call's
milliseconds (synchronised), at the converted SmolLM2-135M shape (9 query heads, 3 key/value heads, head dim 64,
bf16). `--device cpu --backends torch` runs the same on a CPU (the tests, on short lengths).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def time_backend(backend: str, lengths: list[int], *, device: str, heads: int, kv_heads: int, head_dim: int,
                 dtype: str) -> list[dict]:
    import torch

    from hyla.ops.chunk_attention import attention_with_lse

    torch.manual_seed(0)
    dev = torch.device(device)
    kind = getattr(torch, dtype)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    rows = []
    longest = max(lengths)
    q_all = torch.randn(1, heads, longest, head_dim, device=dev, dtype=kind)
    k_all = torch.randn(1, kv_heads, longest, head_dim, device=dev, dtype=kind)
    v_all = torch.randn_like(k_all)
    for length in lengths:
        times = []
        for _ in range(2):
            q, k, v = q_all[:, :, :length], k_all[:, :, :length], v_all[:, :, :length]
            sync()
            started = time.perf_counter()
            attention_with_lse(q, k, v, causal=True, scale=head_dim**-0.5, backend=backend)
            sync()
            times.append((time.perf_counter() - started) * 1000)
        rows.append({"backend": backend, "length": length, "first_ms": times[0], "second_ms": times[1]})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def markdown(rows: list[dict], command: str) -> str:
    lines = [f"`{command}`", "", "| backend | length | first call ms | second call ms |", "|---|---|---|---|"]
    lines += [f"| {r['backend']} | {r['length']} | {r['first_ms']:.1f} | {r['second_ms']:.1f} |" for r in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", default="65408,65406,65403,65408")
    parser.add_argument("--backends", default="cudnn,cudnn-padded,flash")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--out")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child process: this backend only, rows on stdout
    args = parser.parse_args(argv)
    from hyla.ops.chunk_attention import ATTENTION_BACKENDS

    unknown = sorted(set(args.backends.split(",")) - set(ATTENTION_BACKENDS))
    if unknown:
        parser.error(f"unknown backends {unknown}: choose from {', '.join(ATTENTION_BACKENDS)}")
    try:
        lengths = [int(x) for x in args.lengths.split(",")]
    except ValueError:
        parser.error(f"--lengths takes comma-separated token counts, got {args.lengths!r}")
    shape = dict(device=args.device, heads=args.heads, kv_heads=args.kv_heads, head_dim=args.head_dim,
                 dtype=args.dtype)
    if args.one:
        time_backend(args.one, lengths, **shape)
        return 0
    rows = []
    for backend in args.backends.split(","):
        child = [sys.executable, __file__, "--one", backend, *(argv if argv is not None else sys.argv[1:])]
        finished = subprocess.run(child, capture_output=True, text=True)
        if finished.returncode != 0:
            print(f"{backend}: exited {finished.returncode}: {finished.stderr.strip().splitlines()[-1:]}",
                  file=sys.stderr)
            continue
        rows += [json.loads(line) for line in finished.stdout.splitlines() if line.startswith("{")]
    command = "python bench/attention_first_call.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(markdown(rows, command))
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "attention-first-call.json").write_text(json.dumps({"command": command, "rows": rows}, indent=1))
        (out / "attention-first-call.md").write_text(markdown(rows, command))
    return 0 if rows else 1


if __name__ == "__main__":
    raise SystemExit(main())
