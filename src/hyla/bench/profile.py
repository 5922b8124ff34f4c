"""`hyla bench profile`: where one decode step's or one prefill chunk's time goes, kernel by kernel.

Decode: the engine's decode step (graph-captured on CUDA, eager on CPU) of `hypenet`, `qwen3-engine` or
`converted-135m` (the shape hyla converts SmolLM2-135M to, what `hyla eval niah` runs on), batch B, over
a synthetic cache of `context` positions, beside the bytes-per-token floor. Prefill: one chunk of `chunk` tokens
appended after `context` synthetic cached positions (the last chunk of a `context + chunk` prompt), beside the FLOP
floor of that chunk (the prefill FLOPs of `context + chunk` tokens minus those of `context`). Either is recorded by
torch.profiler for `steps` steps after a warm-up; the report gives the wall time per step, the summed device time of
its kernels (device activities only, not the operators that launched them) and the difference between the two (launch
gaps and idle device), the device time by kind of kernel, and the kernels grouped by name, most expensive first.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from hyla.bench import shapes
from hyla.bench.floors import MATMUL_RATE, ModelShape
from hyla.bench.model import MARGIN, _random_ids, build_engine, build_hypenet, decode_at

PROFILED_SYSTEMS = ("hypenet", "qwen3-engine", "converted-135m")
PHASES = ("decode", "prefill")
# Kinds of kernel, by name (first match wins); the rest is "other".
KERNEL_KINDS = (
    ("softmax attention", r"cudnn|flash|fmha|_split_kernel|_merge_kernel|attention"),
    ("linear attention", r"chunk|recurrent|fused_recurrent|_lightning_step_kernel"),
    ("matmul", r"nvjet|gemm|gemv|cutlass|xmma|splitKreduce|_matvec_kernel|aten::(mm|addmm|bmm|einsum)$"),
    ("elementwise, norms, copies", r"triton_|elementwise|reduce_kernel|copy|Cat|index|Memset|memcpy"
                                   r"|aten::(mul|add|sub|div|pow|rsqrt|mean|sigmoid|silu|exp|neg|cat|clone|fill_)$"),
)


@dataclass(frozen=True)
class ProfileSettings:
    system: str = "hypenet"
    phase: str = "decode"
    context: int = 2**19
    chunk: int = 2**16  # prefill phase: tokens in the profiled chunk
    batch: int = 1
    steps: int = 10
    # The engine's settings file (None: the tuned settings of this GPU) and overrides (None: the file's), as in
    # hyla.bench.model.ModelSettings.
    engine_settings: str | None = None
    decode_step: str | None = None
    matvec: str | None = None
    compile_decode: bool | None = None
    compile_prefill: bool | None = None
    compile_mode: str | None = None
    launch_pdl: bool | None = None
    attention_backend: str | None = None
    toy: bool = False
    device: str = "cuda"
    dtype: str = "bfloat16"
    top: int = 40

    def __post_init__(self) -> None:
        if self.steps < 1 or self.batch < 1 or self.chunk < 1:
            raise ValueError("steps, batch and chunk must be >= 1")
        if self.context < (1 if self.phase == "decode" else 0):
            raise ValueError("context must be >= 1 for a decode step, >= 0 for a prefill chunk (0: a whole prompt)")
        if self.phase not in PHASES:
            raise ValueError(f"unknown phase {self.phase!r}; choose from {', '.join(PHASES)}")
        if self.system not in PROFILED_SYSTEMS:
            raise ValueError(f"unknown system {self.system!r}; choose from {', '.join(PROFILED_SYSTEMS)}")


def _build(settings: ProfileSettings, device: torch.device, dtype: torch.dtype):
    if settings.system == "hypenet":
        return build_hypenet(shapes.hypenet_config(toy=settings.toy), device=device, dtype=dtype)
    if settings.system == "qwen3-engine":
        # Random weights: no HF model needed for timing (the model benchmark checks this network against HF's).
        return build_hypenet(shapes.qwen3_engine_config(toy=settings.toy), device=device, dtype=dtype)
    if settings.system == "converted-135m":
        return build_hypenet(shapes.converted_135m_config(toy=settings.toy), device=device, dtype=dtype)
    raise ValueError(f"unknown system {settings.system!r}; choose from {', '.join(PROFILED_SYSTEMS)}")


def _device_time_us(event) -> float:
    for name in ("self_device_time_total", "self_cuda_time_total"):
        value = getattr(event, name, None)
        if value is not None:
            return float(value)
    return 0.0


# CUPTI overhead records that kineto lists beside the kernels; not device work. "Command Buffer Full" is the time the
# CPU waited because the launch queue was full (the device was busy): reported apart, as launch_queue_full_ms.
CUPTI_OVERHEAD = ("Command Buffer Full", "Activity Buffer Request", "Activity Buffer Flush", "Instrumentation",
                  "Resource")


def device_rows(events, steps: int) -> tuple[list[dict], float]:
    """Rows {name, calls_per_step, us_per_step} of the device's own activities (kernels, memcpy, memset) from
    `prof.key_averages()`, and the launch-queue-full milliseconds per step. Operator records (aten::*, autograd
    functions, inductor's launch records that carry their kernel's name) also hold device time, that of the kernels
    they launched: counting them too would count every eager kernel twice."""
    rows, queue_full_us = [], 0.0
    for event in events:
        device_us = _device_time_us(event)
        if event.key in CUPTI_OVERHEAD:
            queue_full_us += device_us if event.key == "Command Buffer Full" else 0.0
            continue
        if device_us <= 0 or getattr(event, "device_type", None) != torch.autograd.DeviceType.CUDA:
            continue
        rows.append({"name": event.key, "calls_per_step": event.count / steps, "us_per_step": device_us / steps})
    return rows, queue_full_us / steps / 1e3


def profile_steps(step: Callable[[], object], steps: int, device: torch.device) -> dict:
    """Run `step` `steps` times under torch.profiler. Returns the wall time per step, the summed device time of its
    kernels (None on CPU), the kernels (CPU: operators) per step, and rows {name, calls_per_step, us_per_step}, most
    expensive first: device kernels by their device time on CUDA (device_rows), operators by CPU self time
    otherwise."""
    cuda = device.type == "cuda"
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        if cuda:
            torch.cuda.synchronize(device)
        started = time.perf_counter()
        for _ in range(steps):
            step()
        if cuda:
            torch.cuda.synchronize(device)
        wall_ms = (time.perf_counter() - started) * 1e3 / steps
    if cuda:
        rows, queue_full_ms = device_rows(prof.key_averages(), steps)
    else:
        rows, queue_full_ms = [{"name": event.key, "calls_per_step": event.count / steps,
                                "us_per_step": float(event.self_cpu_time_total) / steps}
                               for event in prof.key_averages()], None
    rows.sort(key=lambda row: row["us_per_step"], reverse=True)
    return {"wall_ms_per_step": wall_ms,
            "kernel_ms_per_step": sum(row["us_per_step"] for row in rows) / 1e3 if cuda else None,
            "calls_per_step": sum(row["calls_per_step"] for row in rows), "rows": rows,
            "launch_queue_full_ms": queue_full_ms}


@torch.no_grad()
def profile_decode(settings: ProfileSettings) -> dict:
    device, dtype = torch.device(settings.device), getattr(torch, settings.dtype)
    cuda = device.type == "cuda"
    model = _build(settings, device, dtype)
    shape = ModelShape.of(model)
    engine = build_engine(model, settings, batch_size=settings.batch, max_length=settings.context + MARGIN)
    engine.fill_synthetic(settings.context)
    if cuda:
        engine.capture_graph()

    decode_at(engine, settings.context, 3)  # warm-up
    profiled = profile_steps(lambda: decode_at(engine, settings.context, 1), settings.steps, device)
    floor_ms = shape.decode_floor_ms(settings.context, settings.batch) if cuda else None
    return _result(settings, shape, profiled, floor_ms=floor_ms, engine=engine)


def kernel_kinds(rows: list[dict]) -> dict[str, float]:
    """Device (CPU: self) microseconds per step by kind of kernel (KERNEL_KINDS, by name; the rest is "other")."""
    totals = {kind: 0.0 for kind, _ in KERNEL_KINDS} | {"other": 0.0}
    for row in rows:
        kind = next((k for k, pattern in KERNEL_KINDS if re.search(pattern, row["name"])), "other")
        totals[kind] += row["us_per_step"]
    return totals


@torch.no_grad()
def profile_prefill(settings: ProfileSettings) -> dict:
    """One prefill chunk of `settings.chunk` tokens after `settings.context` synthetic cached positions."""
    device, dtype = torch.device(settings.device), getattr(torch, settings.dtype)
    model = _build(settings, device, dtype)
    shape = ModelShape.of(model)
    # prefill_chunk counts tokens over all rows: one chunk of `chunk` tokens a row
    engine = build_engine(model, settings, batch_size=settings.batch, max_length=settings.context + settings.chunk,
                          prefill_chunk=settings.chunk * settings.batch)
    engine.fill_synthetic(settings.context)
    states = {index: state.clone() for index, state in engine.cache.states.items()}
    ids = _random_ids(model, settings.batch, settings.chunk, seed=settings.context)

    def chunk() -> None:  # the same work every time: the cache back at `context`, the states as filled
        engine.num_cached = settings.context
        for index, state in states.items():
            engine.cache.states[index].copy_(state)
        engine.prefill(ids)

    chunk()  # warm-up (compilation, attention plans, autotuning)
    profiled = profile_steps(chunk, settings.steps, device)
    cuda = device.type == "cuda"
    flops = settings.batch * (shape.prefill_flops(settings.context + settings.chunk)
                              - shape.prefill_flops(settings.context))
    return _result(settings, shape, profiled, floor_ms=flops / MATMUL_RATE * 1e3 if cuda else None, flops=flops,
                   engine=engine)


def _result(settings: ProfileSettings, shape: ModelShape, profiled: dict, *, floor_ms, engine, flops=None) -> dict:
    rows, wall_ms, kernels_ms = profiled["rows"], profiled["wall_ms_per_step"], profiled["kernel_ms_per_step"]
    return {
        "settings": asdict(settings),
        "engine": engine.settings.summary(),
        "shape": {"num_params": shape.num_params, "num_attention_layers": shape.num_attention_layers},
        "wall_ms_per_step": wall_ms,
        "kernel_ms_per_step": kernels_ms,
        "gap_ms_per_step": None if kernels_ms is None else wall_ms - kernels_ms,
        "kernel_launches_per_step": profiled["calls_per_step"] if settings.device.startswith("cuda") else None,
        "launch_queue_full_ms_per_step": profiled.get("launch_queue_full_ms"),
        "floor_ms": floor_ms,
        "flops_per_step": flops,
        "us_per_step_by_kind": kernel_kinds(rows),
        "rows": rows[: settings.top],
        "rows_total": len(rows),
    }


def profile_markdown(result: dict) -> str:
    s, engine = result["settings"], result.get("engine", {})
    if s.get("phase", "decode") == "prefill":
        title = (f"# Prefill chunk profile: {s['system']}, {s['chunk']} tokens after {s['context']} cached, batch "
                 f"{s['batch']}, {s['dtype']} on {s['device']}, compiled prefill {engine.get('compile_prefill')}")
        floor = "FLOP floor of the chunk"
    else:
        title = (f"# Decode step profile: {s['system']}, context {s['context']}, batch {s['batch']}, "
                 f"{s['dtype']} on {s['device']}, decode step {engine.get('decode_step')}, compiled "
                 f"{engine.get('compile_decode')}" + (f" ({s['compile_mode']})" if s.get("compile_mode") else ""))
        floor = "bytes-per-token floor"
    lines = [title, ""]
    lines.append(f"- wall time per step: {result['wall_ms_per_step']:.3f} ms")
    if result["kernel_ms_per_step"] is not None:
        lines.append(f"- device time of its kernels: {result['kernel_ms_per_step']:.3f} ms "
                     f"({result['kernel_launches_per_step']:.0f} kernels a step); gap (launches, idle device): "
                     f"{result['gap_ms_per_step']:.3f} ms")
        lines.append(f"- {floor}: {result['floor_ms']:.3f} ms")
        if result.get("launch_queue_full_ms_per_step"):
            lines.append(f"- CPU waiting on a full launch queue (device busy): "
                         f"{result['launch_queue_full_ms_per_step']:.3f} ms a step")
    else:
        lines.append("- CPU run: the tables show CPU self time per operator (no device timeline)")
    if result.get("us_per_step_by_kind"):
        lines += ["", "| kind | us per step |", "|---|---|"]
        lines += [f"| {kind} | {us:.1f} |" for kind, us in result["us_per_step_by_kind"].items()]
    lines += ["", "| kernel / operator | calls per step | us per step |", "|---|---|---|"]
    for row in result["rows"]:
        name = row["name"].replace("|", "/")
        name = name if len(name) <= 90 else name[:87] + "..."
        lines.append(f"| {name} | {row['calls_per_step']:.1f} | {row['us_per_step']:.1f} |")
    if result["rows_total"] > len(result["rows"]):
        lines.append(f"| ({result['rows_total'] - len(result['rows'])} more) | | |")
    return "\n".join(lines) + "\n"
