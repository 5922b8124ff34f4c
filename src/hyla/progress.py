"""Progress bars for a terminal, a notebook and a job's log file alike.

tqdm redraws its bar in place with carriage returns; a log file (`hyla experiment run` sends each job's output to one)
keeps every redraw on one line that grows for the whole job. Where the output is not a terminal, `progress` writes
one plain line per update instead, at most every `LOG_INTERVAL_S` seconds.
"""

from __future__ import annotations

import sys
from typing import Any

from tqdm import autonotebook
from tqdm.auto import tqdm as auto_tqdm
from tqdm.std import tqdm as plain_tqdm

LOG_INTERVAL_S = 30.0


class _Lines:
    """A text stream for tqdm that turns each redraw into a line of its own (and drops the blank ones)."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, text: str) -> None:
        line = text.replace("\r", "").rstrip()
        if line:
            self._stream.write(line + "\n")

    def flush(self) -> None:
        self._stream.flush()


def _is_terminal(stream) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except ValueError:  # a closed stream
        return False


def progress(iterable: Any = None, **options: Any) -> plain_tqdm:
    """tqdm(iterable, **options): the bar in a terminal or a notebook; elsewhere (a log file, a pipe) a line per
    update, at most one every LOG_INTERVAL_S seconds (or `mininterval`, if larger), plus the last."""
    stream = options.pop("file", None) or sys.stderr
    in_notebook = autonotebook.tqdm is not plain_tqdm
    if options.get("disable") or in_notebook or _is_terminal(stream):
        return auto_tqdm(iterable, file=stream, **options)
    interval = max(options.pop("mininterval", 0.0), LOG_INTERVAL_S)
    options.pop("dynamic_ncols", None)
    options.setdefault("ncols", 120)
    return plain_tqdm(iterable, file=_Lines(stream), mininterval=interval, maxinterval=interval, **options)
