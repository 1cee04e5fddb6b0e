import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phasekv import ModelConfig
from phasekv.config.names import PAPER_GRID, parse_name
from phasekv.errors import ConfigError, ModelNameError


@pytest.mark.parametrize("name", PAPER_GRID)
def test_paper_grid_round_trips(name):
    cfg = ModelConfig.from_name(name, preset="qwen3-0.6b")
    assert cfg.name == name
    assert ModelConfig.from_name(cfg.alias, preset="qwen3-0.6b") == cfg
    assert ModelConfig.from_name(cfg.name, preset="qwen3-0.6b") == cfg


def test_grid_size_and_examples():
    assert len(PAPER_GRID) == 26 and len(set(PAPER_GRID)) == 26
    assert parse_name("w8s8-1kv-norope") == parse_name("W8/S8 · 1 KV · no RoPE")
    cfg = ModelConfig.from_name("DeepSeek-style kernel", preset="qwen3-0.6b")
    assert (cfg.window, cfg.stride, cfg.gate, cfg.tied_kv, cfg.rope_dims) == (8, 4, "vector", True, 16)
    assert ModelConfig.from_name("W8/S4 · 1 KV · vector gates · tied K/V · RoPE on 16 dims").name == "DeepSeek-style kernel"
    assert ModelConfig.from_name("Full attention · 8 KV", preset="qwen3-0.6b").compressed is False
    assert ModelConfig.from_name("W8/S8 · 1 KV · seed 43").seed == 43


@pytest.mark.parametrize("bad", ["", "W8", "W8/S8 · 1 KV · purple gates", "w8s8-1kv-bogus", "W8/S8 · 1 KV · no RoPE · no RoPE"])
def test_bad_names(bad):
    with pytest.raises(ModelNameError) as err:
        parse_name(bad)
    assert repr(bad) in str(err.value) or "repeats" in str(err.value)


def test_unknown_attribute_lists_known():
    with pytest.raises(ModelNameError, match="known attributes: .*vector gates"):
        parse_name("W8/S8 · 1 KV · purple gates")


attrs = st.fixed_dictionaries(
    {},
    optional={
        "gate": st.sampled_from(["scalar", "vector", "uniform"]),
        "tied_kv": st.booleans(),
        "post_norm": st.booleans(),
        "qk_norm": st.booleans(),
        "rope_dims": st.sampled_from([None, 0, 8, 16]),
        "local_window": st.sampled_from([None, 4, 16, 32]),
        "stagger": st.booleans(),
        "seed": st.integers(0, 99),
    },
)


@settings(max_examples=200, deadline=None)
@given(w=st.integers(1, 16), s=st.integers(1, 16), kv=st.sampled_from([1, 2, 4]), extra=attrs, bias=st.booleans())
def test_any_config_round_trips(w, s, kv, extra, bias):
    if s > w:
        s = w
    if extra.get("gate", "scalar") != "uniform":
        extra["gate_bias"] = bias
    try:
        cfg = ModelConfig.from_name(f"w{w}s{s}-{kv}kv", preset="tiny", **extra)
    except ConfigError:
        return
    assert ModelConfig.from_name(cfg.name, preset="tiny") == cfg
    assert ModelConfig.from_name(cfg.alias, preset="tiny") == cfg
