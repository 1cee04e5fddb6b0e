import json

import pytest
import torch
from safetensors.torch import save_file

from phasekv import ModelConfig, PhaseLM
from phasekv.errors import CheckpointError, ConfigError


def test_save_load_round_trip(tmp_path):
    model = PhaseLM(ModelConfig.from_name("W8/S4 · 2 KV · vector gates", preset="tiny", vocab_size=50))
    model.save(tmp_path / "m")
    back = PhaseLM.load(tmp_path / "m")
    ids = torch.randint(0, 50, (1, 30))
    assert back.config == model.config
    assert torch.equal(back(ids), model(ids))
    assert not list((tmp_path / "m").glob("*.tmp"))


def test_load_errors(tmp_path):
    model = PhaseLM(ModelConfig.from_name("W8/S8 · 1 KV", preset="tiny", vocab_size=50))
    d = tmp_path / "m"
    with pytest.raises(CheckpointError, match="no model config"):
        PhaseLM.load(d)
    model.save(d)
    weights = d / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="model.safetensors: unreadable"):
        PhaseLM.load(d)
    other = PhaseLM(ModelConfig.from_name("W8/S8 · 2 KV", preset="tiny", vocab_size=50))
    save_file(other.state_dict(), weights)
    with pytest.raises(CheckpointError, match="shape"):
        PhaseLM.load(d)
    cfg = json.loads((d / "config.json").read_text())
    (d / "config.json").write_text(json.dumps(cfg | {"config_version": 0}))
    with pytest.raises(ConfigError, match="config_version"):
        PhaseLM.load(d)
    (d / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="not valid JSON"):
        PhaseLM.load(d)
