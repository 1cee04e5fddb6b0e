"""The task graph and its driver: tasks with their inputs (`Task.after`), run by an executor (`phasekv.study.local`,
`phasekv.study.slurm`) in the graph's order, a task whose outputs exist skipped; the time-left estimate
(`makespan`, `time_left`) and the directory lock."""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, SpinnerColumn, TextColumn, TimeElapsedColumn

from phasekv.errors import ConfigError
from phasekv.progress import Progress, duration
from phasekv.study.executor import Executor, Handle

console = Console()
ESTIMATE_EVERY = 30.0  # seconds between re-estimates of the time left (and at every finished task)


@dataclass
class Task:
    name: str  # e.g. "train w8s8-1kv"
    fn: Callable  # a function of phasekv.demo.stages (picklable: module level)
    kwargs: dict
    is_done: Callable[[], bool]  # outputs complete?
    after: list[str] = field(default_factory=list)  # tasks that must finish first
    steps: Callable[[], tuple[int, int]] | None = None  # (done, total) for a live progress bar
    units: float = 1.0  # work in its kind's unit, what the time-left estimate prices (a training: its steps)
    parallel: bool = False  # may run on several ranks (a training: nodes x GPUs per node on a cluster)


def makespan(tasks: list[Task], cost: dict[str, float], jobs: int) -> float:
    """Wall-clock time of the demo's schedule (first ready task to the first free worker, in task order)
    when each task takes cost[name] seconds; tasks without a cost take none."""
    finished: dict[str, float] = {}  # name -> end time
    running: list[tuple[float, str]] = []
    todo, now = list(tasks), 0.0
    while todo or running:
        ready = [t for t in todo if all(d in finished and finished[d] <= now for d in t.after)]
        while ready and len(running) < jobs:
            t = ready.pop(0)
            todo.remove(t)
            running.append((now + cost.get(t.name, 0.0), t.name))
        if not running:
            break  # unreachable dependencies
        running.sort()
        end, name = running.pop(0)
        now = max(now, end)
        finished[name] = end
    return now


def time_left(tasks: list[Task], took: dict[str, float], done_share: dict[str, float],
              jobs: int) -> tuple[float, list[str]]:
    """Wall-clock seconds the unfinished tasks still take on `jobs` workers (`makespan` of their schedule), each
    priced at its kind's seconds per unit (`Task.units`) over the finished tasks `took` of that kind, a running task at
    the share of it not yet done (`done_share`); and the kinds no finished task prices yet (counted as free)."""
    per_kind: dict[str, list[float]] = {}  # stage function -> [seconds, units] of finished tasks
    for t in tasks:
        if t.name in took:
            c_u = per_kind.setdefault(t.fn.__name__, [0.0, 0.0])
            c_u[0] += took[t.name]
            c_u[1] += t.units
    left, cost, untimed = [], {}, set()
    for t in (t for t in tasks if t.name not in took):
        c, u = per_kind.get(t.fn.__name__, (0.0, 0.0))
        if u:
            cost[t.name] = c / u * t.units * (1.0 - done_share.get(t.name, 0.0))
        else:
            untimed.add(t.fn.__name__)
        left.append(dataclasses.replace(t, after=[d for d in t.after if d not in took]))
    return makespan(left, cost, jobs), sorted(untimed)


def _left_text(tasks: list[Task], took: dict[str, float], done_share: dict[str, float], jobs: int) -> str:
    """The overall line's estimate: '~2h10m left', or '≥ ~2h10m left (not yet timed: knockout, retrieval)'."""
    if all(t.name in took for t in tasks):
        return ""
    if not took:
        return "estimate after the first task"
    seconds, untimed = time_left(tasks, took, done_share, jobs)
    return f"~{duration(seconds)} left" if not untimed else \
        f"≥ ~{duration(seconds)} left (not yet timed: {', '.join(untimed)})"


@dataclass
class _Running:
    task: Task
    handle: Handle
    row: int | None  # its progress line
    t0: float  # when it was submitted (or found running)


