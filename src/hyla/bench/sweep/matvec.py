"""`hyla bench sweep matvec`: the decode step's matrix-vector products at batch 1, `F.linear` (cuBLAS) against hyla's
Triton kernel (`hyla.ops.matvec.gpu`) in several launch settings, on the shapes one decode step of
HypeNet-2B and of the Qwen3-1.7B shape reads with fused projections, beside the floor of reading the weights once.

Every Triton setting is first checked against a float64 product; a setting that fails is reported and not timed.
Each timed call reads a different copy of the weights (copies totalling over 4x the GPU's L2 cache), as the layers
of a decode step do, so that no timing comes from the cache. The calls are captured in one CUDA graph and the graph
is timed, as the engine runs its decode step: launched one by one from Python, a small product's time is the
launch's (~25 us for a Triton kernel), not the kernel's. The per-step line adds, for each model, every product
of one step at its best setting against cuBLAS: what the kernel could save a decode step before any fusion.

    hyla bench sweep matvec --out DIR                       # on a CUDA machine with triton; ~2 minutes
    TRITON_INTERPRET=1 hyla bench sweep matvec --out DIR --smoke   # CPU, Triton's interpreter: toy shapes (plumbing)

Writes DIR/matvec-sweep.json and .md, and DIR/settings.json: the engine settings (--base-settings, default the tuned
settings of this GPU) with this sweep's per-shape choice (the fastest checked setting where it beat cuBLAS) as the
matrix-vector table, for the fused-projections step's Triton products (--decode-step fused-projections --matvec
triton).
"""

from __future__ import annotations

import itertools
from collections import Counter
from pathlib import Path

import torch
import torch.nn.functional as F

from hyla.bench.floors import COPY_BANDWIDTH
from hyla.bench.shapes import hypenet_config, qwen3_engine_config
from hyla.bench.sweep.common import check_then_time, device_name, graph_time_us, sweep_device, write_settings
from hyla.outputs import write_atomic, write_json

CALLS = 64  # products per timed graph, each on its own copy of the weights (cycling through the copies)


def step_products(config) -> Counter:
    """(N, K, has bias) -> calls in one batch-1 decode step with fused projections, read off the model built on the
    meta device (no memory): each block's fused mixer and MLP maps, o_proj, down_proj, and the LM head."""
    from hyla.inference.decode_step import fuse_block_projections
    from hyla.models import HypeNetForCausalLM

    with torch.device("meta"):
        model = HypeNetForCausalLM(config)
    counts = Counter()
    for block in model.model.layers:
        fused = fuse_block_projections(block)
        for weight, bias in ((fused.mixer_weight, fused.mixer_bias), (fused.mlp_weight, fused.mlp_bias),
                             (block.mixer.o_proj.weight, block.mixer.o_proj.bias),
                             (block.mlp.down_proj.weight, block.mlp.down_proj.bias)):
            counts[(*weight.shape, bias is not None)] += 1
    counts[(*model.lm_head.weight.shape, False)] += 1
    return counts


def configs(smoke: bool):
    from hyla.ops.matvec import MatvecConfig

    if smoke:
        yield from (MatvecConfig(block_n=4, block_k=32), MatvecConfig(block_n=8, block_k=64, num_warps=2))
        return
    for block_n, block_k, warps, stages in itertools.product((1, 2, 4, 8, 16), (512, 1024, 2048), (1, 2, 4, 8),
                                                             (3,)):
        per_thread = block_n * block_k // (32 * warps)  # fp32 accumulators a thread holds
        if 8 <= per_thread <= 128:
            yield MatvecConfig(block_n=block_n, block_k=block_k, num_warps=warps, num_stages=stages)


