"""The local executor: the task graph's tasks in a pool of worker processes on this machine (spawned: one torch
thread each), the demo's and the study's default."""

from __future__ import annotations

import multiprocessing as mp
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait

from phasekv.study.executor import Executor, timed


class LocalExecutor(Executor):
    """`jobs` worker processes; a task is submitted once its inputs exist."""

    def __init__(self, jobs: int):
        self.slots = jobs
        self.pool = ProcessPoolExecutor(max_workers=jobs, mp_context=mp.get_context("spawn"))

    def submit(self, task, after: list[Future]) -> Future:
        return self.pool.submit(timed, task.fn, task.kwargs)

    def wait(self, handles: list[Future], timeout: float) -> list[Future]:
        return list(wait(handles, timeout=timeout, return_when=FIRST_COMPLETED)[0])

    def close(self) -> None:
        self.pool.shutdown()