def run_tasks(tasks: list[Task], jobs: int, progress: bool, record: Callable[[str, float, float], None],
              label: str = "demo", took: dict[str, float] | None = None,
              executor: Executor | None = None) -> dict[str, str]:
    """Run every unfinished task once its dependencies are done (or, on an executor that `chains` them, submitted);
    returns {task: error} of failed tasks. `executor`: where the tasks run (default: a local pool of `jobs` workers;
    `jobs` also prices the time left). A task an earlier driver submitted and the executor still holds is waited for,
    not submitted again. The overall line estimates the time left from finished tasks' wall-clock seconds (`took`:
    earlier runs', then this one's; wall, not CPU: it is what a busy or slow machine gives). On an executor that does
    not wait (a scheduler, without --wait) it returns once every task is submitted."""
    if executor is None:
        from phasekv.study.local import LocalExecutor

        with LocalExecutor(jobs) as local:
            return run_tasks(tasks, jobs, progress, record, label, took, local)
    finished = {t.name for t in tasks if t.is_done()}
    took = {k: v for k, v in (took or {}).items() if k in finished}
    shown = 0.0  # when the estimate was last computed
    failed: dict[str, str] = {}
    todo = [t for t in tasks if t.name not in finished]
    if finished:
        console.print(f"[dim]resuming: {len(finished)} of {len(tasks)} tasks already done, skipped[/]")
    cols = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
            TextColumn("{task.fields[left]}")]
    running: dict[str, _Running] = {}
    with Progress(*cols, console=console, disable=not progress, refresh_per_second=2) as bar:
        # tasks differ in cost by 100x (a training against a gate statistic): their count gives no estimate of
        # the time left; the `left` field prices them by kind (`time_left`), each running task's own line by rate
        overall = bar.add_task(f"[bold]{label} tasks", total=len(tasks), completed=len(finished), estimate=False,
                               left="")

        def start(t: Task, handle: Handle) -> None:
            todo.remove(t)
            shown_row = executor.slots is not None or t.steps is not None  # on a scheduler: the trainings' lines
            row = bar.add_task(t.name, total=t.steps()[1] if t.steps else 1, left="") if shown_row else None
            running[t.name] = _Running(t, handle, row, time.time())

        for t in list(todo):  # jobs an earlier driver submitted, still queued or running
            if (h := executor.attach(t)) is not None:
                start(t, h)
        while todo or running:
            for r in [r for r in running.values() if any(d in failed for d in r.task.after)]:
                executor.cancel(r.handle)  # queued behind a failed task: it would never start
                del running[r.task.name]
                if r.row is not None:
                    bar.remove_task(r.row)
                failed[r.task.name] = "skipped: a task it needs failed"
            blocked = {t.name for t in todo if any(d in failed for d in t.after)}
            for name in blocked:
                failed[name] = "skipped: a task it needs failed"
            todo = [t for t in todo if t.name not in blocked]
            while executor.slots is None or len(running) < executor.slots:  # submit what is ready, in task order
                ready = next((t for t in todo if all(d in finished or (executor.chains and d in running)
                                                     for d in t.after)), None)
                if ready is None:
                    break
                start(ready, executor.submit(ready, [running[d].handle for d in ready.after if d in running]))
            if not running or not executor.waits:
                break
            done_now = executor.wait([r.handle for r in running.values()], timeout=1.0)
            for h in done_now:
                r = running.pop(next(n for n, r in running.items() if r.handle is h))
                t = r.task
                if r.row is not None:
                    bar.remove_task(r.row)
                try:
                    result, cpu = h.result()
                    secs = executor.seconds(h, r.t0)
                    cpu = _full_cost(result, cpu)
                except Exception as exc:  # a failed task is reported; independent tasks continue
                    failed[t.name] = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
                    console.print(f"[red]✗ {t.name}[/] ({time.time() - r.t0:.0f} s): {failed[t.name]}")
                    continue
                finished.add(t.name)
                record(t.name, secs, cpu)
                took[t.name] = _full_cost(result, secs)  # a resumed training: its whole run
                if len(finished) == len(tasks):
                    bar.update(overall, left="")  # the completion line carries no estimate
                bar.advance(overall)
                console.print(f"[green]✓[/] {t.name} [dim]({secs:.0f} s wall, {cpu:.0f} s CPU)[/]")
            share = {}  # running trainings' done share
            for r in running.values():
                if r.task.steps and r.row is not None:
                    n, total = r.task.steps()
                    bar.update(r.row, completed=min(n, total))
                    share[r.task.name] = min(n, total) / max(total, 1)
            if done_now or time.time() - shown >= ESTIMATE_EVERY:
                shown = time.time()
                bar.update(overall, left=_left_text([t for t in tasks if t.name not in failed], took, share, jobs))
    return failed


def _full_cost(result, seconds: float) -> float:
    """A training run resumed at step k did only (n - k) of its n steps here: price the whole run."""
    if isinstance(result, dict) and result.get("resumed_from") and result.get("steps"):
        done = result["steps"] - result["resumed_from"]
        return seconds * result["steps"] / max(done, 1)
    return seconds


class Lock:
    """DIR/.demo.lock holds the pid of the demo (or study) writing DIR; a second one on the same DIR is refused."""

    def __init__(self, root: Path):
        self.path = root / ".demo.lock"

    def __enter__(self):
        try:
            fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            try:
                pid = int(self.path.read_text() or 0)
                os.kill(pid, 0)  # raises when no such process
            except (ValueError, ProcessLookupError):
                self.path.unlink(missing_ok=True)  # left by a demo that was killed
                return self.__enter__()
            except PermissionError:
                pass
            raise ConfigError(f"another demo or study (pid {pid}) is writing {self.path.parent}; wait for it or stop "
                              "it") from None
        with os.fdopen(fd, "w") as f:
            f.write(str(os.getpid()))
        return self

    def __exit__(self, *exc):
        self.path.unlink(missing_ok=True)
