"""What the kernel sweeps (bench/decode_attention_sweep.py, bench/matvec_sweep.py, bench/fused_sweep.py) share:
the command line (--out, and --smoke for a CPU run through Triton's interpreter with the patches of
bench/decode_kernel_interpret.py), the check of a setting before it is timed, and timing inside a CUDA graph."""

from __future__ import annotations

import argparse
import sys

import torch


def sweep_arguments(description: str, script: str, pdl: bool = False,
                    flags: dict[str, str] | None = None) -> argparse.Namespace | None:
    """The parsed arguments; None after one error line when there is neither --smoke nor a CUDA GPU. pdl: the
    script takes --pdl (launches with programmatic dependent launch; refused where the GPU lacks it); flags: more
    on/off options, name to help."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--smoke", action="store_true", help="CPU through Triton's interpreter: toy shapes")
    if pdl:
        parser.add_argument("--pdl", action="store_true", help="launch with programmatic dependent launch")
    for name, help_text in (flags or {}).items():
        parser.add_argument(name, action="store_true", help=help_text)
    args = parser.parse_args()
    if getattr(args, "pdl", False) and (args.smoke or not torch.cuda.is_available()
                                        or torch.cuda.get_device_capability()[0] < 9):
        print(f"error: {script} --pdl needs a CUDA GPU of compute capability 9.0 or later", file=sys.stderr)
        return None
    if args.smoke:
        import decode_kernel_interpret  # noqa: F401  (the interpreter's patches: scalar loop bounds, 4 SMs)
    elif not torch.cuda.is_available():
        print(f"error: {script} needs a CUDA GPU with triton", file=sys.stderr)
        return None
    return args


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
