"""The demo's task graph: dependencies, skipping finished work, failures, and the --quick run (slow)."""

import dataclasses
import json
import re
import time
from pathlib import Path

import pytest

from phasekv.demo.plan import plan_for, study_plan
from phasekv.demo.runner import build_tasks
from phasekv.errors import ConfigError
from phasekv.progress import INTERVAL_ENV
from phasekv.study import Task, run_tasks


def _touch(path: str, fail: bool = False) -> str:
    if fail:
        raise ValueError(f"planted failure in {path}")
    Path(path).write_text("done")
    return path


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def test_progress_lines_off_a_terminal(monkeypatch, capsys):
    """`make demo | tee log`: the runner's overall progress and each running task's show as periodic lines."""
    monkeypatch.setenv(INTERVAL_ENV, "0.2")
    failed = run_tasks([Task("slow", _sleep, {"seconds": 1.5}, lambda: False)], jobs=1, progress=True,
                       record=lambda *a: None)
    out = capsys.readouterr().out
    assert not failed
    assert re.search(r"^progress: demo tasks 0/1 \(0%\) · \S+ elapsed", out, re.M), out
    assert re.search(r"^progress: slow 0/1", out, re.M) and re.search(r"^progress: demo tasks 1/1 \(100%\)", out, re.M)


def test_task_graph_covers_every_stage(tmp_path):
    tasks = {t.name: t for t in build_tasks(tmp_path, plan_for(quick=True))}
    models = ["full-1kv", "w8s8-1kv", "w8s4-1kv", "w3s2-1kv"]
    for m in models:
        assert f"train {m}" in tasks
        for stage in ("lookup prefix", "lookup in-sequence", "knockout", "flip"):
            assert tasks[f"{stage} {m}"].after == [f"train {m}"]
    # gates after the knockouts (the alignment panel); cycling only for W = S models with learned gates
    assert tasks["gates w8s8-1kv"].after == ["train w8s8-1kv", "knockout w8s8-1kv"]
    assert "gates full-1kv" not in tasks
    assert {n for n in tasks if n.startswith("cycle")} == {"cycle w8s8-1kv"}
    assert "theory checks" in tasks and "example prompts" in tasks
    assert all(not t.is_done() for t in tasks.values())


def test_run_tasks_skips_done_and_blocks_dependents(tmp_path):
    a, b, c, d = (str(tmp_path / x) for x in "abcd")
    Path(a).write_text("done")  # already finished: must not run again
    tasks = [
        Task("a", _touch, {"path": a, "fail": True}, lambda: Path(a).exists()),
        Task("b", _touch, {"path": b}, lambda: Path(b).exists(), after=["a"]),
        Task("c", _touch, {"path": c, "fail": True}, lambda: Path(c).exists()),
        Task("d", _touch, {"path": d}, lambda: Path(d).exists(), after=["c"]),
    ]
    timings = {}
    failed = run_tasks(tasks, jobs=1, progress=False, record=lambda n, wall, cpu: timings.__setitem__(n, cpu))
    assert Path(b).exists() and not Path(d).exists()
    assert set(timings) == {"b"}
    assert "planted failure" in failed["c"] and "needs failed" in failed["d"]


def test_other_settings_in_same_dir_is_an_error(tmp_path):
    from phasekv.demo.runner import _manifest, _write_manifest

    _write_manifest(tmp_path, _manifest(tmp_path, plan_for(quick=True), 2))
    with pytest.raises(ConfigError, match="other settings"):
        _manifest(tmp_path, plan_for(quick=False), 2)


@pytest.mark.slow
def test_quick_demo_end_to_end(tmp_path):
    """`phasekv demo --quick` writes every stage's outputs and the report; a re-run skips everything."""
    from phasekv.demo import run_demo

    run_demo(tmp_path, quick=True, progress=False)
    html = (tmp_path / "report" / "index.html").read_text()
    for section in ("verdicts", "lookup", "flip", "knockout", "gates", "alignment", "cycling", "theory"):
        assert f'<section id="{section}">' in html
    assert "No lookup evaluation" not in html and "No knockouts" not in html
    first = json.loads((tmp_path / "demo.json").read_text())
    assert not first["failed"]
    again = run_demo(tmp_path, quick=True, progress=False)
    same = {k: v for k, v in again["tasks"].items() if k != "report"}  # the report is re-rendered each time
    assert same == {k: v for k, v in first["tasks"].items() if k != "report"}  # nothing else re-ran
    assert first["cpu_seconds"] > 0 and 0 < first["idle_estimate_seconds"] <= first["cpu_seconds"]


def test_makespan_replays_the_schedule():
    from phasekv.study import makespan

    noop = lambda: False  # noqa: E731
    tasks = [Task("a", _touch, {}, noop), Task("b", _touch, {}, noop), Task("c", _touch, {}, noop, after=["a"]),
             Task("d", _touch, {}, noop)]
    cost = {"a": 10.0, "b": 4.0, "c": 5.0, "d": 3.0}
    # two workers: a | b, then d takes b's worker at 4 (c waits for a), c starts at 10
    assert makespan(tasks, cost, jobs=2) == 15.0
    assert makespan(tasks, cost, jobs=1) == 22.0


