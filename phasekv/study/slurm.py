"""The SLURM executor: each task of the graph a SLURM job, submitted through submitit.

A task is submitted as soon as the tasks it needs are submitted, with SLURM's dependency `afterok` on their jobs
(`Executor.chains`): the scheduler starts it once they have succeeded, so the whole graph can be queued and the
driver may leave (without --wait) or stay and show progress (--wait); `--kill-on-invalid-dep` makes SLURM drop the
jobs behind a failed one. The study's state is its files plus the job ids recorded in OUT/jobs.json (`JobBook`): a
restarted driver waits for the jobs still queued or running and submits only what is neither done nor queued.

Every job runs `TaskJob`, a submitit `Checkpointable`: at a preemption or its time limit (SIGUSR2, `signal_delay_s`
before it) submitit requeues it with the same arguments and the task resumes from its files (a training from its
latest checkpoint, bit for bit: `phasekv.train.resume`). A training's ranks (nodes x ranks per node) take their rank,
world size and master address from SLURM's environment (submitit's `TorchDistributedEnvironment`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

from phasekv.errors import ConfigError
from phasekv.io import write_json
from phasekv.study.executor import Executor, timed

LIVE = {"PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",
        "SUSPENDED", "SIGNALING", "STAGE_OUT", "PREEMPTED"}  # states of a job SLURM may still run (or run again)
POLL_S = 5.0  # seconds between two looks at SLURM's queue (`squeue`) while the driver waits
MAX_REQUEUES = 100  # time-limit requeues of one job (a training split into --slurm-time pieces); preemptions unlimited


@dataclass
class SlurmOptions:
    """What every job asks SLURM for (`--slurm-*` options)."""

    partition: str | None = None  # partition of every job (None: the cluster's default)
    nodes: int = 1  # nodes of a training job (its ranks span them)
    gpus_per_node: int = 0  # GPUs of a training job per node, one rank each; an evaluation job gets one (0: CPUs only)
    ranks_per_node: int | None = None  # ranks of a training per node (None: gpus_per_node, or 1 without GPUs)
    cpus_per_task: int = 1  # CPU cores of each rank (a task's torch threads)
    time: int = 60  # minutes of each job; a job at its limit is requeued and resumes (trainings: from a checkpoint)
    signal_delay_s: int = 90  # seconds before the limit at which a job is signalled to requeue itself
    params: dict = field(default_factory=dict)  # any further sbatch parameter (`--slurm-param KEY=VALUE`)
    wait: bool = False  # the driver stays until the graph is done (progress bars; the report at the end)

    def ranks(self) -> int:
        return self.ranks_per_node or max(self.gpus_per_node, 1)

    def resources(self, parallel: bool) -> dict:
        """submitit's `SlurmExecutor` parameters of a training job (`parallel`) or of any other task's job: no
        GPU request at all without GPUs (a `gres` of 0 is rejected by clusters without GPUs)."""
        gpus = (self.gpus_per_node if parallel else min(self.gpus_per_node, 1)) or None
        own = dict(nodes=self.nodes, ntasks_per_node=self.ranks()) if parallel else dict(nodes=1, ntasks_per_node=1)
        return dict(own, gpus_per_node=gpus, cpus_per_task=self.cpus_per_task, time=self.time,
                    signal_delay_s=self.signal_delay_s, partition=self.partition,
                    additional_parameters={"kill-on-invalid-dep": "yes", **self.params})


def _slurm(*argv: str) -> str:
    """Output of a SLURM command; no SLURM reachable is a one-line error."""
    if shutil.which(argv[0]) is None:
        raise ConfigError(f"--executor slurm: no SLURM here ({argv[0]} not found on PATH)")
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if r.returncode:
        msg = " ".join((r.stderr or r.stdout).split()) or f"exit code {r.returncode}"
        raise ConfigError(f"--executor slurm: SLURM is not reachable ({' '.join(argv[:2])}: {msg})")
    return r.stdout


def check(options: SlurmOptions, root: Path, device: str) -> None:
    """Refuse, before anything is submitted, what no job could run with: no SLURM, an unknown partition, a study
    directory whose parent does not exist (it must be on a file system every node mounts), GPUs on the CPU."""
    partitions = [p.rstrip("*") for p in _slurm("sinfo", "-h", "-o", "%P").split()]
    if options.partition and options.partition not in partitions:
        raise ConfigError(f"--slurm-partition {options.partition!r} is not a partition of this cluster "
                          f"({', '.join(partitions) or 'none'})")
    if not root.absolute().parent.is_dir():
        raise ConfigError(f"--out {root}: its directory {root.absolute().parent} does not exist (the study directory "
                          "must be on a file system every node mounts)")
    if options.gpus_per_node and not device.startswith("cuda"):
        raise ConfigError(f"--slurm-gpus-per-node {options.gpus_per_node} needs --device cuda (got {device})")
    if device.startswith("cuda") and not options.gpus_per_node:
        raise ConfigError(f"--device {device} needs --slurm-gpus-per-node >= 1")
    for name in ("nodes", "cpus_per_task", "time"):
        if getattr(options, name) < 1:
            raise ConfigError(f"--slurm-{name.replace('_', '-')} must be >= 1, got {getattr(options, name)}")


def queue(job_ids: list[str]) -> dict[str, dict]:
    """{job id: {"state", "node", "reason"}} of the jobs SLURM still knows (finished ones for `MinJobAge` seconds)."""
    if not job_ids:
        return {}
    r = subprocess.run(["squeue", "-h", "--states=all", "-o", "%i|%T|%N|%r", "-j", ",".join(job_ids)],
                       capture_output=True, text=True, timeout=60)
    out = {}
    for line in r.stdout.splitlines():
        jid, state, node, reason = (line.split("|") + ["", "", ""])[:4]
        out[jid.strip()] = {"state": state.strip(), "node": node.strip(), "reason": reason.strip()}
    return out


def slug(task_name: str) -> str:
    """A task's name as a job name and a directory name: 'train w8s8-1kv' -> 'train-w8s8-1kv'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", task_name).strip("-")


