"""`compression_layout`: the compression ratio of every layer of a (DeepSeek-V4-like) config, its sliding
window and rotary slices, from transformers configs and raw config.json dicts (new and legacy forms)."""

import pytest
from transformers import DeepseekV4ForCausalLM

from phasekv.errors import ConfigError
from phasekv.model.hf import compression_layout, v4_sites
from tests.hf.tiny import qwen3_config, v4_config

CSA, HCA, SWA = "compressed_sparse_attention", "heavily_compressed_attention", "sliding_attention"


@pytest.mark.parametrize("csa,hca,layers,ratios", [
    (4, 8, (CSA, HCA), [4, 8]),
    (4, 16, (SWA, CSA, HCA, CSA), [0, 4, 16, 4]),
    (2, 128, (HCA, HCA, CSA), [128, 128, 2]),
    (8, 8, (CSA, HCA), [8, 8]),
])
def test_ratios_from_layer_types_and_compress_rates(csa, hca, layers, ratios):
    cfg = v4_config(csa=csa, hca=hca, layers=layers)
    layout = compression_layout(cfg)
    assert layout.ratios == ratios and layout.layer_types == list(layers)
    assert layout.sliding_window == 16 and layout.head_dim == 32 and layout.rotary_dims == 16
    assert layout.rope_theta == {"main": 10000.0, "compress": 160000.0}
    want: dict = {}
    for r, t in zip(ratios, layers, strict=True):
        if r and t not in want.setdefault(r, []):
            want[r].append(t)
    assert layout.distinct() == dict(sorted(want.items()))
    assert compression_layout(cfg.to_dict()).ratios == ratios  # the raw config.json reads the same


def test_legacy_forms():
    legacy = {"num_hidden_layers": 4, "compress_ratios": [0, 4, 128, 4], "head_dim": 512, "qk_rope_head_dim": 64,
              "sliding_window": 128, "rope_theta": 10000.0, "compress_rope_theta": 160000.0}
    layout = compression_layout(legacy)
    assert layout.ratios == [0, 4, 128, 4] and layout.layer_types == [SWA, CSA, HCA, CSA]
    assert layout.distinct() == {4: [CSA], 128: [HCA]} and layout.period == 128
    assert layout.rotary_dims == 64 and layout.rope_theta == {"main": 10000.0, "compress": 160000.0}
    scalars = {"num_hidden_layers": 2, "compress_ratios": [8, 16], "compress_rate_csa": 8, "compress_rate_hca": 16}
    assert compression_layout(scalars).layer_types == [CSA, HCA]
    assert compression_layout({"num_hidden_layers": 3, "compress_ratio": 8}).ratios == [8, 8, 8]


def test_models_without_compression_and_bad_configs():
    layout = compression_layout(qwen3_config())
    assert layout.ratios == [0, 0] and layout.distinct() == {} and layout.period is None
    with pytest.raises(ConfigError, match="compress_ratios"):
        compression_layout({"num_hidden_layers": 2, "compress_ratios": "4,128"})
    with pytest.raises(ConfigError, match="compress_rates has no ratio"):
        compression_layout({"num_hidden_layers": 1, "layer_types": [CSA], "compress_rates": {}})


def test_v4_sites_of_a_model():
    model = DeepseekV4ForCausalLM(v4_config(csa=4, hca=16, layers=(SWA, CSA, HCA)))
    sites = v4_sites(model)
    assert [(s.layer, s.branch, s.grid.window, s.grid.stride) for s in sites] == [
        (1, "key", 8, 4), (1, "indexer", 8, 4), (2, "key", 16, 16)]
    assert sites[1].config.head_dim == 16  # the indexer's compressor works at index_head_dim
