"""Stage folders of a conversion: `OUT/NN-name/` each with a `manifest.json` written last (atomically) when the
stage completes. A rerun skips complete stages whose inputs match and resumes an interrupted one from its own
checkpoints; a folder made from another teacher or other settings stops the run with one clear message."""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hyla.outputs import run_metadata, write_json

STAGES = ("data", "align", "select", "distill", "finetune", "scaling", "export")
MANIFEST = "manifest.json"


def settings_hash(settings: Any) -> str:
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:16]


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
    def manifest_path(self) -> Path:
        return self.path / MANIFEST

    def read_manifest(self) -> dict | None:
        return json.loads(self.manifest_path.read_text()) if self.manifest_path.exists() else None

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
            raise ValueError(
                f"{self.path} was made with other settings; rerun with --from-stage {self.name} to redo it "
                f"(and the stages after it), or use a new --out folder"
            )

    def _partial_identity(self) -> dict | None:
        identity = self.path / "identity.json"
        return json.loads(identity.read_text()) if identity.exists() else None

    def begin(self) -> None:
        """Create the folder and record what it is being made from, so that a resume can check it."""
        self.path.mkdir(parents=True, exist_ok=True)
        write_json(self.path / "identity.json", self._identity())

    def _identity(self) -> dict:
        return {"stage": self.name, "teacher": self.fingerprint, "settings_hash": settings_hash(self.settings)}

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
        return manifest

    def remove(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)
