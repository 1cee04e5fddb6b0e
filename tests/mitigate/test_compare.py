"""`phasekv compare`: the stable summary schema, cache and cost columns, Pareto flags, the acceptance check."""

import json
import shutil

import pandas as pd
import pytest
import typer
from typer.testing import CliRunner

from phasekv import ModelConfig, PhaseLM
from phasekv.data.tokenizer import build_word_tokenizer
from phasekv.errors import ConfigError
from phasekv.eval.ensemble import phase_ensemble
from phasekv.eval.models import load
from phasekv.eval.prompts import lookup_config
from phasekv.eval.run import run_retrieval
from phasekv.eval.tokens import WordTokenizer
from phasekv.mitigate import cli as mitigate_cli
from phasekv.mitigate.compare import ROW_FIELDS, SCHEMA, Bench, compare
from phasekv.mitigate.criteria import acceptance
from phasekv.mitigate.results import CompareRow

CFG = dict(records=12, demos=2, filler=8, modulus=4, per_group=16, mappings=4)


@pytest.fixture(scope="module")
def evals(tmp_path_factory):
    root = tmp_path_factory.mktemp("cmp")
    V = WordTokenizer(build_word_tokenizer(), "word").vocab_size
    dirs = []
    for name in ("Full attention · 1 KV", "W4/S4 · 1 KV", "W4/S4 · 1 KV · staggered windows"):
        m = root / ModelConfig.from_name(name).alias
        PhaseLM(ModelConfig.from_name(name, vocab_size=V)).save(m)
        em = load(m)
        run_retrieval("lookup", em, lookup_config(**CFG), root / "eval" / m.name, progress=False)
        dirs.append(root / "eval" / m.name)
        if name == "W4/S4 · 1 KV":
            run_retrieval("lookup", phase_ensemble(em, 2), lookup_config(**CFG), root / "eval" / "ens2", progress=False)
            dirs.append(root / "eval" / "ens2")
    return root, dirs


def test_summary_schema_and_costs(evals):
    root, dirs = evals
    s = compare(dirs, root / "out", baseline="W4/S4 · 1 KV", bench=Bench(reps=1, decode_context=32, decode_steps=4))
    assert s["schema"] == SCHEMA and s["reference"] == "Full attention · 1 KV" and s["baseline"] == "W4/S4 · 1 KV"
    rows = {r["label"]: r for r in s["models"]}
    assert all(set(r) == set(ROW_FIELDS) for r in s["models"])
    full, base = rows["Full attention · 1 KV"], rows["W4/S4 · 1 KV"]
    ens = rows["W4/S4 · 1 KV · phase ensemble 2"]
    assert full["cache_rel"] == 1.0 and full["train_cost_rel"] == 1.0 and full["role"] == "reference"
    assert 3.9 < base["compression"] < 4.0  # the local window and the window in flight cost a little
    assert ens["cache_rel"] == base["cache_rel"] and ens["decode_cost_rel"] == pytest.approx(2 * base["decode_cost_rel"])
    assert ens["mitigations"] == ["phase ensemble 2"]
    assert rows["W4/S4 · 1 KV · staggered windows"]["mitigations"] == ["staggered windows"]
    assert set(s["criteria"]["passing"]) == {"point", "ci", "strict"}
    saved = json.loads((root / "out" / "summary.json").read_text())
    assert saved["models"][0]["label"] == s["models"][0]["label"]
    assert len(pd.read_parquet(root / "out" / "results.parquet")) == 4
    assert (root / "out" / "pareto.png").stat().st_size > 0


def _row(label, compression, gap, gap_ci, mean, mean_ci):
    return CompareRow(label=label, compression=compression, gap=gap, gap_ci=gap_ci, mean=mean, mean_ci=mean_ci)


