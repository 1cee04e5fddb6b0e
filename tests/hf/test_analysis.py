"""The mechanism analyses on transformers DeepSeek-V4 models: gates (CSA, HCA and the indexer's compressor),
cycling of every position_bias, knockouts of the compressed branch alone and of the whole attention output."""

import json
import shutil

import pandas as pd
import pytest
import torch

from phasekv.analysis.cycling import cycle_stride, cycled, gate_params
from phasekv.analysis.hooks import compressed_knockout, final_rows
from phasekv.errors import ConfigError
from phasekv.eval.models import load
from phasekv.model.gates import gate_grids
from phasekv.train import train
from phasekv.train.checkpoint import latest_checkpoint
from tests.analysis.helpers import invoke
from tests.hf.tiny import v4_config, write_config
from tests.train.helpers import FAST


@pytest.fixture(scope="module")
def v4_run(tmp_path_factory):
    """A V4 (CSA ratio 4, HCA ratio 8) trained 2 steps by `phasekv train --hf-config`, with random slot biases."""
    d = tmp_path_factory.mktemp("v4")
    cfg = write_config(v4_config(), d / "config.json")
    opts = {**{k: v for k, v in FAST.items() if k != "preset"}, "batch_size": 2, "seq_len": 96}
    train(hf_config=str(cfg), out=str(d / "run"), steps=2, val_every=0, gate_steps="none", **opts)
    em = load(d / "run")
    with torch.no_grad():
        for p in gate_params(em.model):
            p.normal_(0, 2.0)
    em.model.save_pretrained(d / "model")  # a plain save_pretrained dir with the run's tokenizer beside it
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(latest_checkpoint(d / "run") / f, d / "model" / f)
    return d



def test_gates_cover_csa_hca_and_the_indexer(v4_run, tmp_path):
    em = load(v4_run / "run")
    assert {k: (g.window, g.stride) for k, g in gate_grids(em.model).items()} == {
        (0, "key"): (8, 4), (0, "indexer"): (8, 4), (1, "key"): (8, 8)}
    invoke(["gates", "--model", str(v4_run / "run"), "--out", str(tmp_path), "--n-prompts", "8"])
    g = pd.read_parquet(tmp_path / "results.parquet")
    assert sorted({(r.layer, r.branch, r.stride) for r in g.itertuples()}) == [
        (0, "indexer", 4), (0, "key", 4), (1, "key", 8)]
    assert len(g) == 4 + 4 + 8  # one row per phase of each compressor
    assert ((g["static_phase"] >= 1 - 1e-6) & (g["static_phase"] <= g["stride"] + 1e-6)).all()
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["window"] == 8 and s["stride"] is None and s["overlapping"] and s["branches"]["indexer"]
    assert (tmp_path / "gate_panel.png").is_file() and (tmp_path / "concentration_plane.png").is_file()


def test_cycling_rolls_every_position_bias_and_restores_it(v4_run, tmp_path):
    em = load(v4_run / "run")
    before = [p.detach().clone() for p in gate_params(em.model)]
    assert len(before) == 3 and cycle_stride(em.model) == 8  # CSA, its indexer, HCA; lcm(4, 8)
    ids = torch.randint(0, 100, (1, 40))
    with torch.no_grad():
        base = em.model(ids).logits
        with cycled(em.model, 1):
            assert all(torch.equal(p, torch.roll(b, 1, 0)) for p, b in zip(gate_params(em.model), before, strict=True))
        assert torch.equal(em.model(ids).logits, base)
    invoke(["cycle", "--model", str(v4_run / "model"), "--out", str(tmp_path), "--delta", "-1,2", "--n-boot", "50"])
    c = pd.read_parquet(tmp_path / "results.parquet")
    assert sorted(c["delta"].unique()) == [-1, 0, 2] and len(c) == 3 * 8
    assert c.loc[c["boundary"], "phase"].unique().tolist() == [7]


def test_compressed_knockout_hides_the_entries_from_the_final_query_only(v4_run):
    em = load(v4_run / "run")
    ids = torch.randint(0, 100, (2, 40))
    with torch.no_grad():
        base = em.model(ids).logits
        with compressed_knockout(em.model, 1, length=40):
            ko = em.model(ids).logits
    assert torch.equal(ko[:, :-1], base[:, :-1]) and not torch.allclose(ko[:, -1], base[:, -1])
    with pytest.raises(ConfigError, match="no DeepSeek-V4 compressor"):
        compressed_knockout(em.model, 5, length=40).__enter__()
    assert final_rows(torch.arange(40), 40, 1)[0].tolist() == [39]


def test_knockout_cli_defaults_to_compressed_and_layer(v4_run, tmp_path):
    invoke(["knockout", "--model", str(v4_run / "run"), "--out", str(tmp_path), "--n-cal", "8"])
    t = pd.read_parquet(tmp_path / "results.parquet")
    assert set(t["unit"]) == {"clean", "L0·compressed", "L0", "L1·compressed", "L1"}
    s = json.loads((tmp_path / "summary.json").read_text())
    assert s["variant"] == "compressed,layer" and set(s["replaced"]) == {"compressed", "layer"}
    assert (tmp_path / "knockout_map.png").is_file()
