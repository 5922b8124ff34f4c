"""`hyla bench sweep decode-attention`: launch settings of the split-K decode attention kernel
(`hyla.ops.decode_attention.DecodeKernelConfig`),
timed on a GPU at HypeNet-2B's attention shape (16 query heads, 8 KV heads, head dim 128, bf16), beside the bytes
floor of reading the keys and values. Every setting is first checked against the pure-torch reference; a setting
that fails the check is reported as failed and not timed.

    hyla bench sweep decode-attention --out DIR        # on a CUDA machine with triton; ~3 minutes
    TRITON_INTERPRET=1 hyla bench sweep decode-attention --out DIR --smoke   # CPU, Triton's interpreter (plumbing)

Writes DIR/decode-attention-sweep.json and .md: per shape, every setting's microseconds per call and GB/s, the
default setting's rank, and the fastest; and DIR/settings.json: the engine settings (--base-settings, default the
tuned settings of this GPU) with the setting of least summed time over the shapes as the kernel's launch (the shipped
default, which picks programs per multiprocessor by occupancy, stays where it is at least as fast).
"""

from __future__ import annotations

import itertools
from pathlib import Path

import torch

from hyla.bench.floors import COPY_BANDWIDTH
from hyla.bench.sweep.common import check_then_time, device_name, sweep_device, write_settings
from hyla.bench.timing import time_ms
from hyla.ops.decode_attention import decode_attention_reference
from hyla.outputs import write_atomic, write_json

HEADS, KV_HEADS, HEAD_DIM = 16, 8, 128
SHAPES = [(1, 2**15), (1, 2**17), (1, 2**19), (32, 2**15)]  # (batch, context)
CALLS = 20  # kernel calls per timed measurement


def configs(smoke: bool = False):
    from hyla.ops.decode_attention import DecodeKernelConfig

    if smoke:
        yield from (DecodeKernelConfig(), DecodeKernelConfig(block_n=32, programs_per_sm=1),
                    DecodeKernelConfig(block_n=128, programs_per_sm=8))
        return
    for block_n, warps, stages, programs in itertools.product((32, 64, 128), (4, 8), (2, 3, 4), (2, 4, 8)):
        yield DecodeKernelConfig(block_n=block_n, num_warps=warps, num_stages=stages, programs_per_sm=programs)


def sweep(batch: int, context: int, log, device: str = "cuda", smoke: bool = False) -> dict:
    from hyla.ops.decode_attention import gpu as decode_triton
    from hyla.ops.decode_attention.gpu import DEFAULT_CONFIG, decode_attention_triton

    dtype = torch.float32 if smoke else torch.bfloat16  # the interpreter has no bfloat16
    gen = torch.Generator(device=device).manual_seed(context)
    q = torch.randn(batch, HEADS, HEAD_DIM, device=device, generator=gen, dtype=dtype)
    keys = torch.randn(batch, KV_HEADS, context + 64, HEAD_DIM, device=device, generator=gen, dtype=dtype)
    values = torch.randn_like(keys)
    length = torch.tensor(context, device=device)
    calls = 1 if smoke else CALLS
    scale = HEAD_DIM**-0.5
    ref = decode_attention_reference(q.float(), keys[:, :, :context].float(), values[:, :, :context].float(),
                                     context, scale=scale)
    kv_bytes = 2 * batch * KV_HEADS * context * HEAD_DIM * keys.element_size()
    rows = []
    num_sms = decode_triton._num_sms(q.device.index or 0)  # 4 under the interpreter patches
    for config in configs(smoke):
        # programs per multiprocessor as the kernel resolves them (the default picks by occupancy)
        row = {**config.__dict__, "programs_per_sm": config.programs_for(batch * KV_HEADS, num_sms)}

        def attend(config=config):
            return decode_attention_triton(q, keys, values, length, scale=scale, config=config)

        def time_us(attend=attend):  # long kernels: timed as launched, without a graph
            timing = time_ms(lambda: [attend() for _ in range(calls)], device=q.device, warmup=1,
                             repeats=1 if smoke else 5)
            return timing["median_ms"] * 1e3 / calls

        rows.append(check_then_time(row, attend, ref, time_us, kv_bytes))
    timed = sorted((r for r in rows if "us" in r), key=lambda r: r["us"])
    wanted = {**DEFAULT_CONFIG.__dict__, "programs_per_sm": DEFAULT_CONFIG.programs_for(batch * KV_HEADS, num_sms)}
    default = next((r for r in timed if all(r[k] == v for k, v in wanted.items())), None)
    floor_us = kv_bytes / COPY_BANDWIDTH * 1e6
    result = {"batch": batch, "context": context, "kv_bytes": kv_bytes, "floor_us": floor_us, "rows": rows,
              "fastest": timed[0] if timed else None, "default": default,
              "default_rank": timed.index(default) + 1 if default else None, "timed": len(timed)}
    if timed:
        log(f"B={batch} T={context}: floor {floor_us:.1f} us; fastest {timed[0]['us']:.1f} us "
            f"({timed[0]['tb_per_s']:.2f} TB/s) {({k: timed[0][k] for k in DEFAULT_CONFIG.__dict__})}; default "
            f"{default['us'] if default else float('nan'):.1f} us (rank {result['default_rank']} of {len(timed)})")
    return result


