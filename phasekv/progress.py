"""Progress of long stages (training, evaluation, analyses, the demo): the one display every long loop uses.

On a terminal, a rich progress bar. Otherwise (CI, `make demo | tee log`), where a bar shows nothing until it
ends, plain lines a log can read, one per task at least every `interval` seconds (default 60, or the
PHASEKV_PROGRESS_INTERVAL environment variable) and one when the task completes:

    progress: train 1200/3200 (38%) · 1m30s elapsed · ~2m30s left · loss 2.310
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    ProgressColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)
from rich.progress import Progress as RichProgress
from rich.text import Text

from phasekv.errors import ConfigError

INTERVAL_ENV = "PHASEKV_PROGRESS_INTERVAL"  # seconds between a task's plain lines when output is not a terminal
DEFAULT_INTERVAL = 60.0
COLUMNS = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), TimeRemainingColumn())


def interval_from_env() -> float:
    """Seconds between plain progress lines: PHASEKV_PROGRESS_INTERVAL if set, else 60."""
    raw = os.environ.get(INTERVAL_ENV)
    try:
        value = DEFAULT_INTERVAL if raw is None else float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ConfigError(f"{INTERVAL_ENV}={raw!r} must be a positive number of seconds")
    return value


def duration(seconds: float) -> str:
    """'45s', '3m05s', '2h10m'."""
    s = int(seconds)
    return f"{s // 3600}h{s // 60 % 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


@dataclass
class _Task:
    """A task's state for plain lines."""

    description: str
    total: float | None
    completed: float
    fields: dict = field(default_factory=dict)
    start: float = field(default_factory=time.monotonic)
    last_line: float = field(default_factory=time.monotonic)
    done_reported: bool = False
    estimate: bool = True  # False where done/total is no measure of time (a count of unequal tasks)

    def __post_init__(self):
        self.first = self.completed  # progress made before this session (a resumed run) does not count in the rate

    def line(self, now: float) -> str:
        elapsed = now - self.start
        done = f"{self.completed:g}/{self.total:g}" if self.total else f"{self.completed:g}"
        parts = [f"progress: {Text.from_markup(self.description).plain} {done}"]
        if self.total:
            parts[0] += f" ({100 * self.completed / self.total:.0f}%)"
        parts.append(f"{duration(elapsed)} elapsed")
        rate = (self.completed - self.first) / elapsed if elapsed > 0 else 0.0
        if self.estimate and self.total and self.completed < self.total:
            parts.append(f"~{duration((self.total - self.completed) / rate)} left" if rate > 0 else "estimate pending")
        parts += [str(v) for v in self.fields.values() if str(v)]
        return " · ".join(parts)


class Progress:
    """rich.progress.Progress's add_task / update / advance / remove_task, shown as a rich bar on a terminal and
    as periodic plain lines otherwise; `disable` shows nothing. `interval`: seconds between a task's plain lines
    (default: PHASEKV_PROGRESS_INTERVAL, else 60)."""

    def __init__(self, *columns: ProgressColumn, console: Console | None = None, disable: bool = False,
                 interval: float | None = None, **rich_options):
        self.console = console or Console()
        self.disable = disable
        self.interval = interval_from_env() if interval is None else interval
        self.bar = None
        if not disable and self.console.is_terminal:
            self.bar = RichProgress(*(columns or COLUMNS), console=self.console, **rich_options)
        self.tasks: dict[int, _Task] = {}
        self._ids = itertools.count()  # never reused: a removed task's id must not alias a live one
        self._lock, self._stop = threading.Lock(), threading.Event()
        self._ticker: threading.Thread | None = None

    @property
    def plain(self) -> bool:
        return self.bar is None and not self.disable

    def __enter__(self) -> Progress:
        if self.bar is not None:
            self.bar.__enter__()
        elif self.plain:  # lines also come while nothing advances (a long step)
            self._ticker = threading.Thread(target=self._tick, daemon=True, name="phasekv-progress")
            self._ticker.start()
        return self

    def __exit__(self, *exc) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)
        if self._ticker is not None:
            self._stop.set()
            self._ticker.join()

    def add_task(self, description: str, total: float | None = 100.0, completed: float = 0, estimate: bool = True,
                 **fields) -> int:
        """`estimate=False`: plain lines give no time left (the bar's columns are the caller's choice)."""
        if self.bar is not None:
            return self.bar.add_task(description, total=total, completed=completed, **fields)
        with self._lock:
            task = next(self._ids)
            self.tasks[task] = _Task(description, total, completed, fields, estimate=estimate)
        return task

    def update(self, task: int, *, completed: float | None = None, advance: float | None = None,
               total: float | None = None, description: str | None = None, **fields) -> None:
        if self.bar is not None:
            changes = dict(completed=completed, advance=advance, total=total, description=description)
            self.bar.update(task, **{k: v for k, v in changes.items() if v is not None}, **fields)
            return
        with self._lock:
            t = self.tasks.get(task)
            if t is None:
                return
            t.completed = completed if completed is not None else t.completed + (advance or 0)
            t.total = t.total if total is None else total
            t.description = t.description if description is None else description
            t.fields.update(fields)
            if t.total and t.completed >= t.total and not t.done_reported:
                t.done_reported = True
                self._print(t)

    def advance(self, task: int, advance: float = 1) -> None:
        self.update(task, advance=advance)

    def remove_task(self, task: int) -> None:
        if self.bar is not None:
            self.bar.remove_task(task)
            return
        with self._lock:
            self.tasks.pop(task, None)

    def _print(self, t: _Task) -> None:
        if self.plain:
            now = time.monotonic()
            t.last_line = now
            self.console.print(t.line(now), markup=False, highlight=False, soft_wrap=True)

    def _tick(self) -> None:
        while not self._stop.wait(min(1.0, self.interval / 4)):
            with self._lock:
                for t in self.tasks.values():
                    if not t.done_reported and time.monotonic() - t.last_line >= self.interval:
                        self._print(t)


@contextmanager
def progress_bar(enabled: bool, total: int, label: str) -> Iterator:
    """One task's progress: yields advance(n=1)."""
    with Progress(disable=not enabled) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n=1: bar.advance(task, n)
