"""`--seed` and `--seeds`: every task of each plan at the seed, several seeds gathered in one directory, the data seed
apart from the weights' seed."""

import json

import pytest
import torch

from phasekv.config import ModelConfig
from phasekv.config.names import at_seed, at_seeds, seed_of, unseeded
from phasekv.demo import stages
from phasekv.demo.cli import seeds_of
from phasekv.demo.needle import plan_for as needle_plan
from phasekv.demo.plan import family_plan, plan_for, study_plan
from phasekv.demo.runner import _manifest, _write_manifest, build_tasks, plan_at
from phasekv.errors import ConfigError
from phasekv.train import train
from phasekv.train.build import build_model
from phasekv.train.config import TrainConfig
from tests.train.helpers import FAST, phasekv


def test_names_at_a_seed_are_the_configs_names():
    for name in ("W8/S8 · 1 KV", "W8/S4 · 2 KV · staggered heads · coverage reg 0.3", "Full attention · 1 KV · seed 43"):
        for seed in (42, 43, 7):
            assert at_seed(name, seed) == ModelConfig.from_name(name).replace(seed=seed).name
            assert seed_of(at_seed(name, seed)) == seed and unseeded(at_seed(name, seed)) == unseeded(name)
    assert at_seeds(["W8/S8 · 1 KV", "W8/S8 · 1 KV · seed 43"], [1, 2]) == ["W8/S8 · 1 KV · seed 1",
                                                                          "W8/S8 · 1 KV · seed 2"]
    with pytest.raises(ConfigError, match="distinct seeds"):
        at_seeds(["W8/S8 · 1 KV"], [1, 1])


@pytest.mark.parametrize("plan", [plan_for(True), family_plan(True), study_plan(True)], ids=["demo", "family", "study"])
def test_seed_reaches_every_task_of_each_plan(plan, tmp_path):
    p = plan.at_seeds([7])
    tasks = build_tasks(tmp_path, p)
    runs = {t.kwargs["run_dir"] for t in tasks if "run_dir" in t.kwargs}
    assert runs and all("seed7" in r for r in runs)  # every model's evaluations and analyses read its seed-7 run
    for t in (t for t in tasks if t.fn is stages.train_model):
        cfg = stages.train_config(p, t.kwargs["arch"], t.kwargs["run_dir"])
        assert ModelConfig.from_name(cfg.arch, preset=p.preset).seed == 7
        assert cfg.init_from is None or cfg.init_from.endswith("seed7")  # a continued model: the same seed's source
        if cfg.init_from is None:
            assert build_model(cfg, 64)[0].config.seed == 7


def test_seed_reaches_every_chain_of_the_needle(tmp_path):
    for model, alias, chain in needle_plan(True).at_seeds([7, 8]).runs(tmp_path):
        assert seed_of(model) in (7, 8) and alias.endswith(f"seed{seed_of(model)}")
        assert all(r.options["arch"] == model for r in chain)
        assert all(f"seed{seed_of(model)}-" in r.options.get("init_from", f"seed{seed_of(model)}-") for r in chain)


def test_seeds_gather_in_one_directory(tmp_path):
    """A directory keeps its seeds: a later --seed adds one, a run without --seed keeps them, other settings are
    still refused."""
    base = plan_for(True)
    _write_manifest(tmp_path, _manifest(tmp_path, base, 2))
    both = plan_at(tmp_path, base, [43])
    assert both.seeds == [42, 43] and "W8/S8 · 1 KV · seed 43" in both.models and "W8/S8 · 1 KV" in both.models
    _write_manifest(tmp_path, _manifest(tmp_path, both, 2))  # adding a seed is not "other settings"
    assert plan_at(tmp_path, base).seeds == [42, 43]
    with pytest.raises(ConfigError, match="other settings"):
        _manifest(tmp_path, plan_at(tmp_path, plan_for(False)), 2)


def test_seed_options():
    assert seeds_of(None, None) is None and seeds_of(5, None) == [5] and seeds_of(None, "1, 2,3") == [1, 2, 3]
    with pytest.raises(ConfigError, match="not both"):
        seeds_of(1, "1,2")
    with pytest.raises(ConfigError, match="comma-separated integers"):
        seeds_of(None, "1,x")
    r = phasekv("demo", "--quick", "--seeds", "4,4", "--out", "/nonexistent/never")
    assert r.returncode != 0 and "distinct seeds" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_data_seed_varies_the_data_and_keeps_the_weights(tmp_path):
    """`--data-seed`: the same initial weights (the run seed's) over another data order and held-out set."""
    runs = {}
    for name, data_seed in (("a", None), ("b", 42), ("c", 5)):
        out = tmp_path / name
        train(out=str(out), **dict(FAST, arch="w8s8-1kv", steps=2, val_every=0, gate_steps="none", data_seed=data_seed))
        runs[name] = [json.loads(r) for r in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in r]
        assert json.loads((out / "done.json").read_text())["data_seed"] == (42 if data_seed is None else data_seed)
    assert runs["a"][0]["loss"] == runs["b"][0]["loss"]  # data seed 42 is the run seed's data
    assert runs["a"][0]["loss"] != runs["c"][0]["loss"]  # the same weights (below) on other sequences
    weights = [build_model(TrainConfig(arch="w8s8-1kv", data_seed=d), 64)[0].state_dict() for d in (None, 5)]
    assert all(torch.equal(weights[0][k], weights[1][k]) for k in weights[0])
