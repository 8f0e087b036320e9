"""The command line's progress bars (rhino.cli.progress, drawn by tqdm), in process.

Off a terminal a bar is plain lines, one per 10 %; on a terminal it redraws one
line and ends it. A finished job shows 100 %; a job stopped by an error or
Ctrl-C leaves its bar where it stopped, never at 100 %; a disabled bar prints
nothing. The subprocess tests of `rhino verify` / `rhino restore` check the same
on stderr."""

from __future__ import annotations

import io
import re

import pytest

from rhino.cli.progress import Progress

MIB = 1 << 20


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def percentages(text: str) -> list[float]:
    return [float(p) for p in re.findall(r"\]\s+([\d.]+)%", text)]


def test_off_a_terminal_one_plain_line_per_ten_percent_and_the_last_at_100():
    out = io.StringIO()
    with Progress("verify", 10 * MIB, stream=out) as p:
        for _ in range(40):
            p.advance(MIB // 4)
    lines = out.getvalue().splitlines()
    assert "\r" not in out.getvalue()
    assert percentages(out.getvalue()) == [10.0 * i for i in range(11)]
    assert lines[-1].startswith("verify [" + "#" * 30 + "] 100.0%  10.0 MiB / 10.0 MiB")


@pytest.mark.parametrize("stream_type", [io.StringIO, Terminal])
def test_a_job_stopped_early_abandons_its_bar(stream_type):
    out = stream_type()
    with pytest.raises(KeyboardInterrupt):
        with Progress("copy", 10 * MIB, stream=out) as p:
            p.advance(3 * MIB + 5)
            raise KeyboardInterrupt
    text = out.getvalue()
    assert "copy [" in text and "100.0%" not in text
    assert max(percentages(text)) == 30.0
    assert text.endswith("\n")  # the terminal's line is ended


def test_on_a_terminal_one_line_redrawn_then_ended():
    out = Terminal()
    with Progress("build", 4 * MIB, stream=out) as p:
        for _ in range(4):
            p.advance(MIB)
    text = out.getvalue()
    assert text.startswith("\r") and text.endswith("\n") and text.count("\n") == 1
    assert percentages(text)[0] == 0.0 and percentages(text)[-1] == 100.0


def test_finish_and_abandon_by_hand_as_rhino_restore_uses_them():
    out = io.StringIO()
    bar = Progress("verify", 100, stream=out).__enter__()
    bar.advance(60)
    assert bar.done == 60
    bar.abandon()
    bar.advance(40)  # nothing is drawn once abandoned
    assert max(percentages(out.getvalue())) == 60.0
    other = Progress("copy", 100, stream=out).__enter__()
    other.finish()
    assert percentages(out.getvalue())[-1] == 100.0


def test_a_disabled_bar_prints_nothing_but_counts():
    out = io.StringIO()
    with Progress("quiet", 10, stream=out, enabled=False) as p:
        p.advance(4)
        assert p.done == 4
    assert out.getvalue() == ""
