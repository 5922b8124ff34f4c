"""What the kernel sweeps share: the check of a setting before it is timed, timing inside a CUDA graph, the CPU smoke
mode through Triton's interpreter, and writing the engine settings file a sweep's choices go into."""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch


def patch_interpreter() -> None:
    """Triton's interpreter for CPU runs (TRITON_INTERPRET=1): it holds scalars as 1-element arrays, which numpy 2
    refuses to turn into a loop bound; the patch reads the element instead. Also 4 "multiprocessors" for the
    decode attention kernel, so that short buffers still get a few splits. Compiled kernels are unaffected."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        raise ValueError("the CPU smoke mode runs hyla's Triton kernels through Triton's interpreter: set "
                         "TRITON_INTERPRET=1 before starting Python")
    import triton.runtime.interpreter as interpreter

    import hyla.ops.decode_attention.gpu as decode_gpu

    if getattr(interpreter, "_hyla_patched", False):
        return
    patch_tensor = interpreter._patch_lang_tensor

    def patch_with_scalar_index(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    interpreter._patch_lang_tensor = patch_with_scalar_index
    interpreter._hyla_patched = True
    decode_gpu._num_sms = lambda index: 4


def sweep_device(smoke: bool, pdl: bool = False) -> torch.device:
    """The device a sweep runs on: the CPU through the interpreter with `smoke`, else the CUDA GPU (refused without
    one, and for `pdl` without programmatic dependent launch)."""
    if pdl and (smoke or not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9):
        raise ValueError("--pdl needs a CUDA GPU of compute capability 9.0 or later")
    if smoke:
        patch_interpreter()
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise ValueError("the kernel sweeps need a CUDA GPU with triton (or --smoke on CPU with TRITON_INTERPRET=1)")
    return torch.device("cuda")


def device_name(smoke: bool) -> str:
    return "cpu (Triton interpreter)" if smoke else torch.cuda.get_device_name()


def graph_time_us(run, calls: int, device: torch.device, repeats: int) -> float:
    """Microseconds a call of `run()`, which makes `calls` calls. On CUDA the calls are captured in one CUDA graph and
    the graph is timed, as the engine runs its decode step (launched one by one from Python, a small kernel's time
    is the launch's); elsewhere `run` is timed as it is."""
    from hyla.bench.timing import time_ms

    replay = run
    if device.type == "cuda":
        run()  # compiles the kernels outside the capture
        torch.cuda.synchronize()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            run()
        replay = graph.replay
    return time_ms(replay, device=device, warmup=1, repeats=repeats)["median_ms"] * 1e3 / calls


def check_then_time(row: dict, compute, reference: torch.Tensor, time_us, bytes_read: int | None = None) -> dict:
    """One sweep row: `compute()` once and its relative error against the float64 `reference` (a setting the
    compiler refuses, or one off by more than 1e-2, gets an "error" and no time), then `time_us()`; with
    `bytes_read`, the rate in TB/s."""
    try:
        out = compute()
    except Exception as err:  # noqa: BLE001  (a setting the compiler refuses)
        return {**row, "error": f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"}
    error = ((out.double() - reference).norm() / reference.norm()).item()
    row = {**row, "relative_error": error}
    if not error <= 1e-2:
        return {**row, "error": f"check failed: relative error {error:.2e} > 1e-2"}
    us = time_us()
    row["us"] = us
    if bytes_read is not None:
        row["tb_per_s"] = bytes_read / (us * 1e-6) / 1e12
    return row


def write_settings(out: Path, base_path: str | None, smoke: bool, sweep: str, **fields) -> Path:
    """out/settings.json: the engine settings of `base_path` (None: the tuned settings of this GPU; on CPU the H200
    file, for the smoke mode's plumbing) with the sweep's `fields` replaced; `hyla bench model --engine-settings`,
    `hyla generate --engine-settings` and `InferenceEngine(settings=load_settings(...))` read it."""
    from dataclasses import replace

    from hyla.inference.settings import load_settings, packaged_settings_for, tuned_settings

    if base_path is not None:
        base = load_settings(base_path)
    elif smoke:
        base = packaged_settings_for("NVIDIA H200", (9, 0))
    else:
        base = tuned_settings("cuda")
    settings = replace(base, **fields, name=f"{base.name} + hyla bench sweep {sweep} ({device_name(smoke)})")
    payload = {"measured": f"`hyla bench sweep {sweep}` on {device_name(smoke)}, over {base.name}",
               "devices": [] if smoke else [torch.cuda.get_device_name()], **settings.to_json()}
    path = out / "settings.json"
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(payload, indent=1) + "\n")
    return path