def test_time_left_prices_unfinished_tasks_by_their_kind():
    """Each unfinished task costs its kind's seconds per unit among the finished ones (a training's unit: a step), a
    running one only its share not yet done; a kind with no finished task is named, not guessed."""
    from phasekv.study import time_left

    noop = lambda: False  # noqa: E731
    tasks = [Task("train a", _sleep, {}, noop, units=1000), Task("train b", _sleep, {}, noop, units=1000),
             Task("train c", _sleep, {}, noop, units=2000),
             Task("look a", _touch, {}, noop, after=["train a"]), Task("look c", _touch, {}, noop, after=["train c"])]
    # 0.1 s per step: b has 50 s left, c 200 s; the lookups are not yet timed (free); two workers: c ends at 200
    assert time_left(tasks, {"train a": 100.0}, {"train b": 0.5}, jobs=2) == (200.0, ["_touch"])
    assert time_left(tasks, {"train a": 100.0}, {"train b": 0.5}, jobs=1) == (250.0, ["_touch"])
    assert time_left(tasks, {"train a": 100.0, "look a": 4.0}, {"train b": 0.5}, jobs=1) == (254.0, [])


def test_overall_line_estimates_the_time_left(monkeypatch, capsys):
    """Off a terminal the overall line carries an estimate once a task has finished."""
    monkeypatch.setenv(INTERVAL_ENV, "0.2")
    tasks = [Task(name, _sleep, {"seconds": 0.6}, lambda: False) for name in ("first", "second")]
    assert not run_tasks(tasks, jobs=1, progress=True, record=lambda *a: None)
    out = capsys.readouterr().out
    assert re.search(r"^progress: demo tasks 0/2 \(0%\) · \S+ elapsed · estimate after the first task", out, re.M), out
    assert re.search(r"^progress: demo tasks 1/2 \(50%\) · \S+ elapsed · ~\S+ left$", out, re.M), out
    assert re.search(r"^progress: demo tasks 2/2 \(100%\) · \S+ elapsed$", out, re.M), out  # done: no estimate


def test_second_demo_on_same_dir_is_refused(tmp_path):
    import os

    from phasekv.study import Lock as _Lock

    with _Lock(tmp_path):
        with pytest.raises(ConfigError, match="another demo"):
            with _Lock(tmp_path):
                pass
    (tmp_path / ".demo.lock").write_text("999999999")  # a killed demo's stale lock is taken over
    with _Lock(tmp_path):
        assert (tmp_path / ".demo.lock").read_text() == str(os.getpid())
    assert not (tmp_path / ".demo.lock").exists()


def test_training_per_model_and_longest_training_first(tmp_path):
    plan = plan_for(quick=False)
    full = plan.training_of("Full attention · 1 KV")
    assert full == plan.training_of("full-1kv") and full["steps"] > plan.steps
    assert plan.sequences_of("full-1kv") > plan.sequences_of("W8/S4 · 1 KV") == plan.steps * plan.batch_size
    assert plan.training_of("W8/S4 · 1 KV") == {"steps": plan.steps, "batch_size": plan.batch_size, "lr": plan.lr}
    assert plan_for(quick=True).per_model == {"W3/S2 · 1 KV": {"recall": {"gap_prob": 0.5}}}  # what, not how long
    assert "(Full attention · 1 KV: 2000 steps)" in plan.steps_text()
    assert "records growing from 1 over the first 400 steps" in plan.steps_text()
    trainings = [t for t in build_tasks(tmp_path, plan) if t.name.startswith("train ")]
    assert trainings[0].name == "train full-1kv"  # the critical path starts first (in model order among equals)
    steps = [t.steps()[1] for t in trainings]
    assert steps == sorted(steps, reverse=True) and steps[0] == plan.steps_of("full-1kv") and steps[-1] == plan.steps


def test_a_model_trained_on_its_own_recall_layout_and_the_repair_task(tmp_path):
    """A per_model "recall" change reaches that model's training data only (kept by --quick: it says what is
    trained, not for how long); the repair goals run after every lookup when the unrepaired model and a
    full-attention model are in the plan, and never in the study."""
    plan = dataclasses.replace(plan_for(quick=False), models=["Full attention · 1 KV", "W8/S4 · 1 KV", "W12/S6 · 2 KV"],
                               per_model={"W12/S6 · 2 KV": {"steps": 1600, "recall": {"gap_prob": 0.5}}})
    grow = {"curriculum": plan.curriculum * plan.batch_size}  # the record curriculum, in examples
    assert plan.recall_of("w12s6-2kv") == {**plan.recall, **grow, "gap_prob": 0.5}
    assert plan.recall_of("w8s4-1kv") == plan.recall | grow
    assert dataclasses.replace(plan, curriculum=0).recall_of("w8s4-1kv") == plan.recall
    assert plan.training_of("w12s6-2kv") == {"steps": 1600, "batch_size": plan.batch_size, "lr": plan.lr}
    assert "(W12/S6 · 2 KV: 1600 steps, gap_prob 0.5)" in plan.steps_text()
    tasks = {t.name: t for t in build_tasks(tmp_path, plan)}
    assert sorted(tasks["repair goals"].after) == sorted(n for n in tasks if n.startswith("lookup"))
    assert tasks["train w12s6-2kv"].kwargs["arch"] == "W12/S6 · 2 KV"
    assert plan.repairs() and not dataclasses.replace(plan, models=["W8/S4 · 1 KV", "W12/S6 · 2 KV"]).repairs()
    assert not study_plan(quick=True).repairs()
