"""`phasekv audit` on transformers DeepSeek-V4 models: every compression ratio is tested and named with its
layer types; a model that answers at chance is inconclusive (exit 4), never a pass."""

import json

import pytest
import typer
from typer.testing import CliRunner

from phasekv.eval.models import load, model_ratios
from phasekv.mitigate import cli as mitigate_cli
from phasekv.train import train
from tests.hf.tiny import v4_config, write_config
from tests.train.helpers import FAST

CSA, HCA = "compressed_sparse_attention", "heavily_compressed_attention"


def _run(tmp_path, **kw):
    cfg = write_config(v4_config(**kw), tmp_path / "config.json")
    opts = {**{k: v for k, v in FAST.items() if k != "preset"}, "batch_size": 2, "seq_len": 96}
    train(hf_config=str(cfg), out=str(tmp_path / "run"), steps=1, val_every=0, gate_steps="none", **opts)
    return tmp_path / "run"


def _audit(run, out, *extra):
    app = typer.Typer()
    mitigate_cli.register(app)
    args = ["audit", "--model", str(run), "--out", str(out), "--records", "12", "--demos", "2", "--filler", "120",
            "--modulus", "8", "--per-group", "8", "--device", "cpu", *extra]
    return CliRunner().invoke(app, args)


@pytest.mark.parametrize("hca,moduli", [(8, [8, 16]), (16, [8, 32])])  # r = M: its period tested at 2M
def test_every_ratio_is_tested_and_a_chance_model_is_inconclusive(tmp_path, hca, moduli):
    run = _run(tmp_path, csa=4, hca=hca)
    assert model_ratios(load(run)) == {4: [CSA], hca: [HCA]}
    r = _audit(run, tmp_path / "audit")
    assert r.exit_code == 4, r.output
    v = json.loads((tmp_path / "audit" / "audit.json").read_text())
    assert v["verdict"] == "inconclusive" and not v["retrieves"] and v["task"] == "lookup"  # a recall run's words
    assert [(t["ratio"], t["layer_types"], t["modulus"]) for t in v["ratios"]] == [
        (4, [CSA], 8), (hca, [HCA], moduli[-1])]
    assert sorted({t["modulus"] for t in v["ratios"]}) == moduli
    assert f"ratio {hca} ({HCA})" in r.output

