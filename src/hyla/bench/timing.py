"""Timing: the median of repeated CUDA-event timings after warm-up (host clock on CPU, for smoke tests only)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch


class CheckFailed(RuntimeError):
    """A correctness check before timing failed: the benchmark reports nothing."""


def time_ms(fn: Callable[[], object], *, device: torch.device, warmup: int = 1, repeats: int = 5,
            budget_s: float | None = 10.0) -> dict:
    """Median, min and all times (ms) of `fn()`. Repeats shrink (to at least one) when one call is long, so that a
    measurement stays within about `budget_s` seconds (None: every repeat runs)."""
    for _ in range(warmup):
        fn()
    first = _one(fn, device)
    count = max(1, repeats if budget_s is None else min(repeats, int(budget_s * 1e3 / max(first, 1e-3))))
    times = [first] + [_one(fn, device) for _ in range(count - 1)]
    return {"median_ms": statistics.median(times), "min_ms": min(times), "times_ms": times}


def _one(fn, device: torch.device) -> float:
    if device.type != "cuda":
        start = time.perf_counter()
        fn()
        return 1e3 * (time.perf_counter() - start)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def allocated_gib(device: torch.device) -> float | None:
    return torch.cuda.memory_allocated(device) / 2**30 if device.type == "cuda" else None


def peak_memory_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def saved_tensor_bytes(function: Callable[[], object]) -> tuple[int, object]:
    """(bytes of the distinct storages autograd keeps for the backward of `function()`, its result), read through
    autograd's saved-tensor hooks: what a forward holds until its backward, on any device."""
    storages = {}

    def pack(tensor):
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        result = function()
    return sum(storages.values()), result


def relative_error(fast: torch.Tensor, reference: torch.Tensor) -> float:
    fast, reference = fast.double(), reference.double()
    if not torch.isfinite(fast).all():
        return float("inf")
    return ((fast - reference).norm() / reference.norm().clamp_min(1e-30)).item()


def kernel_bench_arguments(description: str, argv: list[str] | None = None):
    """(args, device, header) of a kernel benchmark at a 64K prefill's shapes (bench/rms_norm.py, bench/rope.py):
    --tokens (default 65536), --repeats (20), --device (cuda where there is one); the header names torch, the device
    and the size."""
    import argparse

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--tokens", type=int, default=65536)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    return args, device, f"torch {torch.__version__}, {name}; {args.tokens} tokens, bfloat16, no gradient"
