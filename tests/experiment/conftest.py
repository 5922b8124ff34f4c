import json
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLANS = sorted((REPO / "configs" / "experiments").glob("*.json"))


def job(name: str, code: str = "pass", **fields) -> dict:
    """A plan job that runs `code` in this interpreter."""
    return {"name": name, "run": ["python", "-c", code], **fields}


@pytest.fixture
def write_plan(tmp_path):
    def write(jobs: list[dict], **top) -> Path:
        path = tmp_path / "plan.json"
        path.write_text(json.dumps({"name": "test", "jobs": jobs, **top}))
        return path

    return write


@pytest.fixture
def python():
    return sys.executable
