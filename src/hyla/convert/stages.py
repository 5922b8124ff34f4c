"""Stage folders of a conversion: `OUT/NN-name/` each with a `manifest.json` written last (atomically) when the
stage completes. A rerun skips complete stages whose inputs match and resumes an interrupted one from its own
checkpoints; a folder made from another teacher or other settings stops the run with one clear message.

Paths in manifests are relative to their stage folder (`Stage.relative`, `Stage.resolve`; another stage's files as
`../NN-name/...`), so a run folder can be moved or copied and resumed from anywhere. The export stage's folder is the HF
model folder a user publishes, so its bookkeeping (identity.json, manifest.json) sits beside it, in
`OUT/06-export.stage/`."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyla.outputs import run_metadata, write_json

STAGES = ("data", "align", "select", "distill", "finetune", "scaling", "export")
MANIFEST = "manifest.json"
IDENTITY = "identity.json"
# Stages whose folder is a deliverable (an HF model folder): hyla's files for them go to `NN-name.stage/`.
PUBLISHED_STAGES = ("export",)


def settings_hash(settings: Any) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


def settings_differences(stored: dict | None, current: dict) -> str:
    """What differs between the settings a stage folder was made with and this run's, as "budget.lr 0.0001 then,
    1000000.0 now; ..." ("" when the folder does not record them: made before identity.json held them)."""
    if not isinstance(stored, dict):
        return ""
    current = json.loads(json.dumps(current, default=str))
    found = []

    def walk(old: Any, new: Any, key: str) -> None:
        if isinstance(old, dict) and isinstance(new, dict):
            for name in sorted(set(old) | set(new)):
                walk(old.get(name), new.get(name), f"{key}.{name}" if key else name)
        elif old != new:
            found.append("an earlier stage changed" if key == "upstream" else f"{key} {old!r} then, {new!r} now")

    walk(stored, current, "")
    # A change upstream shows in every later stage: name the stage's own differences first.
    return "; ".join(sorted(found, key=lambda text: text == "an earlier stage changed"))


@dataclass
class Stage:
    root: Path
    name: str
    settings: dict
    fingerprint: dict

    @property
    def index(self) -> int:
        return STAGES.index(self.name)

    @property
    def path(self) -> Path:
        return self.root / f"{self.index:02d}-{self.name}"

    @property
    def state_path(self) -> Path:
        """Where the stage's identity.json and manifest.json live: its own folder, or beside a published one."""
        return self.root / f"{self.path.name}.stage" if self.name in PUBLISHED_STAGES else self.path

    @property
    def manifest_path(self) -> Path:
        return self.state_path / MANIFEST

    def read_manifest(self) -> dict | None:
        return self._read_json(self.manifest_path)

    def _read_json(self, path: Path) -> dict | None:
        if not path.exists():
            return None
        try:
            value = json.loads(path.read_text())
        except (OSError, ValueError) as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
            value, reason = None, str(err)
        else:
            reason = "not a JSON object"
        if not isinstance(value, dict):
            raise ValueError(f"damaged stage file {path} ({reason}); delete it, or rerun with --from-stage "
                             f"{self.name} to redo the stage")
        return value

    def relative(self, path: Path) -> str:
        """`path` as stored in a manifest: relative to the stage folder when inside the run folder (another stage's
        output as `../00-data/...`; the run stays relocatable), else absolute."""
        path = Path(path).resolve()
        try:
            return str(path.relative_to(self.path.resolve()))
        except ValueError:
            pass
        try:
            path.relative_to(self.root.resolve())
        except ValueError:
            return str(path)
        return os.path.relpath(path, self.path.resolve())

    def resolve(self, stored: str) -> Path:
        """A path from this stage's manifest (`relative`) as a path to use now."""
        path = Path(stored)
        if path.is_absolute():
            return path
        if not (self.path / path).exists() and path.parent.name == self.path.name:
            # Manifests written before paths were relative held them relative to the working directory at the time
            # ("runs/smoke/00-data/corpus"): the part after the stage folder's name is what it means.
            return self.path / path.name
        return self.path / path

    def check_compatible(self) -> None:
        """Refuse to reuse or resume a folder made from another teacher or with other settings."""
        manifest = self.read_manifest() or self._partial_identity()
        if manifest is None:
            return
        if manifest.get("teacher") != self.fingerprint:
            raise ValueError(
                f"{self.path} was made from another teacher ({manifest.get('teacher', {}).get('name')}); "
                f"use a new --out folder"
            )
        if manifest.get("settings_hash") != settings_hash(self.settings):
            differ = settings_differences(manifest.get("settings"), self.settings)
            raise ValueError(
                f"{self.path} was made with other settings{f' ({differ})' if differ else ''}; rerun with --from-stage "
                f"{self.name} to redo it (and the stages after it), or use a new --out folder"
            )

    def _partial_identity(self) -> dict | None:
        return self._read_json(self.state_path / IDENTITY)

    def begin(self) -> None:
        """Create the folder and record what it is being made from, so that a resume can check it."""
        self.path.mkdir(parents=True, exist_ok=True)
        write_json(self.state_path / IDENTITY, self._identity())

    def _identity(self) -> dict:
        return {"stage": self.name, "teacher": self.fingerprint, "settings_hash": settings_hash(self.settings),
                "settings": self.settings}

    @property
    def complete(self) -> bool:
        manifest = self.read_manifest()
        return manifest is not None and manifest.get("status") == "complete"

    def finish(self, results: dict) -> dict:
        """Mark the stage complete, then drop its training checkpoints: they exist to resume an interrupted stage,
        and a complete one has written its output (model, optimizer and loader state: ~1.6 GB each for a 135M
        teacher, two kept per stage)."""
        manifest = {**self._identity(), "status": "complete", "results": results, **run_metadata(self.settings)}
        write_json(self.manifest_path, manifest)
        shutil.rmtree(self.path / "checkpoints", ignore_errors=True)
        if self.state_path != self.path:  # runs made before the bookkeeping moved out of a published folder
            for name in (MANIFEST, IDENTITY):
                (self.path / name).unlink(missing_ok=True)
        return manifest

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
        shutil.rmtree(self.state_path, ignore_errors=True)
