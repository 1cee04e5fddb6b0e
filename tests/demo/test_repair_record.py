"""The demo's repair verdict cites a seed record of exactly what it trains: the committed file
(`DemoPlan.repair_record`, written by `phasekv repair --record`) holds the plan's repair design, trained with the
plan's recipe, with its seeds' numbers, and the record's fraction and interval are its own seeds' (nothing typed in
by hand; fewer than 8 seeds are reported as too few to be judged)."""

import json
from pathlib import Path

from phasekv.config import ModelConfig
from phasekv.demo import stages
from phasekv.demo.plan import plan_for
from phasekv.eval.stats import clopper_pearson
from phasekv.mitigate.repair import RECORD_SCHEMA, design_name, train_recipe


def test_the_committed_seed_record_measures_the_demos_repair_as_the_demo_trains_it():
    plan = plan_for(quick=False)
    record = json.loads(Path(stages.__file__).with_name(plan.repair_record).read_text())
    assert record["schema"] == RECORD_SCHEMA and record["source"].startswith("phasekv repair")
    for model in plan.repair_models:
        arch = design_name(ModelConfig.from_name(model, preset=plan.preset).name)
        mine = train_recipe(stages.train_config(plan, model, "unused").to_dict())
        found = [d for d in record["designs"] if d["arch"] == arch and d["recipe"] == mine]
        assert len(found) == 1, f"{model}: no seed record of the demo's recipe"
        d = found[0]
        assert d["seeds"] and d["seeds"] == [m["seed"] for m in d["per_seed"]]
        assert d["enough_seeds"] == (len(d["seeds"]) >= record["goals"]["seeds"] == 8)
        assert d["meeting_seeds"] == [m["seed"] for m in d["per_seed"] if m["meets"] and not m["misses"]]
        assert d["rate_ci"] == list(clopper_pearson(len(d["meeting_seeds"]), len(d["seeds"])))
