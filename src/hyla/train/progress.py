"""Step logging: a progress bar with loss, tokens/s and ETA on the main process, and a metrics.jsonl file."""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

from hyla.progress import progress


class StepLog:
    def __init__(self, path: Path, *, total_steps: int, start_step: int, description: str, enabled: bool):
        self.path = path
        self.enabled = enabled
        self.started = time.perf_counter()
        self.start_step = start_step
        self.bar = progress(
            total=total_steps, initial=start_step, desc=description, unit="step", dynamic_ncols=True,
            disable=not enabled, file=sys.stderr,
        )
        if enabled:
            self._truncate_after(start_step)

    def _truncate_after(self, step: int) -> None:
        """A resumed run rewrites the steps after its checkpoint, so the file holds one line per step."""
        if not self.path.exists():
            return
        kept = [line for line in self.path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
        self.path.write_text("".join(line + "\n" for line in kept))

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as handle:
            handle.write(json.dumps(json_safe(record), allow_nan=False) + "\n")
        self.bar.set_postfix(
            {k: f"{v:.4g}" for k, v in record.items() if k in ("loss", "lr", "tok_per_s")}, refresh=False
        )
        self.bar.update(1)

    def close(self) -> None:
        self.bar.close()


def json_safe(record: dict) -> dict:
    """`record` with NaN and infinite numbers as null: JSON has no NaN (a metric a step could not compute)."""
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}


def read_metrics(path: Path) -> list[dict]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line]
