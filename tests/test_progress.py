"""Progress a log can read: off a terminal, long stages print plain progress lines periodically, not only at the end."""

import io
import re
import subprocess
import sys
import time

import pytest
from rich.console import Console

from phasekv.errors import ConfigError
from phasekv.progress import INTERVAL_ENV, Progress, progress_bar
from tests.train.helpers import FAST, ROOT, cli_args, env

LINE = re.compile(r"^progress: (?P<stage>.+) (?P<done>\d+)/(?P<total>\d+) \(\d+%\) · \S+ elapsed", re.M)


def plain_console() -> tuple[Console, io.StringIO]:
    out = io.StringIO()
    return Console(file=out, force_terminal=False), out


def test_periodic_lines_off_a_terminal():
    console, out = plain_console()
    with Progress(console=console, interval=0.05) as bar:
        task = bar.add_task("lookup · W8/S8", total=8)
        for _ in range(8):
            time.sleep(0.04)
            bar.advance(task)
    lines = LINE.findall(out.getvalue())
    assert len(lines) >= 3, out.getvalue()  # periodic, then the completion line
    assert lines[-1] == ("lookup · W8/S8", "8", "8")
    assert "left" in out.getvalue()  # an estimate once a rate is known


def test_a_new_task_after_a_removed_one_keeps_its_own_line():
    """Tasks come and go (the demo's workers): a new task never takes a live task's id and its progress."""
    console, out = plain_console()
    with Progress(console=console, interval=60) as bar:
        bar.add_task("demo tasks", total=3, estimate=False)
        first, second = bar.add_task("train a", total=10), bar.add_task("train b", total=10)
        bar.remove_task(first)
        third = bar.add_task("train c", total=10)
        assert third not in (first, second)
        bar.update(second, completed=10)  # b's completion line, under b's name
    assert LINE.findall(out.getvalue()) == [("train b", "10", "10")], out.getvalue()


def test_lines_while_nothing_advances():
    """A long step (no advance for a while) still shows the stage is alive."""
    console, out = plain_console()
    with Progress(console=console, interval=0.05) as bar:
        bar.add_task("train", total=100, completed=40, info="loss 2.310")
        time.sleep(0.4)
    text = out.getvalue()
    assert len(LINE.findall(text)) >= 2, text
    assert "40/100" in text and "loss 2.310" in text and "estimate pending" in text


def test_no_estimate_where_the_count_is_no_measure_of_time():
    """The demo's task count (a training beside a gate statistic) gives no time left; its lines still come."""
    console, out = plain_console()
    with Progress(console=console, interval=0.05) as bar:
        task = bar.add_task("demo tasks", total=34, estimate=False)
        for _ in range(3):
            time.sleep(0.06)
            bar.advance(task)
        time.sleep(0.3)  # lines keep coming while nothing finishes
    text = out.getvalue()
    assert "3/34" in text and "elapsed" in text, text
    assert "left" not in text and "estimate pending" not in text, text


def test_terminal_shows_a_bar_not_lines():
    out = io.StringIO()
    with Progress(console=Console(file=out, force_terminal=True), interval=0.01) as bar:
        task = bar.add_task("train", total=3)
        for _ in range(3):
            time.sleep(0.02)
            bar.advance(task)
    assert "progress:" not in out.getvalue()


def test_disabled_shows_nothing():
    console, out = plain_console()
    with Progress(console=console, disable=True, interval=0.01) as bar:
        bar.advance(bar.add_task("x", total=2), 2)
        time.sleep(0.05)
    assert out.getvalue() == ""


def test_interval_from_environment(monkeypatch, capsys):
    monkeypatch.setenv(INTERVAL_ENV, "0.05")
    with progress_bar(True, 4, "knockouts") as advance:
        for _ in range(4):
            time.sleep(0.05)
            advance()
    assert len(LINE.findall(capsys.readouterr().out)) >= 2
    monkeypatch.setenv(INTERVAL_ENV, "soon")
    with pytest.raises(ConfigError, match=f"{INTERVAL_ENV}='soon' must be a positive number of seconds"):
        Progress()


def test_training_run_logs_progress_lines(tmp_path):
    """`phasekv train` with its output piped (not a terminal) prints periodic progress lines, not only the end."""
    opts = {**FAST, "progress": True, "steps": 40, "out": tmp_path / "run"}
    r = subprocess.run([sys.executable, "-m", "phasekv.cli", "train", *cli_args(opts)], cwd=ROOT,
                       env={**env(), INTERVAL_ENV: "0.02"}, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    lines = [m for m in LINE.finditer(r.stdout) if m["stage"] == "train"]
    assert len(lines) >= 2 and lines[-1]["done"] == lines[-1]["total"] == "40", r.stdout[-2000:]
