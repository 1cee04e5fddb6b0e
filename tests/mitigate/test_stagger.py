"""Staggered windows (`· staggered windows`): each layer's window grid starts at its own phase, and the
compressed decode cache, causality and the single visibility rule still hold on every grid."""

import pytest
import torch

from phasekv import ModelConfig, PhaseLM

SMALL = dict(preset="tiny", vocab_size=61, n_layers=3, d_model=32, n_heads=4, head_dim=16, d_ff=48)
NAMES = ["W8/S8 · 1 KV · staggered windows", "W8/S4 · 2 KV · staggered windows",
         "W6/S6 · 1 KV · staggered windows · local window 2", "W8/S8 · 2 KV · staggered windows · uncompressed tail"]


def test_grid_offsets_spread_over_the_stride():
    cfg = ModelConfig.from_name("W8/S8 · 1 KV · staggered windows", **SMALL)
    assert [cfg.grid_offset(layer) for layer in range(3)] == [0, 2, 5]
    assert [ModelConfig.from_name("W8/S8 · 1 KV", **SMALL).grid_offset(layer) for layer in range(3)] == [0, 0, 0]


@pytest.mark.parametrize("name", NAMES)
@torch.no_grad()
def test_decode_equals_parallel(name):
    model = PhaseLM(ModelConfig.from_name(name, **SMALL)).eval()
    ids = torch.randint(0, 61, (2, 37))
    ref = model(ids)
    for cuts in (range(1, 38), [5, 6, 19, 37]):
        cache, out, a = model.new_cache(2), [], 0
        for b in cuts:
            out.append(model(ids[:, a:b], cache=cache))
            a = b
        assert (torch.cat(out, 1) - ref).abs().max() <= 1e-5
        for layer, lc in zip(model.layers, cache.layers, strict=True):  # the one visibility rule: complete entries
            assert lc.n_entries == layer.attn.grid.n_complete(37)


@pytest.mark.parametrize("name", NAMES)
@torch.no_grad()
def test_causality(name):
    model = PhaseLM(ModelConfig.from_name(name, **SMALL)).eval()
    ids = torch.randint(0, 61, (1, 40))
    base = model(ids)
    for t in (0, 2, 5, 7, 13, 39):
        changed = ids.clone()
        changed[0, t] = (changed[0, t] + 1) % 61
        out = model(changed)
        assert torch.equal(out[:, :t], base[:, :t])
        assert not torch.equal(out[:, t:], base[:, t:])


@torch.no_grad()
def test_staggered_entry_becomes_visible_when_its_window_completes():
    """One layer, grid offset 0; a second layer at offset 4 (2 layers, S = 8): a token read only through the
    second layer's entry [4..11] (local window 1) changes the output first at t = 11, not at 7."""
    cfg = ModelConfig.from_name("W8/S8 · 1 KV · staggered windows · local window 1", **(SMALL | {"n_layers": 2}))
    model = PhaseLM(cfg).eval()
    for p in model.layers[0].attn.parameters():  # silence layer 0's attention: only layer 1 reads the past
        p.zero_()
    ids = torch.randint(0, 61, (1, 24))
    changed = ids.clone()
    changed[0, 5] = (changed[0, 5] + 1) % 61
    d = (model(changed) - model(ids))[0].abs().amax(-1)  # (T,)
    assert d[5] > 0 and d[6:11].max() == 0 and d[11:].min() > 0
