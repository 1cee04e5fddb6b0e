"""Where each task of a study stands: done / running (job id, node) / queued (job id, why) / failed (its log's last
lines) / not submitted, from the study's files, the jobs it recorded (OUT/jobs.json) and SLURM's queue (submitit's
jobs, `phasekv.study.jobs`, read only where jobs were recorded)."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from phasekv.study.graph import Task
from phasekv.study.slurm import JobBook

STATES = ("done", "running", "queued", "failed", "not submitted")  # in the order `phasekv study status` counts them


@dataclass
class TaskState:
    task: str  # the task's name
    state: str  # one of STATES
    job: str = ""  # its latest job's id, if it was submitted to SLURM
    detail: str = ""  # the node it runs on, why it waits, or the end of its log (failed)


def task_states(tasks: list[Task], root: Path, failed: dict[str, str] | None = None) -> list[TaskState]:
    """Each task's state; `failed`: errors an earlier driver recorded ({task: message}, the manifest's), the
    reason of a failed task that has no job log."""
    book = JobBook(root).read()
    jobs, queued = {}, False
    if book:  # jobs were submitted, so submitit is here
        from phasekv.study import jobs as slurm

        jobs, queued = slurm.recorded(book), shutil.which("squeue") is not None
    out = []
    for t in tasks:
        job = jobs.get(t.name)
        q = job.get_info(mode="standard") if job is not None and queued else {}
        state = q.get("State", "")
        if t.is_done():
            out.append(TaskState(t.name, "done", job.job_id if job else ""))
        elif state == "RUNNING":
            out.append(TaskState(t.name, "running", job.job_id, q["NodeList"]))
        elif jobs and state in slurm.LIVE:
            out.append(TaskState(t.name, "queued", job.job_id, f"{state.lower()} ({q['Reason']})"))
        elif job is not None:
            detail = f"{(state or slurm.ENDED).lower()}; {slurm.log_tail(job)}".strip("; ")
            out.append(TaskState(t.name, "failed", job.job_id, detail))
        elif t.name in (failed or {}):
            out.append(TaskState(t.name, "failed", "", failed[t.name]))
        else:
            out.append(TaskState(t.name, "not submitted"))
    return out
