"""The repair's model attributes (issue 18): staggered heads, grid jitter, shared payloads."""

import pytest
import torch

from phasekv import ModelConfig, PhaseLM
from phasekv.attention.positions import Grid
from phasekv.errors import ConfigError
from tests.attention.test_decode import SMALL


def _pooled_on(comp, h, grid, heads):
    """Pooled key branch (B, n_kv of heads, n, D) of h on `grid` (the reference: the grid's own windows)."""
    saved = comp.grid
    comp.grid = grid
    try:
        windows, present = comp.windows(h)
        return comp.key.finalize(comp.key.partial(windows, present, heads))
    finally:
        comp.grid = saved


def _pooled(comp, h, shift=None):
    """Pooled key branch (B, n_kv, n, D) of `comp` (entries before the key norm and RoPE)."""
    raw = []
    for delay, heads in comp.head_groups(shift):
        windows, present = comp.windows(h, delay)
        raw.append(comp.key.finalize(comp.key.partial(windows, present, heads)))
    return torch.cat(raw, 1)


@torch.no_grad()
def test_staggered_heads_read_windows_starting_early():
    """KV head h of a staggered layer pools the windows of the grid that starts (h S) // n_kv tokens early; its
    entries keep the layer's count and schedule."""
    cfg = ModelConfig.from_name("W8/S4 · 4 KV · staggered heads", **SMALL)
    assert [cfg.head_delay(h) for h in range(4)] == [0, 1, 2, 3]
    comp = PhaseLM(cfg).layers[0].attn.compressor
    h = torch.randn(2, 37, cfg.d_model)
    got = _pooled(comp, h)  # (2, 4, n, D)
    n = comp.grid.n_complete(37)
    assert got.shape[2] == n
    for head in range(4):
        early = Grid(8, 4, -cfg.head_delay(head))
        ref = _pooled_on(comp, h, early, slice(head, head + 1))[:, :, :n]
        assert torch.allclose(got[:, head : head + 1], ref, atol=1e-6)
    assert not torch.allclose(got[:, 1], _pooled_on(comp, h, comp.grid, slice(1, 2))[:, 0], atol=1e-3)


@torch.no_grad()
def test_grid_jitter_shifts_each_sequence_in_training_only():
    cfg = ModelConfig.from_name("W8/S4 · 1 KV · grid jitter", **SMALL)
    model = PhaseLM(cfg)
    comp = model.layers[0].attn.compressor
    h = torch.randn(3, 30, cfg.d_model)
    shift = torch.tensor([0, 3, 1])
    got = _pooled(comp, h, shift)
    for b, r in enumerate(shift.tolist()):
        ref = _pooled_on(comp, h[b : b + 1], Grid(8, 4, -r), None)[:, :, : got.shape[2]]
        assert torch.allclose(got[b : b + 1], ref, atol=1e-6)
    plain = PhaseLM(cfg.replace(grid_jitter=False))
    plain.load_state_dict(model.state_dict())
    ids = torch.randint(0, 61, (4, 40))
    model.eval(), plain.eval()
    assert torch.equal(model(ids), plain(ids))  # the fixed grid at test time
    model.train()
    torch.manual_seed(1)
    a = model(ids)
    torch.manual_seed(1)
    assert torch.equal(model(ids), a)  # the shifts come from torch's RNG (saved in checkpoints)
    assert not torch.allclose(a, plain(ids))


def test_shared_payload_is_one_matrix_for_every_offset():
    cfg = ModelConfig.from_name("W8/S4 · 1 KV · shared payload", **SMALL)
    branch = PhaseLM(cfg).layers[0].attn.compressor.key
    assert branch.payload.shape[0] == 1
    payload = branch.offset_params()[0]  # (W, n_kv, D, d)
    assert payload.shape[0] == 8 and all(torch.equal(payload[i], payload[0]) for i in range(8))
    assert branch.gate_weight.shape[0] == 8  # gates stay per offset


@pytest.mark.parametrize("name, alias", [("W8/S4 · 2 KV · staggered heads", "w8s4-2kv-hstagger"),
                                         ("W8/S4 · 1 KV · shared payload", "w8s4-1kv-sharedpayload"),
                                         ("W8/S4 · 1 KV · grid jitter", "w8s4-1kv-jitter")])
def test_names(name, alias):
    cfg = ModelConfig.from_name(name)
    assert cfg.name == name and cfg.alias == alias and ModelConfig.from_name(alias) == cfg
    assert cfg.full_attention().name == f"Full attention · {cfg.n_kv_heads} KV"


@pytest.mark.parametrize("name, field", [("W8/S4 · 1 KV · staggered heads", "head_stagger"),
                                         ("W8/S4 · 2 KV · staggered heads · uncompressed tail", "head_stagger"),
                                         ("W8/S4 · 1 KV · grid jitter · uncompressed tail", "grid_jitter"),
                                         ("W8/S4 · 1 KV · V4 compressor · shared payload", "shared_payload")])
def test_invalid_combinations_name_the_field(name, field):
    with pytest.raises(ConfigError, match=field):
        ModelConfig.from_name(name)


@torch.no_grad()
def test_staggered_heads_cache_counts_its_history():
    """The decode cache of staggered heads keeps the last S - 1 hidden states beside entries, partials and ring."""
    model = PhaseLM(ModelConfig.from_name("W8/S4 · 4 KV · staggered heads", **SMALL)).eval()
    plain = PhaseLM(ModelConfig.from_name("W8/S4 · 4 KV", **SMALL)).eval()
    ids = torch.randint(0, 61, (1, 50))
    caches = [m.new_cache(1) for m in (model, plain)]
    for m, c in zip((model, plain), caches, strict=True):
        m(ids, cache=c)
    assert caches[0].nbytes - caches[1].nbytes == 2 * 3 * 32 * 4  # 2 layers x 3 hidden states x d_model x fp32
