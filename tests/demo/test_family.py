"""`phasekv study --family`: the plan (the demo's recipe for the designs and the baselines) and its task graph."""

from phasekv.config import ModelConfig
from phasekv.demo.plan import FAMILY, FAMILY_WARM, NSA_STEPS, WARM_STEPS, family_plan, plan_for
from phasekv.demo.runner import build_tasks, discard
from phasekv.demo.stages import train_config


def test_family_plan_keeps_the_demos_recipe():
    plan, demo = family_plan(quick=False), plan_for(quick=False)
    assert plan.kind == "family" and plan.preset == "tiny" and not plan.repairs()
    assert [ModelConfig.from_name(m).family for m in plan.models] == [None, None, "nsa", "moba", "beacon"]
    for m in plan.models:  # the baselines as in the demo, NSA at its 1,000 steps, MoBA and Beacon continue that
        own = demo.training_of(m if m in demo.models else "Full attention · 1 KV")  # full attention
        warm = {"steps": WARM_STEPS, "init_from": "Full attention · 1 KV"} if m in FAMILY_WARM else {}
        nsa = {"steps": NSA_STEPS} if m == FAMILY[0] else {}
        assert plan.training_of(m) == own | warm | nsa
        assert plan.recall_of(m) == demo.recall_of("W8/S4 · 1 KV")
    assert plan.training_of("Full attention · 1 KV")["steps"] == 2000 and plan.steps_of("W8/S4 · 1 KV") == 600
    assert plan.steps_of(FAMILY[0]) == NSA_STEPS == 1000
    assert family_plan(quick=True).steps_of(FAMILY[0]) == plan_for(quick=True).steps
    assert set(FAMILY_WARM) == set(FAMILY[1:]) and "continued from Full attention · 1 KV, 600 steps" in plan.steps_text()


def test_a_warm_design_trains_from_the_plans_full_attention_run(tmp_path):
    cfg = train_config(family_plan(quick=True), FAMILY[1], str(tmp_path / "runs" / "moba-b16k3-1kv"))
    assert cfg.init_from == str(tmp_path / "runs" / "full-1kv") and cfg.arch == FAMILY[1]
    assert train_config(family_plan(quick=True), FAMILY[0], str(tmp_path / "runs" / "nsa")).init_from is None


def test_family_task_graph(tmp_path):
    tasks = {t.name: t for t in build_tasks(tmp_path, family_plan(quick=True))}
    nsa, w8s4 = (ModelConfig.from_name(m).alias for m in (FAMILY[0], "W8/S4 · 1 KV"))
    fam = tasks[f"family {nsa}"]
    assert fam.kwargs["grids"] == {"d": 4, "l'": 8}
    assert set(fam.after) == {f"train {nsa}", f"lookup prefix {nsa}", f"lookup in-sequence {nsa}"}
    assert fam.kwargs["evals"]["prefix"].endswith(f"eval/lookup-prefix/{nsa}")
    # a baseline is tested at its own stride and every design's grid
    assert tasks[f"family {w8s4}"].kwargs["grids"] == {"S": 4, "d": 4, "l'": 8, "B": 16, "r": 8, "w": 32}
    assert tasks["family full-1kv"].kwargs["grids"] == {"d": 4, "l'": 8, "B": 16, "r": 8, "w": 32}
    assert not any(name.startswith("family") for name in (t.name for t in build_tasks(tmp_path / "d", plan_for(True))))


def test_a_warm_design_trains_after_its_source_and_is_rerun_with_it(tmp_path):
    plan = family_plan(quick=True)
    tasks = {t.name: t for t in build_tasks(tmp_path, plan)}
    warm = [ModelConfig.from_name(m).alias for m in FAMILY_WARM]
    assert all(tasks[f"train {a}"].after == ["train full-1kv"] for a in warm)
    assert tasks[f"train {ModelConfig.from_name(FAMILY[0]).alias}"].after == []
    stale, _ = discard(tmp_path, plan, ["Full attention · 1 KV"])  # re-running full attention re-runs its continuations
    assert {f"train {a}" for a in warm} <= set(stale) and f"lookup prefix {warm[0]}" in stale
    assert "train w8s4-1kv" not in stale
