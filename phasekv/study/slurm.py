"""The SLURM executor: each task of the graph a SLURM job, submitted through submitit.

A task is submitted as soon as the tasks it needs are submitted, with SLURM's dependency `afterok` on their jobs
(`Executor.chains`): the scheduler starts it once they have succeeded, so the whole graph can be queued and the
driver may leave (without --wait) or stay and show progress (--wait); `--kill-on-invalid-dep` makes SLURM drop the
jobs behind a failed one. The study's state is its files plus the job ids recorded in OUT/jobs.json (`JobBook`): a
restarted driver waits for the jobs still queued or running and submits only what is neither done nor queued.

Every job runs `phasekv.study.jobs.TaskJob`, a submitit `Checkpointable`: at a preemption or its time limit
(SIGUSR2, `signal_delay_s` before it) submitit requeues it with the same arguments and the task resumes from its files
(a training from its latest checkpoint, bit for bit: `phasekv.train.resume`). A training's ranks (nodes x ranks per
node) take their rank, world size and master address from SLURM's environment (submitit's
`TorchDistributedEnvironment`). Jobs, their states, results and logs are submitit's (`phasekv.study.jobs`, imported
only here: submitit is the optional `cluster` extra).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from phasekv.errors import ConfigError
from phasekv.io import write_json
from phasekv.study.executor import Executor

if TYPE_CHECKING:
    from phasekv.study.jobs import SlurmHandle

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


class SlurmExecutor(Executor):
    """Each task a SLURM job in OUT/slurm/<task>/ (its sbatch script, logs, pickles), named '<label>-<task>'."""

    chains = True

    def __init__(self, root: Path, options: SlurmOptions, label: str = "study"):
        from phasekv.study import jobs  # submitit: an optional dependency (the `cluster` extra)

        self.jobs, self.root, self.options, self.label = jobs, Path(root).absolute(), options, label
        self.book, self.waits = JobBook(self.root), options.wait
        self.live: dict[str, SlurmHandle] | None = None  # {task: handle} of the jobs an earlier driver left queued or running

    def submit(self, task, after: list[SlurmHandle]) -> SlurmHandle:
        folder = self.root / "slurm" / slug(task.name)
        ex = self.jobs.JobExecutor(folder=folder, max_num_timeout=MAX_REQUEUES)
        params = self.options.resources(task.parallel)
        if after:
            params["dependency"] = "afterok:" + ":".join(h.job_id for h in after)
        ex.update_parameters(job_name=f"{self.label}-{slug(task.name)}", **params)
        try:
            job = ex.submit(self.jobs.TaskJob(), task.fn, task.kwargs)
        except self.jobs.FailedJobError as exc:  # sbatch refused the job (its resources, say)
            raise ConfigError(f"SLURM refused the job of {task.name!r}: {' '.join(str(exc).split())}") from None
        self.book.record(task.name, job.job_id, folder)
        return self.jobs.SlurmHandle(job)

    def attach(self, task) -> SlurmHandle | None:
        if self.live is None:  # the recorded jobs SLURM still queues or runs, read once (one `squeue`)
            recorded = self.jobs.recorded(self.book.read())
            self.live = {t: self.jobs.SlurmHandle(j) for t, j in recorded.items() if j.state in self.jobs.LIVE}
        return self.live.get(task.name)

    def seconds(self, handle: SlurmHandle, submitted: float) -> float:
        return handle.seconds()

    def cancel(self, handle: SlurmHandle) -> None:
        handle.cancel()