def sweep(n: int, k: int, has_bias: bool, device: str, smoke: bool, l2_bytes: int, log) -> dict:
    from hyla.ops.matvec.gpu import matvec_triton

    dtype = torch.float32 if smoke else torch.bfloat16  # the interpreter has no bfloat16
    gen = torch.Generator(device=device).manual_seed(n * 7 + k)
    weight_bytes = n * k * (4 if smoke else 2)
    copies = 1 if smoke else max(2, -(-4 * l2_bytes // weight_bytes))
    weights = [torch.randn(n, k, device=device, generator=gen, dtype=dtype) / k**0.5 for _ in range(copies)]
    bias = torch.randn(n, device=device, generator=gen, dtype=dtype) if has_bias else None
    x = torch.randn(1, 1, k, device=device, generator=gen, dtype=dtype)
    reference = F.linear(x.double(), weights[0].double(), bias.double() if has_bias else None)
    calls = 1 if smoke else CALLS
    repeats = 1 if smoke else 7

    def timed(fn):
        def run():
            for i in range(calls):
                fn(weights[i % copies])
        return graph_time_us(run, calls, x.device, repeats)

    cublas_us = timed(lambda w: F.linear(x, w, bias))
    def product(config, w):
        return matvec_triton(x, w, bias, config=config)

    rows = [check_then_time({**config.__dict__}, lambda config=config: product(config, weights[0]), reference,
                            lambda config=config: timed(lambda w: product(config, w)), weight_bytes)
            for config in configs(smoke)]
    timed_rows = sorted((r for r in rows if "us" in r), key=lambda r: r["us"])
    floor_us = weight_bytes / COPY_BANDWIDTH * 1e6
    result = {"n": n, "k": k, "bias": has_bias, "weight_bytes": weight_bytes, "copies": copies, "floor_us": floor_us,
              "cublas_us": cublas_us, "cublas_tb_per_s": weight_bytes / (cublas_us * 1e-6) / 1e12, "rows": rows,
              "fastest": timed_rows[0] if timed_rows else None, "timed": len(timed_rows)}
    best = result["fastest"]
    log(f"N={n} K={k}{' +bias' if has_bias else ''}: floor {floor_us:.1f} us, cuBLAS {cublas_us:.1f} us "
        f"({result['cublas_tb_per_s']:.2f} TB/s), Triton best "
        + (f"{best['us']:.1f} us ({best['tb_per_s']:.2f} TB/s) "
           f"{ {key: best[key] for key in ('block_n', 'block_k', 'num_warps', 'num_stages')} }" if best else "none"))
    return result


def per_step(results: list[dict], products: Counter) -> dict:
    """One decode step's products: summed cuBLAS time, summed best Triton time, summed floor (us)."""
    by_shape = {(r["n"], r["k"], r["bias"]): r for r in results}
    total = {"cublas_us": 0.0, "triton_us": 0.0, "floor_us": 0.0, "products": sum(products.values())}
    for shape, calls in products.items():
        r = by_shape[shape]
        best = r["fastest"]["us"] if r["fastest"] else r["cublas_us"]
        total["cublas_us"] += calls * r["cublas_us"]
        total["triton_us"] += calls * min(best, r["cublas_us"])  # where Triton loses, the engine keeps cuBLAS
        total["floor_us"] += calls * r["floor_us"]
    return total


def markdown(results: list[dict], steps: dict) -> str:
    lines = ["# Batch-1 matrix-vector products: cuBLAS vs hyla's Triton kernel", "",
             "| N | K | bias | floor us | cuBLAS us (TB/s) | Triton best us (TB/s) | setting |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        b = r["fastest"]
        setting = (", ".join(f"{key}={b[key]}" for key in ("block_n", "block_k", "num_warps", "num_stages"))
                   if b else "")
        best = f"{b['us']:.1f} ({b['tb_per_s']:.2f})" if b else "none"
        lines.append(f"| {r['n']} | {r['k']} | {'yes' if r['bias'] else ''} | {r['floor_us']:.1f} | "
                     f"{r['cublas_us']:.1f} ({r['cublas_tb_per_s']:.2f}) | {best} | {setting} |")
    lines += ["", "| model | products a step | cuBLAS us | with Triton where faster, us | floor us |",
              "|---|---|---|---|---|"]
    for name, s in steps.items():
        lines.append(f"| {name} | {s['products']} | {s['cublas_us']:.0f} | {s['triton_us']:.0f} | "
                     f"{s['floor_us']:.0f} |")
    return "\n".join(lines) + "\n"


def run_matvec_sweep(out: Path, *, smoke: bool = False, base_settings: str | None = None, log=print) -> dict:
    """Every product shape of both models' decode steps, each in every setting; writes out/matvec-sweep.json, .md
    and out/settings.json. Returns the results."""
    from hyla.inference.settings import matvec_table_from_sweep

    device = sweep_device(smoke)
    l2_bytes = 0 if smoke else torch.cuda.get_device_properties(0).L2_cache_size
    models = {"hypenet": hypenet_config(toy=smoke), "qwen3-engine": qwen3_engine_config(toy=smoke)}
    products = {name: step_products(config) for name, config in models.items()}
    shapes = sorted(set().union(*products.values()))
    results = []
    for n, k, has_bias in shapes:
        results.append(sweep(n, k, has_bias, device.type, smoke, l2_bytes, log))
        write_json(out / "matvec-sweep.json", {"device": device_name(smoke), "results": results})
    steps = {name: per_step(results, counts) for name, counts in products.items()}
    payload = {"device": device_name(smoke), "results": results, "per_step": steps,
               "products": {name: {f"{n}x{k}{'+bias' if b else ''}": c for (n, k, b), c in counts.items()}
                            for name, counts in products.items()}}
    write_json(out / "matvec-sweep.json", payload)
    text = markdown(results, steps)
    write_atomic(out / "matvec-sweep.md", text.encode())
    write_settings(out, base_settings, smoke, "matvec", matvec_shapes=matvec_table_from_sweep(out / "matvec-sweep.json"))
    log(text)
    return payload
