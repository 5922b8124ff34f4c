"""A tiny random Llama teacher with a small BPE tokenizer, saved as an HF folder, for conversion tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from offline_models import save_tiny_teacher


@pytest.fixture(scope="session")
def tiny_teacher(tmp_path_factory) -> Path:
    return save_tiny_teacher(tmp_path_factory.mktemp("tiny-teacher"))


@pytest.fixture(scope="session")
def distilled_run(tiny_teacher, tmp_path_factory) -> Path:
    """`hyla convert` of the tiny teacher with test_convert_pipeline's settings until stage 2, run once: the run folder
    for the tests that compare another run with it (none writes to it)."""
    from test_convert_pipeline import convert_args

    from hyla.cli import main

    out = tmp_path_factory.mktemp("distilled") / "run"
    assert main(convert_args(tiny_teacher, out, "--until-stage", "distill")) == 0
    return out
