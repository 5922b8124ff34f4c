"""The HYLA_TEST_REPORT plugin (tests/report_log.py) writes outcomes and tracebacks as they happen."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


def test_outcomes_and_tracebacks_are_written_as_they_happen(tmp_path):
    (tmp_path / "test_sample.py").write_text(
        "import pytest\n"
        "def test_fine():\n    assert True\n"
        "def test_broken():\n    value = 0.25\n    assert value <= 0.003\n"
        "@pytest.mark.skip(reason='not here')\n"
        "def test_skipped():\n    pass\n"
    )
    report = tmp_path / "report.txt"
    env = dict(os.environ, HYLA_TEST_REPORT=str(report), PYTHONPATH=str(Path(__file__).parent))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "report_log", "-p", "no:cacheprovider",
                           str(tmp_path / "test_sample.py")], capture_output=True, text=True, env=env,
                          cwd=tmp_path, timeout=120)
    assert done.returncode == 1, done.stdout + done.stderr
    text = report.read_text()
    assert "PASSED " in text and "test_sample.py::test_fine" in text
    assert "FAILED " in text and "assert 0.25 <= 0.003" in text
    assert "SKIPPED " in text and "reason: Skipped: not here" in text
