"""The executor seam without a cluster: a fake scheduler that chains tasks, a restarted driver, the status of each
task from recorded jobs and a stand-in `squeue`, the jobs' resources, and bad input refused before anything runs."""

import json
import os
from pathlib import Path

import pytest

from phasekv.errors import ConfigError
from phasekv.study import Executor, Task, run_tasks
from phasekv.study.slurm import JobBook, SlurmOptions, check
from phasekv.study.status import task_states
from tests.reliability.helpers import run_cli


class FakeHandle:
    def __init__(self, name: str, fail: bool = False):
        self.name, self.fail, self.finished, self.cancelled = name, fail, False, False

    def done(self) -> bool:
        return self.finished

    def result(self):
        if self.fail:
            raise RuntimeError(f"{self.name} broke")
        return {}, 0.0


class FakeScheduler(Executor):
    """Chains like SLURM: every submitted task is a handle; `finish` ends them in submission order."""

    chains = True

    def __init__(self, waits: bool, live: dict | None = None, failing: tuple = ()):
        self.waits, self.live, self.failing = waits, live or {}, failing
        self.submitted: list[tuple[str, list[str]]] = []
        self.handles: list[FakeHandle] = []

    def submit(self, task, after):
        self.submitted.append((task.name, [h.name for h in after]))
        self.handles.append(FakeHandle(task.name, task.name in self.failing))
        return self.handles[-1]

    def attach(self, task):
        return self.live.get(task.name)

    def wait(self, handles, timeout):
        first = next(h for h in [*self.live.values(), *self.handles] if h in handles)  # in SLURM's order
        first.finished = True
        return [first]

    def cancel(self, handle):
        handle.cancelled = True


def _graph(root: Path) -> list[Task]:
    done = root / "a.done"
    return [Task("a", print, {}, done.exists), Task("b", print, {}, lambda: False, after=["a"]),
            Task("c", print, {}, lambda: False, after=["b"]), Task("d", print, {}, lambda: False)]


def test_a_scheduler_gets_the_whole_graph_with_dependencies(tmp_path):
    """Without --wait every task is submitted at once, each after the jobs of the tasks it needs; nothing that is
    done is submitted again."""
    (tmp_path / "a.done").write_text("")
    ex = FakeScheduler(waits=False)
    assert run_tasks(_graph(tmp_path), 1, False, lambda *a: None, executor=ex) == {}
    assert ex.submitted == [("b", []), ("c", ["b"]), ("d", [])]


def test_a_restarted_driver_waits_for_live_jobs_instead_of_resubmitting(tmp_path):
    queued = FakeHandle("a")
    ex = FakeScheduler(waits=True, live={"a": queued})
    ran = []
    assert run_tasks(_graph(tmp_path), 1, False, lambda name, *a: ran.append(name), executor=ex) == {}
    assert [n for n, _ in ex.submitted] == ["b", "c", "d"] and ex.submitted[0] == ("b", ["a"])
    assert queued.finished and ran == ["a", "b", "c", "d"]


def test_jobs_behind_a_failed_task_are_withdrawn(tmp_path):
    ex = FakeScheduler(waits=True, failing=("b",))
    failed = run_tasks(_graph(tmp_path), 1, False, lambda *a: None, executor=ex)
    assert failed == {"b": "RuntimeError: b broke", "c": "skipped: a task it needs failed"}
    c = next(h for h in ex.handles if h.name == "c")
    assert c.cancelled and not c.finished


def test_resources_ask_for_no_gpu_without_gpus():
    cpu = SlurmOptions(time=30)
    assert cpu.resources(True)["gpus_per_node"] is None and cpu.resources(False)["gpus_per_node"] is None
    assert cpu.resources(True)["ntasks_per_node"] == 1 and cpu.resources(True)["time"] == 30
    gpu = SlurmOptions(nodes=2, gpus_per_node=8, params={"account": "proj"})
    train, ev = gpu.resources(True), gpu.resources(False)
    assert (train["nodes"], train["ntasks_per_node"], train["gpus_per_node"]) == (2, 8, 8)
    assert (ev["nodes"], ev["ntasks_per_node"], ev["gpus_per_node"]) == (1, 1, 1)
    assert train["additional_parameters"] == {"kill-on-invalid-dep": "yes", "account": "proj"}
    assert SlurmOptions(ranks_per_node=2).resources(True)["ntasks_per_node"] == 2


