"""The grid family's config fields, validation and names (NSA, MoBA, Activation Beacon)."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from phasekv import ModelConfig
from phasekv.config.names import parse_name
from phasekv.errors import ConfigError, ModelNameError

EXAMPLES = [  # (paper name, alias)
    ("NSA l8/d4 · select 8 top 2 · window 16 · 1 KV", "nsa-l8d4-sel8k2-win16-1kv"),
    ("NSA l8/d4 · select 8 top 3 · window 16 · 1 KV · forced blocks", "nsa-l8d4-sel8k3-win16-1kv-forced"),
    ("MoBA B16 top 3 · 1 KV", "moba-b16k3-1kv"),
    ("MoBA B8 top 2 · 2 KV · no RoPE · seed 43", "moba-b8k2-2kv-norope-seed43"),
    ("Beacon r8 · window 32 · 1 KV", "beacon-r8w32-1kv"),
    ("Beacon r4 · window 16 · 4 KV · no Q/K norm", "beacon-r4w16-4kv-noqknorm"),
]


@pytest.mark.parametrize(("name", "alias"), EXAMPLES)
def test_names_round_trip(name, alias):
    cfg = ModelConfig.from_name(name, preset="tiny-8h")
    assert (cfg.name, cfg.alias) == (name, alias)
    assert ModelConfig.from_name(alias, preset="tiny-8h") == cfg
    assert ModelConfig.from_dict(cfg.to_dict()) == cfg
    assert ModelConfig.from_name(name.upper(), preset="tiny-8h") == cfg  # paper names are read in any case


def test_fields_and_grids():
    nsa = ModelConfig.from_name("NSA l8/d4 · select 8 top 2 · window 16 · 1 KV")
    assert (nsa.family, nsa.block, nsa.block_stride, nsa.select_block, nsa.top_k, nsa.sliding_window) == \
        ("nsa", 8, 4, 8, 2, 16)
    assert nsa.grids == {"d": 4, "l'": 8} and not nsa.compressed and nsa.window == nsa.stride == 0
    assert ModelConfig.from_name("moba-b16k3-1kv").grids == {"B": 16}
    assert ModelConfig.from_name("beacon-r8w32-1kv").grids == {"r": 8, "w": 32}
    assert ModelConfig.from_name("W8/S4 · 1 KV").grids == {"S": 4}
    assert ModelConfig.from_name("Full attention · 1 KV").grids == {}
    full = ModelConfig.from_name("beacon-r8w32-2kv-seed44").full_attention()
    assert full.name == "Full attention · 2 KV · seed 44"


@given(st.sampled_from(["nsa", "moba", "beacon"]), st.integers(1, 64), st.integers(1, 6), st.integers(1, 8),
       st.integers(1, 4), st.booleans(), st.sampled_from([None, 0, 16]), st.integers(42, 45))
@settings(max_examples=60, deadline=None)
def test_any_valid_family_config_round_trips(family, a, b, c, kv, flag, rope, seed):
    fields = {"nsa": dict(block=a * b, block_stride=a, select_block=a * c, top_k=3 + b, sliding_window=a + c,
                          forced_blocks=flag),
              "moba": dict(block=a, top_k=b),
              "beacon": dict(beacon_ratio=b, beacon_window=b * c)}[family]
    cfg = ModelConfig(family=family, n_heads=4 * kv, n_kv_heads=kv, rope_dims=rope, seed=seed, **fields)
    assert ModelConfig(**parse_name(cfg.name) | _backbone(cfg)) == cfg
    assert ModelConfig(**parse_name(cfg.alias) | _backbone(cfg)) == cfg


def _backbone(cfg):
    return {"n_heads": cfg.n_heads}


@pytest.mark.parametrize(("name", "field"), [
    ("MoBA B0 top 3 · 1 KV", "block=0"),
    ("moba-b16k0-1kv", "top_k=0"),
    ("Beacon r8 · window 30 · 1 KV", "beacon_window=30"),
    ("nsa-l8d3-sel8k2-win16-1kv", "block_stride=3"),
    ("nsa-l8d4-sel6k2-win16-1kv", "select_block=6"),
    ("NSA l8/d4 · select 8 top 2 · window 16 · 1 KV · forced blocks", "top_k=2"),
    ("MoBA B16 top 3 · 1 KV · forced blocks", "forced_blocks=True"),
    ("MoBA B16 top 3 · 1 KV · tied K/V", "tied_kv=True"),
    ("Beacon r8 · window 32 · 1 KV · local window 8", "local_window=8"),
])
def test_bad_values_are_one_line_errors_naming_the_field(name, field):
    with pytest.raises(ConfigError) as err:
        ModelConfig.from_name(name)
    assert field in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(("name", "part"), [
    ("moba-b16-1kv", "'b16'"), ("beacon", "''"), ("NSA l8/d4 · 1 KV", "'1 KV'"), ("MoBA B16 · 1 KV", "'MoBA B16'"),
    ("Beacon r8 · window 32 · 1 KV · purple", "'purple'"),
])
def test_bad_names_are_one_line_errors_naming_the_part(name, part):
    with pytest.raises(ModelNameError) as err:
        parse_name(name)
    assert part in str(err.value) and "\n" not in str(err.value)


def test_family_fields_outside_the_family_are_errors():
    with pytest.raises(ConfigError, match="family='sparse'"):
        ModelConfig(family="sparse")
    with pytest.raises(ConfigError, match="block=8: is not an attribute of a model outside the family"):
        ModelConfig(block=8)
    with pytest.raises(ConfigError, match="window=8"):
        ModelConfig(family="moba", block=8, top_k=2, window=8, stride=8)
    with pytest.raises(ConfigError, match="select_block=8: is not an attribute of moba"):
        ModelConfig(family="moba", block=8, top_k=2, select_block=8)
