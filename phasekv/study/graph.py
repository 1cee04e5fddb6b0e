"""The task graph and its driver: tasks with their inputs (`Task.after`), run by an executor (`phasekv.study.local`,
`phasekv.study.slurm`) in the graph's order, a task whose outputs exist skipped. The driver (`run_tasks`) is a
`Schedule` (what is ready, what failed, what to skip) and a `ProgressView` (what it shows); the time-left estimate
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


SKIPPED = "skipped: a task it needs failed"  # the error of a task behind a failed one


@dataclass
class _Running:
    task: Task
    handle: Handle
    t0: float  # when it was submitted (or found running)


class Schedule:
    """Where each task stands while the driver runs, and what it does next: the tasks to submit (`todo`, in the
    graph's order), running (submitted, or found queued), finished and failed; which task is `ready`, which to
    `skip` behind a failed one. It shows nothing and runs nothing."""

    def __init__(self, tasks: list[Task], executor: Executor):
        self.executor = executor
        self.finished = {t.name for t in tasks if t.is_done()}
        self.todo = [t for t in tasks if t.name not in self.finished]
        self.running: dict[str, _Running] = {}
        self.failed: dict[str, str] = {}

    def start(self, task: Task, handle: Handle) -> _Running:
        self.todo.remove(task)
        self.running[task.name] = _Running(task, handle, time.time())
        return self.running[task.name]

    def ready(self) -> Task | None:
        """The first task to submit now: a slot is free and its inputs are finished (or, on an executor that
        `chains` them, submitted)."""
        ex = self.executor
        if ex.slots is not None and len(self.running) >= ex.slots:
            return None
        return next((t for t in self.todo if all(d in self.finished or (ex.chains and d in self.running)
                                                 for d in t.after)), None)

    def inputs(self, task: Task) -> list[Handle]:
        """The handles of the running tasks `task` needs (a chaining executor queues it after them)."""
        return [self.running[d].handle for d in task.after if d in self.running]

    def skip(self) -> list[_Running]:
        """Fail every task that needs a failed one, directly or through another; returns those already submitted
        (queued behind a failed task, they would never start: the driver withdraws them)."""
        for t in [*(r.task for r in self.running.values()), *self.todo]:  # the graph's order: inputs first
            if any(d in self.failed for d in t.after):
                self.failed[t.name] = SKIPPED
        self.todo = [t for t in self.todo if t.name not in self.failed]
        return [self.running.pop(name) for name in list(self.running) if name in self.failed]

    def end(self, handle: Handle) -> _Running:
        """The running task of a finished handle, no longer running."""
        return self.running.pop(next(n for n, r in self.running.items() if r.handle is handle))

    def fail(self, task: Task, exc: Exception) -> str:
        self.failed[task.name] = f"{type(exc).__name__}: {' '.join(str(exc).split())}"
        return self.failed[task.name]


class ProgressView:
    """What the driver shows: the overall line with the time left (`_left_text`: tasks differ in cost by 100x, a
    training against a gate statistic, so their count gives no estimate; finished tasks price them by kind), a line
    per running task (on a scheduler, per training: `every_task` False) and a ✓ or ✗ line per ended task."""

    def __init__(self, tasks: list[Task], label: str, finished: set[str], took: dict[str, float], jobs: int,
                 show: bool, every_task: bool):
        self.tasks, self.took, self.jobs, self.every_task = tasks, took, jobs, every_task
        self.done, self.estimated, self.rows = len(finished), 0.0, {}
        if finished:
            console.print(f"[dim]resuming: {len(finished)} of {len(tasks)} tasks already done, skipped[/]")
        cols = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                TimeElapsedColumn(), TextColumn("{task.fields[left]}")]
        self.bar = Progress(*cols, console=console, disable=not show, refresh_per_second=2)
        self.overall = self.bar.add_task(f"[bold]{label} tasks", total=len(tasks), completed=len(finished),
                                         estimate=False, left="")

    def __enter__(self) -> ProgressView:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)

    def start(self, r: _Running) -> None:
        if self.every_task or r.task.steps is not None:
            self.rows[r.task.name] = self.bar.add_task(r.task.name, total=r.task.steps()[1] if r.task.steps else 1,
                                                       left="")

    def end(self, r: _Running) -> None:
        if (row := self.rows.pop(r.task.name, None)) is not None:
            self.bar.remove_task(row)

    def succeeded(self, r: _Running, secs: float, cpu: float, result) -> None:
        self.took[r.task.name] = _full_cost(result, secs)  # a resumed training: its whole run
        self.done += 1
        if self.done == len(self.tasks):
            self.bar.update(self.overall, left="")  # the completion line carries no estimate
        self.bar.advance(self.overall)
        console.print(f"[green]✓[/] {r.task.name} [dim]({secs:.0f} s wall, {cpu:.0f} s CPU)[/]")

    def failed(self, r: _Running, error: str) -> None:
        console.print(f"[red]✗ {r.task.name}[/] ({time.time() - r.t0:.0f} s): {error}")

    def refresh(self, running: list[_Running], failed: dict[str, str], ended: bool) -> None:
        """The running trainings' lines, and the time left when a task ended or every ESTIMATE_EVERY seconds."""
        share = {}  # running trainings' done share
        for r in running:
            if r.task.steps and r.task.name in self.rows:
                n, total = r.task.steps()
                self.bar.update(self.rows[r.task.name], completed=min(n, total))
                share[r.task.name] = min(n, total) / max(total, 1)
        if ended or time.time() - self.estimated >= ESTIMATE_EVERY:
            self.estimated = time.time()
            left = _left_text([t for t in self.tasks if t.name not in failed], self.took, share, self.jobs)
            self.bar.update(self.overall, left=left)


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
    plan = Schedule(tasks, executor)
    took = {k: v for k, v in (took or {}).items() if k in plan.finished}
    with ProgressView(tasks, label, plan.finished, took, jobs, progress, executor.slots is not None) as view:
        for t in list(plan.todo):  # jobs an earlier driver submitted, still queued or running
            if (h := executor.attach(t)) is not None:
                view.start(plan.start(t, h))
        while plan.todo or plan.running:
            for r in plan.skip():
                executor.cancel(r.handle)
                view.end(r)
            while (t := plan.ready()) is not None:  # submit what is ready, in the graph's order
                view.start(plan.start(t, executor.submit(t, plan.inputs(t))))
            if not plan.running or not executor.waits:
                break
            ended = [plan.end(h) for h in executor.wait([r.handle for r in plan.running.values()], timeout=1.0)]
            for r in ended:
                view.end(r)
                try:
                    result, cpu = r.handle.result()
                    secs = executor.seconds(r.handle, r.t0)
                    cpu = _full_cost(result, cpu)
                except Exception as exc:  # a failed task is reported; independent tasks continue
                    view.failed(r, plan.fail(r.task, exc))
                    continue
                plan.finished.add(r.task.name)
                record(r.task.name, secs, cpu)
                view.succeeded(r, secs, cpu, result)
            view.refresh(list(plan.running.values()), plan.failed, bool(ended))
    return plan.failed


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
