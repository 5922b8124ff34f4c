"""A tiny random Llama teacher with a small BPE tokenizer, saved as an HF folder, for conversion tests."""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

import pytest
from offline_models import save_tiny_teacher


@pytest.fixture(scope="session")
def tiny_teacher(tmp_path_factory) -> Path:
    return save_tiny_teacher(tmp_path_factory.mktemp("tiny-teacher"))


@pytest.fixture(scope="session")
def distilled_run(tiny_teacher, tmp_path_factory) -> tuple[Path, str]:
    """`hyla convert` of the tiny teacher with test_convert_pipeline's settings until stage 2, run once for the tests
    that compare another run with it (none writes to it): the run folder and what the run printed."""
    from test_convert_pipeline import convert_args

    from hyla.cli import main

    out = tmp_path_factory.mktemp("distilled") / "run"
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        assert main(convert_args(tiny_teacher, out, "--until-stage", "distill")) == 0
    return out, printed.getvalue()