def test_acceptance_check_with_intervals():
    rows = [_row("full", 1.0, 5.0, [2.0, 8.0], 90.0, [88.0, 92.0]),
            _row("base", 8.0, 70.0, [60.0, 80.0], 50.0, [48.0, 52.0]),
            _row("good", 8.0, 6.0, [3.0, 9.0], 60.0, [58.0, 62.0]),  # passes every way
            _row("close", 8.0, 12.0, [9.0, 15.0], 49.0, [47.0, 51.0]),  # only within the intervals
            _row("big", 2.0, 1.0, [0.0, 2.0], 95.0, [94.0, 96.0])]  # compression too low
    c = acceptance(rows, "full", "base", 4.0, 2.0)
    assert c["passing"] == {"point": ["good"], "ci": ["good", "close"], "strict": []}
    rows[2].gap_ci = [3.0, 4.0]
    assert acceptance(rows, "full", "base", 4.0, 2.0)["passing"]["strict"] == ["good"]
    assert c["best"] == "good" and c["baseline_fails"]
    rows[1].gap_ci = [5.0, 30.0]  # the baseline's own gap may be within 2 x the reference's: nothing to repair
    assert not acceptance(rows, "full", "base", 4.0, 2.0)["baseline_fails"]


def test_cli(evals, tmp_path):
    root, dirs = evals
    app = typer.Typer()
    mitigate_cli.register(app)
    r = CliRunner().invoke(app, ["compare", *map(str, dirs), "--out", str(tmp_path / "c"), "--bench-reps", "0",
                                 "--baseline", "w4s4-1kv"])
    assert r.exit_code == 0, r.output
    s = json.loads((tmp_path / "c" / "summary.json").read_text())
    assert s["baseline"] == "W4/S4 · 1 KV" and s["models"][1]["train_cost_rel"] is None
    r = CliRunner().invoke(app, ["compare", str(dirs[0]), str(dirs[0]), "--out", str(tmp_path / "d")])
    assert r.exit_code != 0 and "the same evaluation twice" in str(r.exception)


def test_one_name_trained_two_ways_is_labelled_by_directory(evals, tmp_path):
    root, dirs = evals
    twin = tmp_path / "w4s4-1kv-other-data"
    shutil.copytree(dirs[1], twin)
    s = compare([dirs[0], dirs[1], twin], bench=Bench(reps=0))
    assert [r["label"] for r in s["models"]] == ["Full attention · 1 KV", "W4/S4 · 1 KV",
                                                 "W4/S4 · 1 KV (w4s4-1kv-other-data)"]
    assert s["models"][2]["model"] == "W4/S4 · 1 KV" and s["models"][2]["cache_rel"] == s["models"][1]["cache_rel"]
    with pytest.raises(ConfigError, match=r"--baseline 'W4/S4 · 1 KV' names 2 models: .*\(w4s4-1kv-other-data\)"):
        compare([dirs[0], dirs[1], twin], bench=Bench(reps=0), baseline="W4/S4 · 1 KV")  # which one: not a guess
    s = compare([dirs[0], dirs[1], twin], bench=Bench(reps=0), baseline="W4/S4 · 1 KV (w4s4-1kv-other-data)")
    assert s["baseline"] == "W4/S4 · 1 KV (w4s4-1kv-other-data)"


def test_cache_against_the_reference_and_against_the_same_kv_heads():
    """W8/S6 · 4 KV keeps 1/6 of full attention with four KV heads but 0.669 of Full attention · 1 KV's cache, the
    model it replaces: both figures, the reference's the headline."""
    from phasekv.mitigate.cost import add_costs

    cfgs = {n: ModelConfig.from_name(n) for n in ("Full attention · 1 KV", "W8/S6 · 4 KV")}
    rows = [CompareRow(label=n, ensemble_k=1) for n in cfgs]
    add_costs(rows, cfgs, cfgs["Full attention · 1 KV"], 32768, Bench(reps=0), progress=False)
    assert rows[1].cache_rel == pytest.approx(11_219_072 / 16_777_216)
    assert rows[1].cache_same_kv == pytest.approx(11_219_072 / 67_108_864)
    assert rows[0].cache_rel == rows[0].cache_same_kv == 1.0