def _fake_slurm(tmp_path: Path, monkeypatch, squeue: str = "") -> None:
    """`sinfo` with one partition (debug, the default) and an `squeue` printing `squeue`, first on PATH."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "sinfo").write_text("#!/bin/sh\necho 'debug*'\n")
    (bin_ / "squeue").write_text(f"#!/bin/sh\nprintf '{squeue}'\n")
    for f in bin_.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}{os.pathsep}{os.environ['PATH']}")


def test_status_of_each_task(tmp_path, monkeypatch):
    _fake_slurm(tmp_path, monkeypatch, "11|RUNNING|node7|None\\n12|PENDING||Dependency\\n13|FAILED|node7|NonZeroExitCode\\n")
    (tmp_path / "a.done").write_text("")
    folder = tmp_path / "slurm" / "c"
    folder.mkdir(parents=True)
    (folder / "13_0_log.err").write_text("Traceback ...\nValueError: planted\n")
    book = JobBook(tmp_path)
    for task, jid in (("a", "10"), ("b", "11"), ("c", "13"), ("e", "12")):
        book.record(task, jid, tmp_path / "slurm" / task)
    tasks = _graph(tmp_path) + [Task("e", print, {}, lambda: False), Task("f", print, {}, lambda: False)]
    states = {s.task: s for s in task_states(tasks, tmp_path, failed={"f": "ValueError: local"})}
    assert (states["a"].state, states["a"].job) == ("done", "10")
    assert (states["b"].state, states["b"].job, states["b"].detail) == ("running", "11", "node7")
    assert states["c"].state == "failed" and "ValueError: planted" in states["c"].detail
    assert states["d"].state == "not submitted"
    assert states["e"].state == "queued" and "Dependency" in states["e"].detail
    assert (states["f"].state, states["f"].detail) == ("failed", "ValueError: local")


def test_bad_cluster_input_is_one_line_and_submits_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no SLURM
    with pytest.raises(ConfigError, match=r"^--executor slurm: no SLURM here \(sinfo not found on PATH\)$"):
        check(SlurmOptions(), tmp_path / "s", "cpu")
    _fake_slurm(tmp_path, monkeypatch)
    check(SlurmOptions(partition="debug"), tmp_path / "s", "cpu")
    with pytest.raises(ConfigError, match="--slurm-partition 'gpu' is not a partition of this cluster \\(debug\\)"):
        check(SlurmOptions(partition="gpu"), tmp_path / "s", "cpu")
    with pytest.raises(ConfigError, match="does not exist \\(the study directory must be on a file system every"):
        check(SlurmOptions(), tmp_path / "nowhere" / "s", "cpu")
    with pytest.raises(ConfigError, match="--slurm-gpus-per-node 4 needs --device cuda"):
        check(SlurmOptions(gpus_per_node=4), tmp_path / "s", "cpu")
    code, out, err = run_cli("demo", "--quick", "--executor", "slurm", "--slurm-partition", "gpu", "--out",
                             tmp_path / "d")
    assert code == 2 and (out + err).strip().count("\n") == 0 and "not a partition" in err
    assert not (tmp_path / "d").exists()


def test_status_command(tmp_path):
    code, out, err = run_cli("study", "status", tmp_path)
    assert code == 2 and "holds no study" in err
    from phasekv.demo.plan import plan_for
    from phasekv.demo.runner import _manifest, _write_manifest

    _write_manifest(tmp_path, {**_manifest(tmp_path, plan_for(quick=True), 2), "failed": {}})
    code, out, err = run_cli("study", "status", tmp_path)
    assert code == 0, err
    assert "train w8s8-1kv" in out and "0 done, 0 running, 0 queued, 0 failed" in out
    assert json.loads((tmp_path / "demo.json").read_text())["kind"] == "demo"


def test_dry_run_prices_the_grid(tmp_path):
    """The task graph with resources and GPU-hours, nothing written (the qwen3-0.6b preset, the paper's shape, costs
    ~2 s a model to count on the meta device: test_dry_run_at_the_papers_shape, slow)."""
    code, out, err = run_cli("study", "--quick", "--dry-run", "--executor", "slurm", "--slurm-time", "30",
                             "--out", tmp_path / "s")
    assert code == 0, err
    assert "train w8s8-1kv" in out and "1 CPU(s), 30 min" in out and "26 models" in out
    assert "at the paper's budget (1e+11 tokens per model)" in out and not (tmp_path / "s").exists()


@pytest.mark.slow
def test_dry_run_at_the_papers_shape():
    """6·N·D at ~0.6B parameters and 100B tokens: ~1e22 FLOPs for the 26 models (SPEC's estimate)."""
    from phasekv.demo.cost import GPU, PAPER_TOKENS, training_cost
    from phasekv.demo.plan import study_plan

    cost = training_cost(study_plan(False, "qwen3-0.6b"), GPU(), PAPER_TOKENS)
    assert len(cost) == 26 and 0.9e22 < sum(c["flops"] for c in cost.values()) < 1.1e22


def test_sweep_lines_for_slurm_need_no_master_addr_and_no_gpu(tmp_path):
    """`sweep commands --slurm`: the job's shell finds its first node (SLURM sets no $MASTER_ADDR); a GPU is asked
    for only with --gpus; a sweep's runs are tasks of one graph (what --submit and --executor slurm submit)."""
    from phasekv.train import sweep

    f = tmp_path / "s.toml"
    f.write_text('[defaults]\npreset = "tiny"\nsteps = 3\nout_root = "runs"\n[[run]]\narch = "W8/S8 · 1 KV"\n')
    code, out, err = run_cli("sweep", "commands", f, "--nproc", "2", "--nnodes", "2", "--slurm")
    assert code == 0, err
    assert "scontrol show hostnames $SLURM_JOB_NODELIST" in out and "MASTER_ADDR" not in out
    assert "--gpus-per-node" not in out
    code, out, err = run_cli("sweep", "commands", f, "--nproc", "2", "--slurm", "--gpus")
    assert "--gpus-per-node 2" in out
    (task,) = sweep.sweep_tasks(sweep.load_sweep(f), progress=False)
    assert task.name == "train w8s8-1kv" and task.parallel and task.fn is sweep.train_run and not task.is_done()


def test_device_is_checked_before_anything_runs(tmp_path):
    code, out, err = run_cli("demo", "--quick", "--device", "tpu", "--out", tmp_path / "d")
    assert code == 2 and "--device 'tpu' must be cpu, cuda or cuda:N" in err and not (tmp_path / "d").exists()
    import torch

    if not torch.cuda.is_available():
        code, out, err = run_cli("demo", "--quick", "--device", "cuda", "--out", tmp_path / "d")
        assert code == 2 and "--device cuda: no CUDA device on this machine" in err and not (tmp_path / "d").exists()


def test_every_model_stage_gets_the_device(tmp_path):
    from phasekv.demo import stages
    from phasekv.demo.plan import plan_for
    from phasekv.demo.runner import build_tasks

    tasks = build_tasks(tmp_path, plan_for(quick=True), device="cuda:1")
    on = [t for t in tasks if t.fn in stages.ON_DEVICE]
    assert {t.fn for t in on} == stages.ON_DEVICE - {stages.family}  # the family stage: --family plans only
    assert all(t.kwargs["device"] == "cuda:1" for t in on)
    assert all("device" not in t.kwargs for t in tasks if t.fn not in stages.ON_DEVICE)
    assert stages.train_config(plan_for(quick=True), "W8/S8 · 1 KV", str(tmp_path), "cuda:1").device == "cuda:1"
