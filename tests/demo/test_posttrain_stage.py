"""The plans' post-training in miniature (claim C11): a task after each W8/S4 · 1 KV's training, none elsewhere, and
the stage end to end on a tiny base: its continuation, its lookups and what the claim reads of them."""

import pytest

from phasekv.demo import stages
from phasekv.demo.plan import family_plan, plan_for, study_plan
from phasekv.demo.runner import build_tasks
from phasekv.report import load_study
from phasekv.report.layout import Layout
from phasekv.report.posttrain import pairs


def test_posttrain_task_after_the_base(tmp_path):
    for plan in (plan_for(quick=True), study_plan(quick=True)):
        tasks = {t.name: t for t in build_tasks(tmp_path, plan)}
        post = [n for n in tasks if n.startswith("posttrain ")]
        assert post == ["posttrain w8s4-1kv"] and tasks[post[0]].after == ["train w8s4-1kv"]
    assert not [t for t in build_tasks(tmp_path, family_plan(quick=True)) if t.name.startswith("posttrain")]


def test_stage_end_to_end(tmp_path):
    plan = plan_for(quick=True).to_dict()
    lay = Layout(tmp_path)
    run = lay.run("w8s4-1kv")
    stages.train_model(plan, "W8/S4 · 1 KV", str(run))
    for padding in ("prefix", "in-sequence"):
        stages.retrieval(plan, str(run), str(lay.lookup(padding, "w8s4-1kv")), "lookup", padding)
    s = stages.posttrain(plan, str(tmp_path), "w8s4-1kv")
    assert (s["steps"], s["base_steps"]) == (8, 30)  # a quarter of the base's steps, rounded
    assert s["recipe"]["data"]["recall"]["gap_prob"] == 0.5 and s["recipe"]["init_from"] == str(run)
    assert s["recipe"]["lr"] == s["recipe"]["min_lr"] == pytest.approx(1e-3)  # a third of the base's peak
    (p,) = pairs(load_study(tmp_path))
    assert (p["name"], p["stride"], p["steps"]) == ("W8/S4 · 1 KV", 4, 8)
    assert set(p["base"]) == set(p["post"]) == {"prefix", "in-sequence"}
