"""The `hyla` command line: a thin layer over typed library functions.

Each area of the library owns a `cli.py` with `register(subparsers)`; this module only assembles them, so that
`hyla --help` stays fast (areas import their heavy dependencies inside the command handlers).
"""

from __future__ import annotations

import argparse
import faulthandler
import importlib
import io
import signal
import sys

from hyla.compile import share_triton_cache

# (subcommand module, in the order `hyla --help` lists them)
_AREAS = (
    "hyla.models.cli",
    "hyla.data.cli",
    "hyla.convert.cli",
    "hyla.train.cli",
    "hyla.evals.cli",
    "hyla.inference.cli",
    "hyla.analysis.cli",
    "hyla.bench.cli",
    "hyla.experiment.cli",
)


class UserError(Exception):
    """A mistake in the user's input: reported as one line, exit code 2."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hyla", description="Hybrid linear-attention language models.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _AREAS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name == name:
                continue
            raise
        module.register(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    # `kill -USR1 PID` prints every thread's Python stack to stderr and lets the command go on: the way to see where
    # a long job (a kernel compile, a data loader, a collective) is stuck.
    if hasattr(signal, "SIGUSR1"):
        try:
            faulthandler.register(signal.SIGUSR1, all_threads=True)
        except (AttributeError, ValueError, io.UnsupportedOperation):  # stderr without a file descriptor
            pass
    # Before anything compiles: every hyla process, with torch.compile or without, reads and fills one Triton cache.
    share_triton_cache()
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 0
    from huggingface_hub.errors import StrictDataclassError

    try:
        result = args.handler(args)
    except (UserError, ValueError, FileNotFoundError, StrictDataclassError) as err:
        print(f"hyla {args.command}: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"hyla {args.command}: interrupted", file=sys.stderr)
        return 130
    return int(result or 0)


if __name__ == "__main__":
    sys.exit(main())