class JobBook:
    """OUT/jobs.json: {task: {"job_id", "folder", "submitted"}} of every job submitted for the study's tasks (the
    latest per task): with the study's files, the whole state of a study on a cluster."""

    def __init__(self, root: Path):
        self.path = root / "jobs.json"

    def read(self) -> dict:
        return json.loads(self.path.read_text()) if self.path.is_file() else {}

    def record(self, task: str, job_id: str, folder: Path) -> None:
        jobs = self.read()
        jobs[task] = {"job_id": job_id, "folder": str(folder),
                      "submitted": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
        write_json(self.path, jobs, indent=1)


def log_tail(folder: str | Path, job_id: str, lines: int = 12) -> str:
    """The last lines of a job's logs (rank 0's error stream, then its output)."""
    text = []
    for suffix in ("log.err", "log.out"):
        path = Path(folder) / f"{job_id}_0_{suffix}"
        if path.is_file():
            text += path.read_text(errors="replace").splitlines()[-lines:]
    return "\n".join(text[-lines:])


class TaskJob:
    """What a job runs: the task (`timed`), its ranks first set up from SLURM's environment when it has several.
    A submitit `Checkpointable`, so a preempted or timed-out job is requeued with the same arguments."""

    def __call__(self, fn, kwargs: dict):
        if int(os.environ.get("SLURM_NTASKS", "1")) > 1:  # a training's ranks: RANK, WORLD_SIZE, MASTER_ADDR/PORT
            from submitit.helpers import TorchDistributedEnvironment

            TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
        t0 = time.time()
        result, cpu = timed(fn, kwargs)
        return result, cpu, time.time() - t0  # the job's own wall-clock time, without its wait in the queue

    def checkpoint(self, fn, kwargs: dict):
        from submitit.helpers import DelayedSubmission

        return DelayedSubmission(self, fn, kwargs)  # the task resumes from its own files


class SlurmHandle:
    """A submitted job: done once its result is written or SLURM no longer runs it (`SlurmExecutor.wait`)."""

    def __init__(self, job_id: str, folder: Path):
        self.job_id, self.folder = job_id, Path(folder)
        self.gone = False  # SLURM no longer holds it as queued or running
        self.seconds = 0.0  # wall-clock seconds it ran (known with its result)

    def done(self) -> bool:
        return self.gone or (self.folder / f"{self.job_id}_0_result.pkl").is_file()

    def result(self):
        import submitit

        if not (self.folder / f"{self.job_id}_0_result.pkl").is_file():
            raise RuntimeError(f"job {self.job_id} ended without a result; its log ({self.folder}): "
                               f"{log_tail(self.folder, self.job_id, 3)}")
        try:
            result, cpu, self.seconds = submitit.SlurmJob(folder=self.folder, job_id=self.job_id, tasks=[0]).result()
            return result, cpu
        except submitit.core.utils.FailedJobError as exc:  # the task's own error: its traceback's last line
            parts = str(exc).split("-" * 22)
            trace = [line for line in (parts[1] if len(parts) > 2 else str(exc)).splitlines() if line.strip()]
            raise RuntimeError(f"{trace[-1].strip()} (job {self.job_id}, log {self.folder}/{self.job_id}_0_log.err)") \
                from None


class SlurmExecutor(Executor):
    """Each task a SLURM job in OUT/slurm/<task>/ (its sbatch script, logs, pickles), named '<label>-<task>'."""

    chains = True

    def __init__(self, root: Path, options: SlurmOptions, label: str = "study"):
        import submitit  # an optional dependency (the `cluster` extra)

        self.submitit, self.root, self.options, self.label = submitit, Path(root).absolute(), options, label
        self.book, self.waits, self.last_poll = JobBook(self.root), options.wait, 0.0
        self.live: dict | None = None  # {task: its job's record} of the jobs an earlier driver left queued or running

    def submit(self, task, after: list[SlurmHandle]) -> SlurmHandle:
        folder = self.root / "slurm" / slug(task.name)
        ex = self.submitit.SlurmExecutor(folder=folder, max_num_timeout=MAX_REQUEUES)
        params = self.options.resources(task.parallel)
        if after:
            params["dependency"] = "afterok:" + ":".join(h.job_id for h in after)
        ex.update_parameters(job_name=f"{self.label}-{slug(task.name)}", **params)
        try:
            job = ex.submit(TaskJob(), task.fn, task.kwargs)
        except self.submitit.core.utils.FailedJobError as exc:  # sbatch refused the job (its resources, say)
            raise ConfigError(f"SLURM refused the job of {task.name!r}: {' '.join(str(exc).split())}") from None
        self.book.record(task.name, job.job_id, folder)
        return SlurmHandle(job.job_id, folder)

    def attach(self, task) -> SlurmHandle | None:
        if self.live is None:  # the recorded jobs SLURM still queues or runs, read once (one `squeue`)
            book = self.book.read()
            known = queue([r["job_id"] for r in book.values()])
            self.live = {t: r for t, r in book.items() if known.get(r["job_id"], {}).get("state") in LIVE}
        rec = self.live.get(task.name)
        return SlurmHandle(rec["job_id"], rec["folder"]) if rec else None

    def wait(self, handles: list[SlurmHandle], timeout: float) -> list[SlurmHandle]:
        """Results appear as files; SLURM's queue is read every POLL_S seconds for jobs that ended without one."""
        done = [h for h in handles if h.done()]
        if not done and time.time() - self.last_poll >= POLL_S:
            self.last_poll = time.time()
            known = queue([h.job_id for h in handles])
            for h in handles:
                h.gone = known.get(h.job_id, {}).get("state", "GONE") not in LIVE
            done = [h for h in handles if h.done()]
        if not done:
            time.sleep(timeout)
        return done

    def seconds(self, handle: SlurmHandle, submitted: float) -> float:
        return handle.seconds

    def cancel(self, handle: SlurmHandle) -> None:
        subprocess.run(["scancel", handle.job_id], capture_output=True, timeout=60)
