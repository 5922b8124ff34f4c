"""Recount a prefill profile JSON of 2026-11-30 from its device-kernel rows only (its top-40 rows): operator rows
(aten::*, autograd functions), CUPTI's "Command Buffer Full" and the CPU-side duplicates of inductor's kernels are
dropped."""
import json, re, sys
from hyla.bench.profile import KERNEL_KINDS
for f in sys.argv[1:]:
    d = json.load(open(f))
    seen, rows, dropped = set(), [], 0.0
    for r in d["rows"]:
        n = r["name"]
        if n.startswith("aten::") or n in ("ChunkSimpleGLAFunction", "Command Buffer Full") or n in seen:
            dropped += r["us_per_step"]; continue
        seen.add(n); rows.append(r)
    kinds = {}
    for r in rows:
        k = next((k for k, p in KERNEL_KINDS if re.search(p, r["name"])), "other")
        kinds[k] = kinds.get(k, 0) + r["us_per_step"] / 1e3
    total = sum(kinds.values())
    cbf = sum(r["us_per_step"] for r in d["rows"] if r["name"] == "Command Buffer Full") / 1e3
    print(f"{f}: wall {d['wall_ms_per_step']:.0f} ms, kernels {total:.0f} ms (top rows), floor {d['floor_ms']:.0f} ms,"
          f" gap {d['wall_ms_per_step']-total:.0f}, cmdbuf-full {cbf:.0f}")
    print("   ", {k: round(v, 1) for k, v in kinds.items()})
