"""A tiny random Llama teacher with a small BPE tokenizer, saved as an HF folder, for conversion tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from offline_models import save_tiny_teacher


@pytest.fixture(scope="session")
def tiny_teacher(tmp_path_factory) -> Path:
    return save_tiny_teacher(tmp_path_factory.mktemp("tiny-teacher"))
