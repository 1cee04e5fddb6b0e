"""Where each task of a study stands: done / running (job id, node) / queued (job id, why) / failed (its log's last
lines) / not submitted, from the study's files, the jobs it recorded (OUT/jobs.json) and SLURM's queue."""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from phasekv.study.graph import Task
from phasekv.study.slurm import LIVE, JobBook, log_tail, queue

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
    known = queue([r["job_id"] for r in book.values()]) if book and shutil.which("squeue") else {}
    out = []
    for t in tasks:
        rec = book.get(t.name, {})
        jid = rec.get("job_id", "")
        q = known.get(jid, {})
        if t.is_done():
            out.append(TaskState(t.name, "done", jid))
        elif q.get("state") == "RUNNING":
            out.append(TaskState(t.name, "running", jid, q["node"]))
        elif q.get("state") in LIVE:
            out.append(TaskState(t.name, "queued", jid, f"{q['state'].lower()} ({q['reason']})"))
        elif rec:
            state = q.get("state", "ended").lower()
            out.append(TaskState(t.name, "failed", jid, f"{state}; {log_tail(rec['folder'], jid)}".strip("; ")))
        elif t.name in (failed or {}):
            out.append(TaskState(t.name, "failed", "", failed[t.name]))
        else:
            out.append(TaskState(t.name, "not submitted"))
    return out
