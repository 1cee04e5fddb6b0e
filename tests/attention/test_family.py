"""The grid family as PhaseLM variants: the registry builds each design in every layer, the cache-size formula of
`phasekv info` is what the decode cache holds, evaluations test every grid period, and a family model refuses
conversions it has no equivalent for."""

import pytest
import torch

from phasekv import ModelConfig, PhaseLM
from phasekv.attention.attention import Attention
from phasekv.attention.family import DESIGNS, design_class, make_attention
from phasekv.config.model import FAMILIES
from phasekv.errors import ConfigError
from phasekv.eval.models import family_ratios
from phasekv.model.cli import cache_bytes
from phasekv.train.build import param_groups
from tests.attention.family_harness import assert_decode_equals_parallel, decode_all, small_model

NAMES = ["NSA l4/d2 · select 4 top 2 · window 5 · 2 KV", "NSA l4/d2 · select 4 top 3 · window 3 · 1 KV · forced blocks",
         "MoBA B4 top 2 · 2 KV", "MoBA B3 top 4 · 1 KV · no Q/K norm", "Beacon r2 · window 6 · 2 KV",
         "Beacon r3 · window 3 · 1 KV · no RoPE"]


def test_registry_is_the_config_list_and_builds_every_layer():
    assert set(DESIGNS) == set(FAMILIES)
    for name in NAMES:
        model = small_model(name)
        cls = design_class(model.config.family)
        assert all(type(block.attn) is cls for block in model.layers)
        assert all(isinstance(block.attn, Attention) and block.attn.compressor is None for block in model.layers)
        assert all(block.attn.grids() == model.config.grids for block in model.layers)
    assert type(make_attention(ModelConfig(), 0)) is Attention
    with pytest.raises(ConfigError, match="family='nope'"):
        design_class("nope")


@pytest.mark.parametrize("name", NAMES)
def test_decode_equals_parallel_and_info_counts_the_cache(name):
    model = small_model(name)
    ids = torch.randint(0, 61, (2, 19))  # 19: no block, stride or window divides it
    assert_decode_equals_parallel(model, ids, [5, *range(6, 20)])
    for T in (1, 6, 13):
        _, cache = decode_all(model, ids[:, :T], [T])
        assert cache.nbytes == cache_bytes(model.config, T, batch_size=2)


@pytest.mark.parametrize("name", NAMES)
def test_trains(name):
    """One optimizer step with the trainer's parameter groups: every parameter gets a gradient, the loss moves."""
    model = small_model(name).train()
    opt = torch.optim.AdamW(param_groups(model, 0.1), lr=1e-2)
    ids = torch.randint(0, 61, (4, 17))
    losses = []
    for _ in range(2):
        loss = torch.nn.functional.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        losses.append(loss.item())
        assert all(p.grad is not None for p in model.parameters())
        opt.step()
    assert losses[1] < losses[0]


def test_every_grid_period_is_an_evaluation_ratio():
    nsa = ModelConfig.from_name("NSA l8/d4 · select 8 top 2 · window 16 · 1 KV")
    assert [r["ratio"] for r in family_ratios(nsa)] == [4, 8]
    same = ModelConfig.from_name("nsa-l4d4-sel4k2-win8-1kv")  # d = l' = 4: one ratio, both grids named
    assert family_ratios(same) == [{"ratio": 4, "layer_types": ["NSA grid d = 4 (every layer)",
                                                                "NSA grid l' = 4 (every layer)"]}]
    beacon = family_ratios(ModelConfig.from_name("beacon-r8w24-1kv"))
    assert beacon[1] == {"ratio": 24, "layer_types": ["Beacon grid w = 24 (every layer)"]}


def test_family_models_do_not_convert_to_qwen3():
    model = PhaseLM(ModelConfig.from_name("moba-b4k2-1kv"))
    with pytest.raises(ConfigError, match="MoBA B4 top 2 · 1 KV: only full-attention models convert"):
        model.to_hf()
