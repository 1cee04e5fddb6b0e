"""`phasekv study`: the paper's grid as a plan run by the demo's runner; claims.json and the grid table."""

import dataclasses
import json
import tomllib
from pathlib import Path

import pandas as pd
import pytest

from phasekv.attention.compressor import cyclable
from phasekv.config import ModelConfig
from phasekv.config.names import PAPER_GRID, parse_name, unseeded
from phasekv.demo.plan import STUDY_OWN, STUDY_PRESET, STUDY_STEPS, plan_for, study_plan
from phasekv.demo.runner import build_tasks, run_plan, run_study
from phasekv.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]
CLAIMS = [f"C{i}" for i in range(1, 12)]


def test_study_runs_the_papers_grid_at_one_valid_backbone():
    plan = study_plan(quick=False)
    sweep = [r["arch"] for r in tomllib.loads((ROOT / "sweeps" / "paper.toml").read_text())["run"]]
    assert plan.models == PAPER_GRID and sorted(plan.models) == sorted(sweep) and len(plan.models) == 26
    cfgs = [ModelConfig.from_name(m, preset=plan.preset) for m in plan.models]  # every run valid at the preset
    assert len({c.alias for c in cfgs}) == 26
    assert all(parse_name(c.alias) == parse_name(m) for c, m in zip(cfgs, plan.models, strict=True))
    assert plan.preset == STUDY_PRESET and plan.kind == "study"
    # the demo's recipe (with repeat sequences) and sizes; one budget for every compressed run (uniform averaging
    # too) and for full attention with 4 and 8 KV heads; with one KV head full attention gets its own (it learned at
    # 2 of 4 seeds in the common budget)
    demo = plan_for(quick=False)
    assert plan.recall == demo.recall | {"repeat_prob": 0.25}
    assert (plan.steps, plan.per_group, plan.lr) == (STUDY_STEPS, demo.per_group, demo.lr)
    assert plan.curriculum == 0 and "curriculum" not in plan.recall_of("W8/S8 · 1 KV")  # measured without it
    assert len([c for c in cfgs if not c.compressed]) == 3 and plan.per_model == STUDY_OWN
    own = {c.name: plan.steps_of(c.name) for c in cfgs if plan.steps_of(c.name) != plan.steps}
    assert own == {"Full attention · 1 KV": 3200} and plan.steps_of("Full attention · 1 KV · seed 84") == 3200
    assert "uniform averaging" in " ".join(c.name for c in cfgs if c.compressed)
    assert study_plan(quick=True).per_model == {} and study_plan(True, preset="small").preset == "small"


def test_study_task_graph(tmp_path):
    plan = study_plan(quick=True)
    tasks = {t.name: t for t in build_tasks(tmp_path, plan)}
    cfgs = {c.alias: c for c in (ModelConfig.from_name(m, preset=plan.preset) for m in plan.models)}
    for alias in cfgs:
        for stage in ("train", "lookup prefix", "lookup in-sequence", "knockout", "flip"):
            assert f"{stage} {alias}" in tasks
    cycled = {n.removeprefix("cycle ") for n in tasks if n.startswith("cycle ")}
    assert cycled == {a for a, c in cfgs.items() if cyclable(c)}
    assert {a for a, c in cfgs.items() if c.compressed and c.window == c.stride and c.gate != "uniform"} == cycled  # every W = S run
    assert "theory checks" in tasks and "compare" in tasks


def test_study_preset_must_fit_every_run(tmp_path):
    with pytest.raises(ConfigError, match="n_kv_heads=8: must divide n_heads=4"):
        run_study(tmp_path, quick=True, preset="tiny", progress=False)
    with pytest.raises(ConfigError, match="unknown preset"):
        run_study(tmp_path, quick=True, preset="nope", progress=False)
    assert not (tmp_path / "demo.json").exists()  # refused before anything ran


def test_study_cli_bad_preset_is_one_line(tmp_path):
    from tests.reliability.helpers import run_cli

    code, out, err = run_cli("study", "--quick", "--preset", "tiny", "--out", tmp_path / "s")
    assert code != 0 and (out + err).strip() == "error: invalid config: n_kv_heads=8: must divide n_heads=4"
    assert not (tmp_path / "s").exists()


def _check_outputs(root: Path, models: list[str]) -> None:
    claims = json.loads((root / "report" / "claims.json").read_text())
    assert [c["claim"] for c in claims] == CLAIMS
    assert all(c["verdict"] in ("reproduced", "not reproduced", "not testable here") and c["reason"] for c in claims)
    grid = pd.read_csv(root / "report" / "grid.csv")
    designs = {unseeded(name) for name in PAPER_GRID}  # the grid has one row per design, its seeds in a column
    assert designs == set(grid.model) and set(models) <= set(grid[grid.run].model)
    assert grid[grid.run]["mean"].notna().all() and grid[grid.run]["in-sequence_gap"].notna().all()
    html = (root / "report" / "index.html").read_text()
    assert html.index('<section id="claims">') < html.index('<section id="grid">') < html.index('id="verdicts"')
    manifest = json.loads((root / "demo.json").read_text())
    assert manifest["kind"] == "study" and not manifest["failed"]


def test_study_subset_end_to_end(tmp_path):
    """Every stage of a few of the study's runs at smoke budgets: the claims and the grid table."""
    models = ["Full attention · 1 KV", "W4/S4 · 1 KV"]  # ~40 s of CPU, 14 of them the theory checks
    plan = dataclasses.replace(study_plan(quick=True), models=models, steps=10)
    run_plan(tmp_path, plan, progress=False)
    _check_outputs(tmp_path, models)


@pytest.mark.slow
def test_quick_study_end_to_end(tmp_path):
    """`phasekv study --quick`: every stage of every run of the grid, the claims and the grid table."""
    run_study(tmp_path, quick=True, progress=False)
    _check_outputs(tmp_path, PAPER_GRID)
