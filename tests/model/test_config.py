import pytest

from phasekv import ModelConfig
from phasekv.errors import ConfigError


@pytest.mark.parametrize(
    "name, overrides, field",
    [
        ("W4/S8 · 1 KV", {}, "stride"),
        ("W8/S0 · 1 KV", {}, "stride"),
        ("W8/S8 · 3 KV", {}, "n_kv_heads"),
        ("W8/S8 · 1 KV · RoPE on 15 dims", {}, "rope_dims"),
        ("W8/S8 · 1 KV · RoPE on 64 dims", {}, "rope_dims"),
        ("W8/S8 · 1 KV · local window 0", {}, "local_window"),
        ("W8/S8 · 1 KV · uniform averaging · no gate bias", {}, "gate_bias"),
        ("W8/S8 · 1 KV", {"n_layers": 0}, "n_layers"),
        ("W8/S8 · 1 KV", {"vocab_size": -5}, "vocab_size"),
        ("W8/S8 · 1 KV", {"gate": "sparse"}, "gate"),
        ("W8/S8 · 1 KV", {"head_dim": 7}, "head_dim"),
        ("W8/S8 · 1 KV", {"rope_theta": 0.0}, "rope_theta"),
        ("Full attention · 1 KV · vector gates", {}, "gate"),
        ("Full attention · 1 KV · uncompressed tail", {}, "local_window"),
    ],
)
def test_validation_names_field_and_value(name, overrides, field):
    with pytest.raises(ConfigError, match=rf"{field}="):
        ModelConfig.from_name(name, preset="tiny", **overrides)


def test_unknown_preset():
    with pytest.raises(ConfigError, match="unknown preset 'huge'.*tiny"):
        ModelConfig.from_name("W8/S8 · 1 KV", preset="huge")


def test_qwen3_preset_shape():
    c = ModelConfig.from_name("Full attention · 8 KV", preset="qwen3-0.6b")
    assert (c.n_layers, c.d_model, c.n_heads, c.head_dim, c.d_ff, c.rope_theta) == (28, 1024, 16, 128, 3072, 1e6)
    assert c.tie_embeddings and c.n_kv_heads == 8


def test_dict_round_trip_and_version():
    c = ModelConfig.from_name("W8/S4 · 2 KV · vector gates", preset="small", vocab_size=77)
    assert ModelConfig.from_dict(c.to_dict()) == c
    d = c.to_dict() | {"config_version": 99}
    with pytest.raises(ConfigError, match="config_version 99"):
        ModelConfig.from_dict(d)
    with pytest.raises(ConfigError, match="unknown config field"):
        ModelConfig.from_dict(c.to_dict() | {"colour": "red"})
