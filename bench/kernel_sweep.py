"""Command line shared by the kernel sweeps (bench/decode_attention_sweep.py, bench/matvec_sweep.py): --out, and
--smoke for a CPU run through Triton's interpreter with the patches of bench/decode_kernel_interpret.py."""

from __future__ import annotations

import argparse
import sys

import torch


def sweep_arguments(description: str, script: str) -> argparse.Namespace | None:
    """The parsed arguments; None after one error line when there is neither --smoke nor a CUDA GPU."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--smoke", action="store_true", help="CPU through Triton's interpreter: toy shapes")
    args = parser.parse_args()
    if args.smoke:
        import decode_kernel_interpret  # noqa: F401  (the interpreter's patches: scalar loop bounds, 4 SMs)
    elif not torch.cuda.is_available():
        print(f"error: {script} needs a CUDA GPU with triton", file=sys.stderr)
        return None
    return args
