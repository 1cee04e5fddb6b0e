"""Backbone overrides (`--set n_layers=4,d_model=96`): one parser for the command line, sweep files and run configs."""

import json

import pytest

from phasekv.config import ModelConfig, format_overrides, parse_overrides
from phasekv.errors import ConfigError
from phasekv.train import sweep

from .helpers import FAST
from .test_run import cli


def test_parse_and_format_round_trip():
    parsed = parse_overrides("n_layers=4, d_model=96,rope_theta=1e5,tie_embeddings=true,init_std=none")
    assert parsed == {"n_layers": 4, "d_model": 96, "rope_theta": 1e5, "tie_embeddings": True, "init_std": None}
    assert parse_overrides(format_overrides(parsed)) == parsed
    assert parse_overrides({"n_layers": 4, "init_std": 0.02}) == {"n_layers": 4, "init_std": 0.02}  # a TOML table
    assert parse_overrides("") == parse_overrides(None) == {}


@pytest.mark.parametrize("text, match", [
    ("n_layer=4", "'n_layer' is not a backbone field"),
    ("window=4", "'window' is not a backbone field"),  # compression attributes come from the name
    ("n_layers=4.5", "n_layers='4.5' is not a valid int"),
    ("n_layers", "expected field=value pairs"),
    ("n_layers=", "expected field=value pairs"),
    ("tie_embeddings=yes", "tie_embeddings='yes' is not a valid bool"),
])
def test_bad_overrides_name_the_field(text, match):
    with pytest.raises(ConfigError, match=match):
        parse_overrides(text)


def test_backbone_shows_what_differs_from_the_preset():
    cfg = ModelConfig.from_name("W8/S8 · 1 KV", preset="tiny", **parse_overrides("n_layers=4,d_model=96"))
    assert (cfg.n_layers, cfg.d_model) == (4, 96) and cfg.backbone == "tiny · n_layers=4,d_model=96"
    assert ModelConfig.from_name("W8/S8 · 1 KV").backbone == "tiny"


def test_cli_override_round_trips_into_the_run_config(monkeypatch, capsys, tmp_path):
    out = tmp_path / "run"
    args = ["train", "--arch", "Full attention · 1 KV", "--set", "n_layers=3,d_ff=64", "--steps", "2",
            "--batch-size", "4", "--seq-len", "64", "--val-sequences", "8", "--warmup", "1", "--threads", "1",
            "--gate-steps", "none", "--no-progress", "--out", str(out)]
    assert cli(monkeypatch, capsys, *args)[0] == 0
    saved = json.loads((out / "config.json").read_text())
    assert saved["train"]["backbone"] == {"n_layers": 3, "d_ff": 64}
    assert (saved["model"]["n_layers"], saved["model"]["d_ff"], saved["model"]["d_model"]) == (3, 64, 64)
    code, err = cli(monkeypatch, capsys, *args[:-1], str(tmp_path / "b"), "--set", "n_layers=0")
    assert code == 2 and err.count("\n") == 1 and "n_layers=0" in err


@pytest.mark.parametrize("value, match", [("n_heads=x", "n_heads='x'"), ("d_modl=8", "'d_modl'"),
                                          ("n_layers=0", "n_layers=0")])
def test_cli_bad_override_is_one_line(monkeypatch, capsys, tmp_path, value, match):
    code, err = cli(monkeypatch, capsys, "train", "--set", value, "--out", str(tmp_path / "a"))
    assert code == 2 and err.startswith("error: ") and err.count("\n") == 1 and match in err


def test_sweep_backbone(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    p = tmp_path / "s.toml"
    p.write_text('[defaults]\nbackbone = {n_layers = 3}\n[[run]]\narch = "W8/S8 · 1 KV"\n'
                 '[[run]]\narch = "W8/S4 · 1 KV"\nbackbone = "n_layers=4,d_model=32"\n')
    runs = sweep.load_sweep(p)
    assert [r.config().backbone for r in runs] == [{"n_layers": 3}, {"n_layers": 4, "d_model": 32}]
    args = sweep.train_args(runs[1])
    assert args[args.index("--backbone") + 1] == "n_layers=4,d_model=32"
    p.write_text('[[run]]\narch = "W8/S8 · 1 KV"\nbackbone = {n_layers = "four"}\n')
    with pytest.raises(ConfigError, match="run 1: backbone: n_layers='four' is not a valid int"):
        sweep.load_sweep(p)


def test_train_records_backbone(tmp_path):
    from phasekv.train import train

    out = tmp_path / "r"
    train(out=str(out), **dict(FAST, arch="w8s8-1kv", steps=1, backbone={"n_layers": 3}, gate_steps="none"))
    assert json.loads((out / "config.json").read_text())["model"]["n_layers"] == 3


def test_regime_sweep_is_in_the_studys_regime():
    """sweeps/regime.toml: the cpu-study preset gives every W8/S8 run of the paper's grid at least one compressed
    entry per record (tiny: 0.5) and has room for the grid's 8 KV heads."""
    from phasekv.config.names import PAPER_GRID

    from .helpers import ROOT

    runs = sweep.load_sweep(ROOT / "sweeps" / "regime.toml")
    assert {r.config().preset for r in runs} == {"cpu-study"}
    grid = [ModelConfig.from_name(n, preset="cpu-study") for n in PAPER_GRID]
    assert all(c.entries_per_record >= 1 for c in grid if (c.window, c.stride) == (8, 8))
    assert max(c.n_kv_heads for c in grid) == 8 and ModelConfig.from_name("W8/S8 · 1 KV").entries_per_record == 0.5
