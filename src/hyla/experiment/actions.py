"""The file steps a plan can take without a command: `copy` and `split_largest`. Both are safe to rerun: they keep
what their targets hold already, and neither changes its sources."""

from __future__ import annotations

import glob
import shutil
from pathlib import Path


def copy_into(sources: list[str], into: Path, *, exclude: list[str] = (), log=print) -> list[Path]:
    """Copy each file or folder matching `sources` (paths or globs) into `into` under its own name, leaving out
    names matching `exclude`; targets that exist are kept. A folder is copied to a staging name first and renamed,
    so a copy cut short leaves no half folder. Returns the targets written."""
    into.mkdir(parents=True, exist_ok=True)
    written = []
    for pattern in sources:
        matches = sorted(glob.glob(pattern))
        if not matches:
            raise FileNotFoundError(f"copy: nothing matches {pattern}")
        for source in map(Path, matches):
            target = into / source.name
            if target.exists():
                log(f"copy: {target} exists, kept")
                continue
            if source.is_dir():
                staging = target.with_name(f".{target.name}.copying")
                shutil.rmtree(staging, ignore_errors=True)
                shutil.copytree(source, staging, ignore=shutil.ignore_patterns(*exclude) if exclude else None)
                staging.rename(target)
            else:
                shutil.copy2(source, target)
            log(f"copy: {source} -> {target}")
            written.append(target)
    return written


def split_largest(text: Path, largest: Path, rest: Path, count: int, *, log=print) -> tuple[int, int]:
    """Copy the `count` largest files under `text` into the new folder `largest` (flat, named by their path with
    `/` as `__`) and every other file into the new folder `rest` (same layout as in `text`); `text` is left as it
    is. Each folder is written under a staging name and renamed when complete; when both exist this does nothing.
    Returns the number of files in each."""
    if largest.exists() and rest.exists():
        log(f"split_largest: {largest} and {rest} exist, nothing to do")
        return -1, -1
    if not text.is_dir():
        raise FileNotFoundError(f"split_largest: {text} is not a folder")
    files = sorted((path for path in text.rglob("*") if path.is_file()), key=lambda p: (-p.stat().st_size, str(p)))
    if len(files) <= count:
        raise ValueError(f"split_largest: {text} holds {len(files)} files; taking the {count} largest would leave "
                         f"none")
    for folder, chosen, flat in ((largest, files[:count], True), (rest, files[count:], False)):
        if folder.exists():
            continue
        staging = folder.with_name(f".{folder.name}.copying")
        shutil.rmtree(staging, ignore_errors=True)
        for path in chosen:
            relative = path.relative_to(text)
            target = staging / ("__".join(relative.parts) if flat else relative)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target)
        staging.mkdir(parents=True, exist_ok=True)
        staging.rename(folder)
    log(f"split_largest: the {count} largest files of {text} copied into {largest}, the other {len(files) - count} "
        f"into {rest}")
    return count, len(files) - count
