"""Progress bars (hyla.progress): a bar that redraws itself in a terminal, a line per update in a log file."""

from __future__ import annotations

import io

from hyla.progress import LOG_INTERVAL_S, progress


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_file_gets_one_line_per_update_and_no_carriage_returns():
    log = io.StringIO()
    for _ in progress(range(1000), desc="steps", file=log):
        pass
    text = log.getvalue()
    assert "\r" not in text and text.endswith("\n")
    lines = text.splitlines()
    # the first and the last state; the 998 updates between come within LOG_INTERVAL_S of the first
    assert LOG_INTERVAL_S >= 10 and len(lines) == 2, lines
    assert lines[0].startswith("steps:   0%") and lines[-1].startswith("steps: 100%") and "1000/1000" in lines[-1]


def test_a_terminal_gets_tqdms_bar_redrawn_in_place():
    screen = Terminal()
    for _ in progress(range(3), desc="steps", file=screen, mininterval=0):
        pass
    assert screen.getvalue().count("\r") >= 3  # every redraw returns to the start of the line


def test_a_disabled_bar_writes_nothing():
    log = io.StringIO()
    assert list(progress(range(3), file=log, disable=True)) == [0, 1, 2]
    assert log.getvalue() == ""


def test_a_manual_bar_with_postfix_still_writes_lines(capsys):
    bar = progress(total=4, desc="align", unit="step")  # stderr, captured here: not a terminal
    for _ in range(4):
        bar.set_postfix({"loss": "0.5"}, refresh=False)
        bar.update(1)
    bar.close()
    err = capsys.readouterr().err
    assert "\r" not in err and err.splitlines()[-1].startswith("align: 100%") and "loss=0.5" in err
