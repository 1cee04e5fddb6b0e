"""SLURM jobs through submitit's API: what a job runs (`TaskJob`, a submitit `Checkpointable`), the job itself
(submitit's `SlurmJob`: state, done, result, cancel, paths) watched through SLURM's queue, and the driver's handle of
it (`SlurmHandle`). submitit is an optional dependency (the `cluster` extra): this module is imported only where jobs
are submitted or read back (`phasekv.study.slurm.SlurmExecutor`, `phasekv study status`).

submitit reads a job's state from SLURM's accounting (`sacct`), which needs a database many small clusters lack; the
`QueueWatcher` reads the queue (`squeue`), which every cluster has: it lists a finished job for `MinJobAge` seconds,
and a job it no longer lists has ended.
"""

from __future__ import annotations

import getpass
import os
import time

import submitit
from submitit.core.utils import FailedJobError
from submitit.helpers import Checkpointable, TorchDistributedEnvironment
from submitit.slurm.slurm import SlurmInfoWatcher

from phasekv.study.executor import timed

LIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
        "SUSPENDED", "SIGNALING", "STAGE_OUT", "PREEMPTED"}  # states of a job SLURM may still run (or run again)
ENDED = "ENDED"  # the state of a job the queue no longer lists
POLL_S = 5.0  # the most seconds between two reads of SLURM's queue while jobs run
QUEUE_FIELDS = {"JobID": "%i", "State": "%T", "NodeList": "%N", "Reason": "%r"}  # a job's info (sacct's names)


class QueueWatcher(SlurmInfoWatcher):
    """submitit's shared watcher of job states, reading this user's jobs in SLURM's queue: one `squeue` for all the
    jobs of the process, never an error for a job it no longer lists (its state: ENDED)."""

    def _make_command(self) -> list[str] | None:
        if not self._registered - self._finished:
            return None
        return ["squeue", "-h", "--states=all", "-u", getpass.getuser(), "-o", "|".join(QUEUE_FIELDS.values())]

    def read_info(self, string: bytes | str) -> dict[str, dict[str, str]]:
        text = string.decode() if isinstance(string, bytes) else string
        rows = [dict(zip(QUEUE_FIELDS, (v.strip() for v in line.split("|")), strict=False))
                for line in text.splitlines()]
        listed = {r["JobID"]: r for r in rows}
        return {j: listed.get(j, {"JobID": j, "State": ENDED}) for j in self._registered - self._finished}

    def is_done(self, job_id: str, mode: str = "standard") -> bool:
        return self.get_state(job_id, mode=mode) not in LIVE | {"UNKNOWN"}  # UNKNOWN: not read yet


class SlurmJob(submitit.SlurmJob):
    """submitit's SLURM job, its state read from the queue."""

    watcher = QueueWatcher(delay_s=int(POLL_S))


class JobExecutor(submitit.SlurmExecutor):
    """submitit's SLURM executor, its jobs watched through the queue."""

    job_class = SlurmJob


class TaskError(Exception):
    """A task's error, raised again by its job as one line: the last line of the traceback submitit keeps of a
    failed job, where `found_in` finds it."""

    @classmethod
    def found_in(cls, text: str) -> str | None:
        mark = f"{cls.__module__}.{cls.__qualname__}: "
        lines = [line[len(mark):] for line in text.splitlines() if line.startswith(mark)]
        return lines[-1] if lines else None


class TaskJob(Checkpointable):
    """What a job runs: the task (`timed`), its ranks first set up from SLURM's environment when it has several;
    returns (result, CPU seconds, the job's own wall-clock seconds, without its wait in the queue). At a preemption
    or its time limit, submitit requeues it with the same arguments (`Checkpointable.checkpoint`): the task resumes
    from its own files."""

    def __call__(self, fn, kwargs: dict):
        if int(os.environ.get("SLURM_NTASKS", "1")) > 1:  # a training's ranks: RANK, WORLD_SIZE, MASTER_ADDR/PORT
            TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        t0 = time.time()
        try:
            result, cpu = timed(fn, kwargs)
        except Exception as exc:
            raise TaskError(f"{type(exc).__name__}: {' '.join(str(exc).split())}") from exc
        return result, cpu, time.time() - t0


def log_tail(job: SlurmJob, lines: int = 12) -> str:
    """The last lines of a job's logs (rank 0's error stream, then its output)."""
    text = []
    for log in (job.stderr(), job.stdout()):
        text += (log or "").splitlines()[-lines:]
    return "\n".join(text[-lines:])


def recorded(book: dict) -> dict[str, SlurmJob]:
    """{task: its job} of a job book's records (`phasekv.study.slurm.JobBook`): their states read together."""
    return {task: SlurmJob(folder=r["folder"], job_id=r["job_id"]) for task, r in book.items()}


class SlurmHandle:
    """The driver's handle of a job: done once its result is written or SLURM no longer runs it; its result, time
    and error are what submitit recorded of rank 0."""

    def __init__(self, job: SlurmJob):
        self.job = job.task(0)
        self.job_id = job.job_id

    def done(self) -> bool:
        return self.job.done()

    def result(self) -> tuple[object, float]:
        result, cpu, _ = self._outcome()
        return result, cpu

    def seconds(self) -> float:
        """Wall-clock seconds the job ran (as its task measured them)."""
        return self._outcome()[2]

    def cancel(self) -> None:
        self.job.cancel(check=False)

    def _outcome(self) -> tuple[object, float, float]:
        if not self.job.paths.result_pickle.exists():
            raise RuntimeError(f"job {self.job_id} ended without a result ({self.job.state.lower()}); its log "
                               f"({self.job.paths.stderr}): {log_tail(self.job, 3)}")
        try:
            return self.job.result()
        except FailedJobError as exc:
            raise RuntimeError(f"{TaskError.found_in(str(exc)) or 'it failed outside its task'} (job {self.job_id}, log "
                               f"{self.job.paths.stderr})") from None
