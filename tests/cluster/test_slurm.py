"""The task graph on a real one-node SLURM (`make test-cluster`; tests/cluster/slurm.sh starts it, as root): every
task a job (job ids recorded, logs beside the run) with the same results as the local pool; a training signalled
at its time limit is requeued and ends with the weights of an uninterrupted run; two ranks of one training from
SLURM's environment give torchrun's loss curve; bad input is one line and submits nothing."""

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from phasekv.demo import stages
from phasekv.demo.plan import plan_for
from phasekv.demo.runner import build_tasks, run_plan
from phasekv.study import run_tasks
from phasekv.study.slurm import SlurmExecutor, SlurmOptions
from phasekv.train.checkpoint import latest_checkpoint
from tests.reliability.helpers import ROOT, run_cli

pytestmark = pytest.mark.cluster
HERE = Path(__file__).parent
PLAN = dataclasses.replace(plan_for(quick=True), models=["Full attention · 1 KV", "W8/S8 · 1 KV"], steps=10)
ARCH = "W8/S8 · 1 KV"


@pytest.fixture(scope="module")
def slurm(tmp_path_factory):
    """A one-node SLURM in a temporary directory, its daemons stopped (by their pids) at the end."""
    d = tmp_path_factory.mktemp("slurm")
    t0 = time.time()
    subprocess.run(["bash", str(HERE / "slurm.sh"), "up", str(d)], check=True)
    mp = pytest.MonkeyPatch()
    mp.setenv("SLURM_CONF", str(d / "slurm.conf"))
    mp.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))  # jobs import this tree
    print(f"\n[cluster] one-node SLURM up in {time.time() - t0:.0f} s:\n" + subprocess.run(
        ["sinfo"], capture_output=True, text=True).stdout)
    yield d
    mp.undo()
    subprocess.run(["bash", str(HERE / "slurm.sh"), "down", str(d)], check=True)


def _summaries(root: Path) -> dict[str, dict]:
    """Every stage's summary.json under `root`, its paths relative to `root`, without how and when it was made
    (provenance) and what the machine's speed decides (timings, the comparison's measured costs)."""
    drop = ("provenance", "second", "time", "per_s", "cost")

    def scrub(x):
        if isinstance(x, dict):
            return {k: scrub(v) for k, v in x.items() if not any(w in k for w in drop)}
        return [scrub(v) for v in x] if isinstance(x, list) else x

    return {str(p.relative_to(root)): scrub(json.loads(p.read_text().replace(str(root), "OUT")))
            for p in sorted(root.rglob("summary.json"))}


def _weights(run: Path) -> dict:
    return load_file(latest_checkpoint(run) / "model.safetensors")


def test_plan_on_slurm_equals_local(slurm, tmp_path):
    local, cluster = tmp_path / "local", tmp_path / "slurm"
    t0 = time.time()
    run_plan(local, PLAN, progress=False)
    t1 = time.time()
    run_plan(cluster, PLAN, progress=False, report=False, cluster=SlurmOptions(time=20))  # queue the graph, leave
    queued = json.loads((cluster / "jobs.json").read_text())
    tasks = build_tasks(cluster, PLAN)
    assert set(queued) == {t.name for t in tasks}  # every task a job, queued at once (afterok on its inputs)
    code, out, err = run_cli("study", "status", cluster)
    assert code == 0 and "queued" in out, out + err
    print(f"[cluster] queued {len(queued)} jobs in {time.time() - t1:.0f} s; status:\n{out}")
    run_plan(cluster, PLAN, progress=True, cluster=SlurmOptions(wait=True, time=20))  # a new driver, then the report
    print(f"[cluster] local pool {t1 - t0:.0f} s, SLURM {time.time() - t1:.0f} s")
    jobs = json.loads((cluster / "jobs.json").read_text())
    assert jobs == queued  # the second driver waited for the queued jobs: nothing was submitted twice
    for name, rec in jobs.items():
        folder = Path(rec["folder"])
        assert folder.parent == cluster / "slurm" and (folder / f"{rec['job_id']}_0_log.out").is_file(), name
        assert (folder / f"{rec['job_id']}_0_result.pkl").is_file(), name
    print("[cluster] jobs: " + ", ".join(f"{n} = {r['job_id']}" for n, r in jobs.items()))
    for alias in ("full-1kv", "w8s8-1kv"):
        a, b = (_weights(r / "runs" / alias) for r in (local, cluster))
        assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a), alias
    same = _summaries(local)
    assert len(same) >= 10 and _summaries(cluster) == same
    verdicts = [json.loads((r / "report" / "claims.json").read_text().replace(str(r), "OUT")) for r in (local, cluster)]
    assert verdicts[0] == verdicts[1]
    print(f"[cluster] equal to the local pool: both models' weights, {len(same)} summaries, the report's "
          f"{len(verdicts[0])} verdicts")
    code, out, err = run_cli("study", "status", cluster)
    assert code == 0 and f"{len(tasks)} done, 0 running, 0 queued, 0 failed, 0 not submitted" in out, out + err