def markdown(results: list[dict]) -> str:
    lines = ["# Decode attention kernel: launch settings", "",
             "| batch | context | floor us | default us (rank) | fastest us | fastest TB/s | fastest setting |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        f, d = r["fastest"], r["default"]
        keys = ("block_n", "num_warps", "num_stages", "programs_per_sm")
        setting = ", ".join(f"{k}={f[k]}" for k in keys) if f else ""
        lines.append(f"| {r['batch']} | {r['context']} | {r['floor_us']:.1f} | "
                     f"{d['us'] if d else float('nan'):.1f} ({r['default_rank']}) | "
                     f"{f['us'] if f else float('nan'):.1f} | {f['tb_per_s'] if f else float('nan'):.2f} | {setting} |")
    return "\n".join(lines) + "\n"


def fastest_overall(results: list[dict]):
    """The DecodeKernelConfig of least summed time over every shape where all shapes timed it, or None when the
    default setting (programs per multiprocessor by occupancy) is at least as fast summed over the shapes."""
    from hyla.ops.decode_attention import DecodeKernelConfig

    keys = ("block_n", "num_warps", "num_stages", "programs_per_sm")
    totals: dict[tuple, float] = {}
    for result in results:
        for row in result["rows"]:
            if "us" in row:
                totals[tuple(row[k] for k in keys)] = totals.get(tuple(row[k] for k in keys), 0.0) + row["us"]
    complete = {setting: us for setting, us in totals.items()
                if sum(any(tuple(r[k] for k in keys) == setting and "us" in r for r in res["rows"])
                       for res in results) == len(results)}
    default_us = sum(r["default"]["us"] for r in results if r["default"]) if all(r["default"] for r in results) \
        else float("inf")
    if not complete or min(complete.values()) >= default_us:
        return None
    return DecodeKernelConfig(**dict(zip(keys, min(complete, key=complete.get), strict=True)))


def run_decode_attention_sweep(out: Path, *, smoke: bool = False, base_settings: str | None = None,
                               log=print) -> dict:
    """Every shape in every setting; writes out/decode-attention-sweep.json, .md and out/settings.json."""
    device = sweep_device(smoke)
    results = []
    for batch, context in [(1, 300), (2, 200)] if smoke else SHAPES:
        results.append(sweep(batch, context, log, device.type, smoke))
        write_json(out / "decode-attention-sweep.json", {"device": device_name(smoke), "results": results})
    write_atomic(out / "decode-attention-sweep.md", markdown(results).encode())
    best = fastest_overall(results)
    write_settings(out, base_settings, smoke, "decode-attention",
                   **({"decode_attention_config": best} if best is not None else {}))
    log(markdown(results))
    return {"device": device_name(smoke), "results": results}
