"""Knockout tables on constructed rows, and the three analyses end to end from the CLI on a tiny model."""

import json

import numpy as np
import pandas as pd
import pytest
import torch

from phasekv import ModelConfig, PhaseLM
from phasekv.analysis.knockout import effect_table, spread_pids, strongest
from phasekv.errors import ConfigError
from tests.analysis.helpers import invoke


def _rows(unit, layer, kv, acc_by_pos):
    out = []
    for pos, a in acc_by_pos.items():
        out += [{"unit": unit, "layer": layer, "kv_head": kv, "target_pos": pos, "correct": i < 10 * a}
                for i in range(10)]
    return out


def test_effect_table_relative_change_and_folding():
    clean = {p: 0.5 for p in range(16)}
    ko = {p: (0.0 if p % 4 == 1 else 0.5) for p in range(16)}  # loses everything at phase 1 (S = 4)
    gain = {p: (1.0 if p == 3 else 0.5) for p in range(16)}
    rows = pd.DataFrame(_rows("clean", -1, -1, clean) + _rows("L0·KV0", 0, 0, ko) + _rows("L1·KV0", 1, 0, gain))
    t = effect_table(rows, modulus=16, stride=4)
    assert set(t["grouping"]) == {"residue", "phase"}
    ph = t[(t["grouping"] == "phase") & (t["unit"] == "L0·KV0")].set_index("group")["rel_change"]
    assert ph.tolist() == pytest.approx([0, -1, 0, 0])
    res = t[(t["grouping"] == "residue") & (t["unit"] == "L1·KV0")].set_index("group")["rel_change"]
    assert res[3] == pytest.approx(1.0) and res[11] == pytest.approx(0.0)  # 3 gains, 11 does not
    assert (t[t["unit"] == "clean"]["rel_change"] == 0).all()
    top = strongest(t, "phase")
    assert top[0]["unit"] == "L0·KV0" and top[0]["worst_group"] == 1 and top[0]["worst_rel_change"] == -1


def test_spread_pids_cover_every_group():
    pids = spread_pids(24 * 10, 48)
    assert len(pids) == 48 and len({p // 10 for p in pids}) == 24


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from phasekv.data.tokenizer import build_word_tokenizer, save_tokenizer

    torch.manual_seed(0)
    tok = build_word_tokenizer()
    model = PhaseLM(ModelConfig.from_name("w8s8-2kv", preset="tiny", vocab_size=tok.get_vocab_size()))
    d = tmp_path_factory.mktemp("model")
    model.save(d)
    save_tokenizer(tok, d / "tokenizer.json")
    return d





def test_cli_end_to_end(model_dir, tmp_path):
    ko, gates, cyc = tmp_path / "ko", tmp_path / "gates", tmp_path / "cyc"
    invoke(["knockout", "--model", str(model_dir), "--out", str(ko), "--n-cal", "16"])
    t = pd.read_parquet(ko / "results.parquet")
    assert set(t["unit"]) == {"clean", "L0·KV0", "L0·KV1", "L1·KV0", "L1·KV1"}
    s = json.loads((ko / "summary.json").read_text())
    assert s["n_prompts"] == 48 and s["n_cal"] == 16 and "versions" in s["provenance"]
    assert (ko / "knockout_map.png").stat().st_size > 0

    invoke(["gates", "--model", str(model_dir), "--out", str(gates), "--n-prompts", "8", "--knockout", str(ko)])
    g = pd.read_parquet(gates / "results.parquet")
    assert len(g) == 2 * 2 * 2 * 8  # layers x KV heads x branches x phases
    assert ((g["static"] >= 1 - 1e-6) & (g["static"] <= 8 + 1e-6)).all()
    assert (gates / "gate_panel.png").is_file() and (gates / "concentration_plane.png").is_file()

    invoke(["cycle", "--model", str(model_dir), "--out", str(cyc), "--delta", "-1,2", "--n-boot", "50"])
    c = pd.read_parquet(cyc / "results.parquet")
    assert sorted(c["delta"].unique()) == [-1, 0, 2] and len(c) == 3 * 8
    s = json.loads((cyc / "summary.json").read_text())
    assert [g["delta"] for g in s["grid"]] == [-1, 2]
    assert (cyc / "r2_grid.png").is_file() and (cyc / "cycling_0.png").is_file()
    # the cycled runs restored the model: clean accuracy of the cycling run == clean knockout run
    p = pd.read_parquet(cyc / "prompts.parquet")
    k = pd.read_parquet(ko / "prompts.parquet")
    a = p[p["delta"] == 0].sort_values("pid")["pred"].to_numpy()
    b = k[k["unit"] == "clean"].sort_values("pid")["pred"].to_numpy()
    assert np.array_equal(a, b)


def test_api_errors(model_dir):
    from phasekv.analysis.knockout import units

    with pytest.raises(ConfigError):
        units(PhaseLM.load(model_dir), "neuron")
    from phasekv.analysis.cli import _deltas

    assert _deltas("-3..3") == [-3, -2, -1, 1, 2, 3]
    with pytest.raises(ConfigError):
        _deltas("a..b")


def test_python_api_takes_a_directory(model_dir, tmp_path):
    from phasekv.analysis.gates import analyze_gates
    from phasekv.eval.prompts import lookup_config

    cfg = lookup_config(records=12, demos=2, modulus=8, per_group=6, keep_n=True, filler=12, mappings=3)
    s = analyze_gates(model_dir, cfg, tmp_path, n_prompts=4, progress=False)
    assert s["n_prompts"] == 4 and len(s["heads"]) == 2 * 2 * 2
    assert json.loads((tmp_path / "summary.json").read_text())["analysis"] == "gates"


def test_cli_whole_layer_variant_on_chosen_layers(model_dir, tmp_path):
    invoke(["knockout", "--model", str(model_dir), "--out", str(tmp_path), "--n-cal", "8", "--variant", "layer",
             "--layers", "1"])
    t = pd.read_parquet(tmp_path / "results.parquet")
    assert set(t["unit"]) == {"clean", "L1"} and (t.loc[t["unit"] == "L1", "kv_head"] == -1).all()
