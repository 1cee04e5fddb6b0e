"""submitit's side of the SLURM executor without a cluster: the queue watcher's states (a job the queue no longer
lists has ended), and a task run as a job by submitit's local executor: its result, its time as the job recorded it
and a failed task's error as one line, read back through the driver's handle."""

import json
import os
import time
from pathlib import Path

import pytest

submitit = pytest.importorskip("submitit")

from phasekv.study.jobs import ENDED, LIVE, QueueWatcher, SlurmHandle, TaskError, TaskJob, recorded  # noqa: E402
from phasekv.study.slurm import JobBook  # noqa: E402
from phasekv.study.status import task_states  # noqa: E402

from .test_executor import _fake_slurm, _graph  # noqa: E402


def test_the_queue_watcher_reads_states_and_ends_what_it_no_longer_lists():
    w = QueueWatcher()
    assert w._make_command() is None  # nothing to watch: no `squeue`
    for jid in ("5", "6", "7"):
        w.register_job(jid)
    assert w._make_command()[:3] == ["squeue", "-h", "--states=all"]
    info = w.read_info(b"5|RUNNING|node1|None\n6|PENDING||Dependency\n9|COMPLETED|node1|None\n")
    assert info["5"] == {"JobID": "5", "State": "RUNNING", "NodeList": "node1", "Reason": "None"}
    assert info["6"]["Reason"] == "Dependency" and info["7"] == {"JobID": "7", "State": ENDED}
    assert "9" not in info  # another of this user's jobs
    w._info_dict.update(info)
    assert [w.is_done(j, mode="cache") for j in ("5", "6", "7")] == [False, False, True]
    assert not w.is_done("8", mode="cache")  # not read yet (UNKNOWN): not ended
    assert {"PENDING", "RUNNING", "REQUEUED", "PREEMPTED"} <= LIVE and "COMPLETED" not in LIVE


def test_task_error_is_found_in_the_trace_submitit_keeps():
    try:
        try:
            raise ValueError("planted\n  across lines")
        except ValueError as exc:
            raise TaskError("ValueError: planted across lines") from exc
    except TaskError:
        import traceback

        trace = traceback.format_exc()
    assert TaskError.found_in(f"a job failed with:\n{trace}\nsee its logs") == "ValueError: planted across lines"
    assert TaskError.found_in("Traceback ...\nKeyError: 'x'") is None


def _ok(seconds: float) -> dict:
    time.sleep(seconds)
    return {"slept": seconds}


def _broken() -> None:
    raise ValueError("planted failure")


def _local(tmp_path: Path, monkeypatch, fn, kwargs: dict) -> SlurmHandle:
    """`TaskJob` run by submitit's local executor (a process, as on a node) behind the driver's handle."""
    ex = submitit.LocalExecutor(folder=tmp_path / "jobs")
    ex.update_parameters(timeout_min=5)
    here = [str(p) for p in Path(__file__).parents[:3]]  # where pytest imported this module from, as it named it
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([*here, os.environ.get("PYTHONPATH", "")]))
    handle = SlurmHandle(ex.submit(TaskJob(), fn, kwargs))
    end = time.time() + 120
    while not handle.done() and time.time() < end:
        time.sleep(0.2)
    return handle


def test_a_job_reads_back_its_result_and_its_own_time(tmp_path, monkeypatch):
    handle = _local(tmp_path, monkeypatch, _ok, {"seconds": 0.5})
    result, cpu = handle.result()
    assert result == {"slept": 0.5} and cpu >= 0
    assert 0.5 <= handle.seconds() < 60  # the task's wall-clock time, as the job recorded it
    assert handle.seconds() == handle.seconds() and handle.result() == (result, cpu)  # reading twice: the same


def test_a_failed_task_is_one_line_naming_its_job_and_log(tmp_path, monkeypatch):
    handle = _local(tmp_path, monkeypatch, _broken, {})
    with pytest.raises(RuntimeError) as err:
        handle.result()
    msg = str(err.value)
    assert msg.startswith(f"ValueError: planted failure (job {handle.job_id}, log ") and "\n" not in msg
    assert msg.endswith(f"{handle.job.paths.stderr})")


def test_status_of_a_job_the_queue_no_longer_lists(tmp_path, monkeypatch):
    """A recorded job that is not done and that SLURM no longer lists has ended: failed, with its log's last lines."""
    _fake_slurm(tmp_path, monkeypatch, "21|RUNNING|node2|None\\n")
    folder = tmp_path / "slurm" / "b"
    folder.mkdir(parents=True)
    (folder / "20_0_log.out").write_text("step 10\nKilled\n")
    JobBook(tmp_path).record("b", "20", folder)
    JobBook(tmp_path).record("c", "21", tmp_path / "slurm" / "c")
    states = {s.task: s for s in task_states(_graph(tmp_path), tmp_path)}
    assert (states["b"].state, states["b"].job) == ("failed", "20") and states["b"].detail == "ended; step 10\nKilled"
    assert (states["c"].state, states["c"].detail) == ("running", "node2")
    assert set(recorded(json.loads((tmp_path / "jobs.json").read_text()))) == {"b", "c"}