def _wait_step(run: Path, step: int, timeout: float) -> None:
    end = time.time() + timeout
    while time.time() < end:
        lines = (run / "metrics.jsonl").read_text().splitlines() if (run / "metrics.jsonl").is_file() else []
        if lines and json.loads(lines[-1]).get("step", 0) >= step:
            return
        time.sleep(1)
    raise TimeoutError(f"{run} did not reach step {step}")


def test_a_requeued_training_ends_with_the_weights_of_an_uninterrupted_one(slurm, tmp_path):
    plan = dataclasses.replace(PLAN, steps=40, ckpt_every=10)
    stages.train_model(plan.to_dict(), ARCH, str(tmp_path / "ref"))
    (task,) = [t for t in build_tasks(tmp_path / "s", plan) if t.name == "train w8s8-1kv"]
    (tmp_path / "s").mkdir()
    with SlurmExecutor(tmp_path / "s", SlurmOptions(wait=True, time=20)) as ex:
        handle = ex.submit(task, [])
        _wait_step(tmp_path / "s" / "runs" / "w8s8-1kv", 15, 600)
        # what SLURM sends `signal_delay_s` before the time limit: submitit checkpoints and requeues the job
        subprocess.run(["scancel", "--signal=USR2", handle.job_id], check=True)
        t0 = time.time()
        while not handle.done():
            ex.wait([handle], 5.0)
        result, _ = handle.result()
    log = "".join((tmp_path / "s" / "slurm" / "train-w8s8-1kv" / f"{handle.job_id}_0_log.{s}").read_text()
                  for s in ("out", "err"))
    assert "requeued" in log.lower(), log[-2000:]
    assert result["resumed_from"] >= 10  # it resumed from a checkpoint, not from scratch
    print(f"[cluster] job {handle.job_id} signalled at step >= 15, requeued, resumed at step {result['resumed_from']},"
          f" done {time.time() - t0:.0f} s later")
    a, b = _weights(tmp_path / "ref"), _weights(tmp_path / "s" / "runs" / "w8s8-1kv")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    print("[cluster] the requeued run's weights equal the uninterrupted run's, bit for bit")


def _losses(run: Path) -> list[tuple[int, float]]:
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    return [(r["step"], r["loss"]) for r in rows if "loss" in r]


def test_two_ranks_from_slurm_match_torchrun(slurm, tmp_path):
    plan = dataclasses.replace(PLAN, steps=12)
    (tmp_path / "plan.json").write_text(json.dumps(plan.to_dict()))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29611",
                    str(HERE / "rank.py"), str(tmp_path / "plan.json"), ARCH, str(tmp_path / "torchrun")],
                   check=True, env=env)
    (task,) = [t for t in build_tasks(tmp_path / "s", plan) if t.name == "train w8s8-1kv"]
    (tmp_path / "s").mkdir()
    with SlurmExecutor(tmp_path / "s", SlurmOptions(wait=True, ranks_per_node=2, time=20)) as ex:
        assert run_tasks([task], 1, False, lambda *a: None, executor=ex) == {}
    jid = json.loads((tmp_path / "s" / "jobs.json").read_text())[task.name]["job_id"]
    logs = sorted((tmp_path / "s" / "slurm" / "train-w8s8-1kv").glob(f"{jid}_*_log.out"))
    assert len(logs) == 2  # two tasks (ranks) of one job
    ref, got = _losses(tmp_path / "torchrun"), _losses(tmp_path / "s" / "runs" / "w8s8-1kv")
    assert [s for s, _ in ref] == [10, 12] and got == ref  # the losses a run logs (every 10 steps, and its last)
    a, b = _weights(tmp_path / "torchrun"), _weights(tmp_path / "s" / "runs" / "w8s8-1kv")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
    print(f"[cluster] job {jid}: 2 ranks (gloo) log torchrun's losses {got} and end with its weights, bit for bit")


def test_bad_input_is_one_line_and_submits_nothing(slurm, tmp_path):
    before = _jobs()
    for args, msg in ((["--slurm-partition", "nope"], "is not a partition of this cluster (debug)"),
                      (["--out", tmp_path / "missing" / "d"], "does not exist (the study directory must be on")):
        code, out, err = run_cli("demo", "--quick", "--executor", "slurm", "--out", tmp_path / "d", *args)
        assert code == 2 and msg in err and err.count("\n") == 1, err
    dead = tmp_path / "dead.conf"  # a controller that does not answer
    dead.write_text(re.sub(r"(?m)^SlurmctldPort=\d+$", "SlurmctldPort=6899", (slurm / "slurm.conf").read_text()))
    os.environ["SLURM_CONF"] = str(dead)
    try:
        code, out, err = run_cli("demo", "--quick", "--executor", "slurm", "--out", tmp_path / "d")
    finally:
        os.environ["SLURM_CONF"] = str(slurm / "slurm.conf")
    assert code == 2 and "SLURM is not reachable" in err and err.count("\n") == 1, err
    assert not (tmp_path / "d").exists() and set(_jobs()) <= set(before)  # no new job (old ones age out of squeue)


def _jobs() -> list[str]:
    """Every job SLURM knows (queued, running, recently ended)."""
    return subprocess.run(["squeue", "-h", "--states=all", "-o", "%i"], capture_output=True, text=True).stdout.split()
