"""The executor seam: where a task of the graph runs. An executor submits a task (a picklable module-level function
and its keyword arguments) and returns a handle; the graph's driver (`phasekv.study.graph.run_tasks`) decides what is
ready, an executor only runs it. `local.LocalExecutor` is a process pool on this machine, `slurm.SlurmExecutor` a
SLURM job per task through submitit; a third engine (Ray, say) is one more small class in a file of its own."""

from __future__ import annotations

import time
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Protocol

_WORKER_STARTED = False


class Handle(Protocol):
    """A submitted task: a `concurrent.futures.Future` is one."""

    def done(self) -> bool: ...

    def result(self):  # (the task's return value, CPU seconds); raises the task's error
        ...


class Executor(ABC):
    """Runs tasks somewhere. `slots`: tasks at once (None: every ready task; a scheduler queues them); `chains`: it
    takes a task whose inputs are still being made, given the handles of the tasks making them (`after`), and starts
    it only once they have succeeded (SLURM's dependencies); `waits`: the driver stays until the graph is done (a
    local pool must; a scheduler's driver may leave once everything is submitted)."""

    slots: int | None = None
    chains = False
    waits = True

    @abstractmethod
    def submit(self, task, after: list[Handle]) -> Handle:
        """Start (or queue) `task` once the tasks behind `after` have succeeded -> its handle."""

    def wait(self, handles: list[Handle], timeout: float) -> list[Handle]:
        """The handles among `handles` that are done, after at most `timeout` seconds (sooner when one is)."""
        end = time.time() + timeout
        while True:
            done = [h for h in handles if h.done()]
            if done or time.time() >= end:
                return done
            time.sleep(min(1.0, max(end - time.time(), 0.0)))

    def attach(self, task) -> Handle | None:
        """The live (queued or running) job an earlier driver submitted for `task`, if any: a restarted driver
        waits for it instead of submitting the task again."""
        return None

    def seconds(self, handle: Handle, submitted: float) -> float:
        """Wall-clock seconds a finished task took (what the time-left estimate prices): here, since it was
        submitted (a pool submits a task when a worker is free)."""
        return time.time() - submitted

    def cancel(self, handle: Handle) -> None:
        """Withdraw a submitted task whose inputs failed (a scheduler's queued job); a local pool never submits one."""
        return None

    def close(self) -> None:
        """Release what the executor holds (a pool's workers)."""
        return None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def timed(fn: Callable, kwargs: dict) -> tuple[object, float]:
    """Run a task where it runs (a worker, a job) and return (result, CPU seconds it used): CPU time does not depend
    on what else the machine is running, so it prices the demo for an idle machine. A worker's first task is also
    charged the worker's start-up (interpreter, torch and phasekv imports)."""
    global _WORKER_STARTED
    c0 = time.process_time() if _WORKER_STARTED else 0.0
    _WORKER_STARTED = True
    result = fn(**kwargs)
    return result, time.process_time() - c0
