import json
from pathlib import Path

import pytest


@pytest.fixture
def write_plan(tmp_path):
    def write(jobs: list[dict], **top) -> Path:
        path = tmp_path / "plan.json"
        path.write_text(json.dumps({"name": "test", "jobs": jobs, **top}))
        return path

    return write
