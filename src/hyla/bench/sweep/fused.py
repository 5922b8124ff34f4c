"""`hyla bench sweep fused`: the triton-fused decode step's kernels in several launch settings: each
matrix-vector product in the prologue/epilogue combination the engine runs it with, on HypeNet-2B's and the Qwen3-1.7B
shape's decode-step shapes, and the Lightning step kernel; beside cuBLAS's plain product of the same shape.

Every setting is first checked against the float64 reference (`fused_matvec_reference`, `lightning_step_reference`);
one that fails is reported and not timed. Timing as in bench/matvec_sweep.py: calls on distinct copies of the
weights (over 4x the L2 cache), captured in one CUDA graph. Its results/fastest entries (one per weight shape, the
combination with the most calls a step) become the matrix-vector table of the engine settings it writes, the fastest
Lightning step setting its step launch. With --pdl every call is launched with
programmatic dependent launch, as the engine launches them on Hopper: each call then reads its first weights while
the one before it finishes, which favours settings that read more of their weights before waiting.

    hyla bench sweep fused --out DIR [--pdl] [--step-only]   # on a CUDA machine with triton; ~2 minutes
    TRITON_INTERPRET=1 hyla bench sweep fused --out DIR --smoke   # CPU, Triton's interpreter (plumbing)

Writes DIR/fused-sweep.json and .md, and DIR/settings.json: the engine settings (--base-settings, default the tuned
settings of this GPU) with this sweep's choices (`--engine-settings DIR/settings.json` runs them; copied into
hyla/inference/tuned/ they become a GPU's shipped settings).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import torch
import torch.nn.functional as F

from hyla.bench.floors import COPY_BANDWIDTH
from hyla.bench.sweep.common import check_then_time, device_name, graph_time_us, sweep_device, write_settings
from hyla.outputs import write_atomic, write_json

CALLS = 64
# (name, N, K, bias, prologue, epilogue, calls a HypeNet-2B step, calls a Qwen3-shape step); prologues as in
# hyla.ops.matvec: 0 plain, 1 norm, 2 scaled, 4 sigmoid gate.
VARIANTS = [
    ("lightning mixer", 8192, 2048, False, 1, "none", 21, 0),
    ("attention mixer (gated)", 6144, 2048, True, 1, "none", 7, 0),
    ("qwen3 mixer", 4096, 2048, False, 1, "none", 0, 28),
    ("gate/up + GLU", 12288, 2048, False, 1, "glu", 28, 28),
    ("down + residual", 2048, 6144, False, 0, "residual", 28, 28),
    ("lightning o_proj (scaled) + residual", 2048, 2048, False, 2, "residual", 21, 0),
    ("attention o_proj (gated) + residual", 2048, 2048, False, 4, "residual", 7, 0),
    ("qwen3 o_proj + residual", 2048, 2048, False, 0, "residual", 0, 28),
    ("LM head (norm)", 151936, 2048, False, 1, "none", 1, 1),
]
TOY = {8192: 48, 6144: 40, 4096: 32, 12288: 64, 2048: 24, 6144 + 1: 0, 151936: 100}


def configs(smoke: bool, glu: bool, k: int):
    from hyla.ops.matvec import MatvecConfig

    if smoke:
        yield from (MatvecConfig(block_n=2, block_k=32), MatvecConfig(block_n=4, block_k=64, num_warps=2))
        return
    for block_n, block_k, warps in itertools.product((1, 2, 4, 8), (512, 1024, 2048, 4096, 8192), (2, 4, 8)):
        if glu and block_n == 1 or block_k > 2048 and block_k >= 2 * k:  # wider steps: one step over all of K
            continue
        if 8 <= block_n * block_k // (32 * warps) <= 128:
            yield MatvecConfig(block_n=block_n, block_k=block_k, num_warps=warps, num_stages=3)


def sweep_variant(variant, device, smoke, l2_bytes, log, pdl=False):
    from hyla.ops.matvec import fused_matvec_reference
    from hyla.ops.matvec.gpu import fused_matvec_triton

    name, n, k, has_bias, prologue, epilogue, *_ = variant
    if smoke:
        n, k = TOY.get(n, 24), TOY.get(k, 24) if k != 2048 else 32
    dtype = torch.float32 if smoke else torch.bfloat16
    gen = torch.Generator(device=device).manual_seed(n + k + prologue)
    weight_bytes = n * k * (4 if smoke else 2)
    copies = 1 if smoke else max(2, -(-4 * l2_bytes // weight_bytes))
    weights = [torch.randn(n, k, device=device, generator=gen, dtype=dtype) / k**0.5 for _ in range(copies)]
    x, x2 = (torch.randn(1, 1, k, device=device, generator=gen, dtype=dtype) for _ in range(2))
    bias = torch.randn(n, device=device, generator=gen, dtype=dtype) if has_bias else None
    kwargs = dict(prologue=prologue, x2=x2 if prologue == 4 else None, eps=1e-6, glu=epilogue == "glu",
                  norm_weight=torch.rand(k, device=device, generator=gen, dtype=dtype) + 0.5
                  if name.startswith("LM head") else None,
                  partials=torch.rand(64, device=device, generator=gen) * k / 64 if prologue == 2 else None,
                  residual=torch.randn(1, 1, n, device=device, generator=gen, dtype=dtype)
                  if epilogue == "residual" else None)
    reference = fused_matvec_reference(x, weights[0], bias, **kwargs)
    calls = 1 if smoke else CALLS

    def timed(fn):
        def run():
            for i in range(calls):
                fn(weights[i % copies])
        return graph_time_us(run, calls, x.device, 1 if smoke else 7)

    def product(config, w):
        return fused_matvec_triton(x, w, bias, config=config, pdl=pdl, **kwargs)

    cublas_us = timed(lambda w: F.linear(x, w, bias))
    rows = [check_then_time({**config.__dict__}, lambda config=config: product(config, weights[0]), reference,
                            lambda config=config: timed(lambda w: product(config, w)), weight_bytes)
            for config in configs(smoke, epilogue == "glu", k)]
    timed_rows = sorted((r for r in rows if "us" in r), key=lambda r: r["us"])
    best = timed_rows[0] if timed_rows else None
    result = {"name": name, "n": n, "k": k, "bias": has_bias, "prologue": prologue, "epilogue": epilogue,
              "calls_hypenet": variant[6], "calls_qwen3": variant[7], "weight_bytes": weight_bytes,
              "floor_us": weight_bytes / COPY_BANDWIDTH * 1e6, "cublas_us": cublas_us, "rows": rows, "fastest": best}
    log(f"{name} N={n} K={k}: cuBLAS plain {cublas_us:.1f} us, fused best "
        + (f"{best['us']:.1f} us ({best['tb_per_s']:.2f} TB/s) "
           f"{ {key: best[key] for key in ('block_n', 'block_k', 'num_warps')} }" if best else "none"))
    return result


def sweep_lightning_step(device, smoke, log, pdl=False):
    from hyla.ops.lightning_step import lightning_step_reference
    from hyla.ops.lightning_step.gpu import lightning_step_triton

    heads, dim = (2, 64) if smoke else (16, 128)
    dtype = torch.float32 if smoke else torch.bfloat16
    gen = torch.Generator(device=device).manual_seed(5)
    copies = 1 if smoke else 64  # 64 states of 1 MiB: distinct layers, out of L2
    y = torch.randn(1, 1, 4 * heads * dim, device=device, generator=gen, dtype=dtype)
    angle = torch.rand(dim // 2, device=device, generator=gen)
    cos = torch.cat([angle.cos(), angle.cos()]).view(1, 1, dim).to(dtype)
    sin = torch.cat([angle.sin(), angle.sin()]).view(1, 1, dim).to(dtype)
    qw, kw = (torch.rand(dim, device=device, generator=gen, dtype=dtype) + 0.5 for _ in range(2))
    states = [torch.randn(1, heads, dim, dim, device=device, generator=gen) for _ in range(copies)]
    decay = torch.rand(heads, device=device, generator=gen)
    rows = []
    # with pdl, also the state read before waiting (state_ready: each call here has its own state)
    for block_v, warps, ready in itertools.product((16, 32, 64) if not smoke else (16, 32), (1, 2, 4, 8),
                                                   (False, True) if pdl else (False,)):
        def step(state, block_v=block_v, warps=warps, ready=ready):
            return lightning_step_triton(y, cos, sin, qw, kw, state, decay, scale=dim**-0.5, eps=1e-6,
                                         has_gate=True, block_v=block_v, num_warps=warps, pdl=pdl,
                                         state_ready=ready)

        def run(step=step):
            for state in states:
                step(state)

        # checked on a copy: the output and the state it leaves, each scaled by its reference's norm so that
        # neither hides the other's error
        state, ref_state = states[0].clone(), states[0].clone()
        ref_u, _ = lightning_step_reference(y, cos, sin, qw, kw, ref_state, decay, scale=dim**-0.5, eps=1e-6,
                                            has_gate=True, block_v=block_v)
        norms = ref_u.double().norm(), ref_state.double().norm()
        reference = torch.cat([ref_u.double().reshape(-1) / norms[0], ref_state.double().reshape(-1) / norms[1]])

        def checked(step=step, state=state, norms=norms):
            u = step(state)[0]
            return torch.cat([u.double().reshape(-1) / norms[0], state.double().reshape(-1) / norms[1]])

        rows.append(check_then_time(
            {"block_v": block_v, "num_warps": warps, "state_ready": ready}, checked,
            reference, lambda run=run: graph_time_us(run, copies, y.device, 1 if smoke else 7)))
    best = min((r for r in rows if "us" in r), key=lambda r: r["us"], default=None)
    log(f"Lightning step H={heads} D={dim}: best {best}")
    return {"heads": heads, "dim": dim, "rows": rows, "fastest": best}


def run_fused_sweep(out: Path, *, smoke: bool = False, pdl: bool = False, step_only: bool = False,
                    base_settings: str | None = None, log=print) -> dict:
    """Every fused combination (unless step_only) and the Lightning step; writes out/fused-sweep.json, .md and
    out/settings.json. Returns the results."""
    from hyla.inference.settings import matvec_table_from_sweep

    device = sweep_device(smoke, pdl)
    l2_bytes = 0 if smoke else torch.cuda.get_device_properties(0).L2_cache_size
    variants = [] if step_only else [sweep_variant(v, device, smoke, l2_bytes, log, pdl) for v in VARIANTS]
    step = sweep_lightning_step(device, smoke, log, pdl)
    # The table: per weight shape, the combination with the most calls in a HypeNet step (then a Qwen3 step).
    table = {}
    for r in sorted(variants, key=lambda r: (r["calls_hypenet"], r["calls_qwen3"])):
        table[(r["n"], r["k"])] = r
    results = [{"n": r["n"], "k": r["k"], "bias": False, "cublas_us": r["cublas_us"], "fastest": r["fastest"],
                "variant": r["name"]} for r in table.values()]
    totals = {model: {"fused_best_us": sum(r[f"calls_{model}"] * r["fastest"]["us"] for r in variants if r["fastest"]),
                      "cublas_plain_us": sum(r[f"calls_{model}"] * r["cublas_us"] for r in variants)}
              for model in ("hypenet", "qwen3")}
    totals["hypenet"]["lightning_step_us"] = 21 * step["fastest"]["us"] if step["fastest"] else None
    payload = {"device": device_name(smoke), "pdl": pdl, "results": results, "variants": variants,
               "lightning_step": step, "per_step": totals}
    write_json(out / "fused-sweep.json", payload)
    lines = ["# Fused decode kernels: best setting per combination"
             + (" (programmatic dependent launch)" if pdl else ""), "",
             "| combination | N | K | calls HypeNet / Qwen3 | cuBLAS plain us | fused best us (TB/s) | setting |",
             "|---|---|---|---|---|---|---|"]
    for r in variants:
        b = r["fastest"]
        setting = ", ".join(f"{key}={b[key]}" for key in ("block_n", "block_k", "num_warps")) if b else ""
        lines.append(f"| {r['name']} | {r['n']} | {r['k']} | {r['calls_hypenet']} / {r['calls_qwen3']} | "
                     f"{r['cublas_us']:.1f} | " + (f"{b['us']:.1f} ({b['tb_per_s']:.2f})" if b else "none")
                     + f" | {setting} |")
    lines += ["", f"Lightning step: {step['fastest']}", "", f"Per step: {totals}"]
    text = "\n".join(lines) + "\n"
    write_atomic(out / "fused-sweep.md", text.encode())
    fields = {}
    if variants:
        fields["matvec_shapes"] = matvec_table_from_sweep(out / "fused-sweep.json")
    if step["fastest"]:
        fields["lightning_step"] = (step["fastest"]["block_v"], step["fastest"]["num_warps"])
    write_settings(out, base_settings, smoke, "fused", **fields)
    log(text)
    return payload
