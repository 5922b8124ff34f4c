"""bench/attention_first_call.py on a CPU: each backend runs in a process of its own, every length twice, and the
table holds one row per backend and length."""

from __future__ import annotations

import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_each_length_is_timed_twice_in_a_process_per_backend(tmp_path):
    sys.path.insert(0, str(REPO / "bench"))
    import attention_first_call

    code = attention_first_call.main(["--device", "cpu", "--backends", "torch", "--dtype", "float32",
                                      "--lengths", "64,60,64", "--out", str(tmp_path)])
    assert code == 0
    rows = json.loads((tmp_path / "attention-first-call.json").read_text())["rows"]
    assert [(r["backend"], r["length"]) for r in rows] == [("torch", 64), ("torch", 60), ("torch", 64)]
    assert all(r["first_ms"] > 0 and r["second_ms"] > 0 for r in rows)
    assert "| torch | 60 |" in (tmp_path / "attention-first-call.md").read_text()


def test_an_unknown_backend_is_one_error_before_any_run(tmp_path, capsys):
    import pytest

    sys.path.insert(0, str(REPO / "bench"))
    import attention_first_call

    with pytest.raises(SystemExit):
        attention_first_call.main(["--device", "cpu", "--backends", "torch,bogus", "--out", str(tmp_path / "o")])
    assert "unknown backends ['bogus']" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
