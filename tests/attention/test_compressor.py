"""The compressor's training forward (`CompressorBranch.pool` over `tile`d windows) against the paper's formula
written as a loop, and against the streaming partials that decode uses."""

import pytest
import torch

from phasekv.attention.compressor import COMPRESSORS, layer_grid, layer_rope, make_compressor, pool, tile
from phasekv.config import ModelConfig
from phasekv.config import model as config_model
from phasekv.errors import ConfigError
from phasekv.model.transformer import PhaseLM

from .variants import REPAIR_VARIANTS, V4_VARIANTS


@pytest.mark.parametrize("W,S", [(8, 8), (8, 4), (6, 4), (3, 3)])
def test_tile_is_unfold(W, S):
    x = torch.randn(2, 29, 5)
    n = (29 - W) // S + 1
    assert torch.equal(tile(x, W, S, n), x.unfold(1, W, S)[:, :n])
    mask = torch.rand(1, 29) > 0.3
    assert torch.equal(tile(mask, W, S, n), mask.unfold(1, W, S)[:, :n])


def compressor_of(name: str, seed: int = 0):
    torch.manual_seed(seed)
    cfg = ModelConfig.from_name(name, preset="tiny")
    comp = make_compressor(cfg, layer_grid(cfg, 0), layer_rope(cfg))
    for p in comp.parameters():  # gate biases start at zero: make every term matter
        torch.nn.init.normal_(p, std=0.3)
    return cfg, comp


@pytest.mark.parametrize("name", ["W8/S8 · 1 KV", "W8/S4 · 2 KV · vector gates", "W8/S8 · 1 KV · uniform averaging",
                                  "W6/S6 · 1 KV · tied K/V · post-norm"])
def test_pool_is_the_papers_formula(name):
    """K^_j = sum_i softmax_i(Z_i h_{j,i} + b_i) * C_i h_{j,i}, per window j and KV head, looped."""
    cfg, comp = compressor_of(name)
    h = torch.randn(2, 37, cfg.d_model)
    windows, present = comp.windows(h)  # (B, n, W, d)
    assert present is None
    for b in comp.branches():
        payload, gate, bias = b.offset_params()  # (W, n_kv, D, d), (W, n_kv, G, d) or None, (W, n_kv, G) or None
        got = b.pool(windows)  # (B, n_kv, n, D)
        B, n, W, _ = windows.shape
        want = torch.empty_like(got)
        for j in range(n):
            for k in range(cfg.n_kv_heads):
                x = windows[:, j]  # (B, W, d)
                c = torch.stack([x[:, i] @ payload[i, k].T for i in range(W)], 1)  # (B, W, D)
                s = (torch.zeros(B, W, 1) if gate is None else
                     torch.stack([x[:, i] @ gate[i, k].T + (0 if bias is None else bias[i, k]) for i in range(W)], 1))
                pooled = (s.softmax(1) * c).sum(1)  # (B, D)
                want[:, k, j] = pooled if b.post_norm is None else b.post_norm(pooled)
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("name", ["W8/S8 · 1 KV", "W8/S4 · 2 KV · vector gates", "W8/S4 · 2 KV · uniform averaging",
                                  *V4_VARIANTS, *REPAIR_VARIANTS])
def test_pool_equals_streaming_partials(name):
    """One-pass softmax (training) = the partials a decode cache merges token by token, with absent offsets
    (windows reaching before position 0, staggered heads, per-sequence grid jitter)."""
    cfg, comp = compressor_of(name, seed=1)
    h = torch.randn(3, 41, cfg.d_model)
    for shift in (None, torch.tensor([0, 1, 3])):
        for delay, heads in comp.head_groups(shift):
            windows, present = comp.windows(h, delay)
            together = pool(comp.branches(), windows, present, heads)  # every branch from one batched matmul
            for b, entries in zip(comp.branches(), together, strict=True):
                streamed = b.finalize(b.partial(windows, present, heads))
                for got in (entries, b.pool(windows, present, heads)):
                    torch.testing.assert_close(got, streamed, atol=1e-5, rtol=1e-5)


def test_compressor_names_have_one_source(monkeypatch):
    """config's COMPRESSORS is the one list of names: the attention registry is keyed by it (in its order), and
    config validation reads it when it runs, so a name added there is a valid `compressor` with no second list."""
    assert tuple(COMPRESSORS) == config_model.COMPRESSORS
    with pytest.raises(ConfigError, match="compressor='toy'"):
        ModelConfig.from_name("W8/S8 · 1 KV", compressor="toy")
    monkeypatch.setattr(config_model, "COMPRESSORS", (*config_model.COMPRESSORS, "toy"))
    assert ModelConfig.from_name("W8/S8 · 1 KV", compressor="toy").compressor == "toy"


@pytest.mark.parametrize("name", ["W6/S3 · 2 KV · V4 compressor · grid jitter · staggered heads",
                                  "W8/S8 · 2 KV · grid jitter · staggered heads · vector gates"])
def test_window_with_no_present_token_is_a_zero_entry(name):
    """Grid jitter on top of a staggered head's delay can start a window wholly before position 0: its entry is an
    explicit zero in the one-pass pool, in the streaming partials (finalize) and in a decode cache's merge, never
    0/0; a training step through such windows has finite outputs and gradients."""
    cfg, comp = compressor_of(name, seed=2)
    h = torch.randn(cfg.stride, 30, cfg.d_model)
    shift = torch.arange(cfg.stride)  # every jitter: the largest puts head 1's first window before position 0
    empty_seen = False
    for delay, heads in comp.head_groups(shift):
        windows, present = comp.windows(h, delay)
        empty = ~present.expand(cfg.stride, -1, -1).any(-1)  # (B, n) windows with no present token
        empty_seen |= bool(empty.any())
        for b, entries in zip(comp.branches(), pool(comp.branches(), windows, present, heads), strict=True):
            p = b.partial(windows, present, heads)
            streamed = b.finalize(p)
            merged = b.finalize(p.merge(b.partial(windows, torch.zeros_like(present), heads)))  # nothing more seen
            for got in (entries, streamed, merged):  # (B, n_kv of the group, n, D)
                assert not got.isnan().any()
                assert (got.transpose(1, 2)[empty] == 0).all()
                assert (got.transpose(1, 2)[~empty].abs().sum(-1) > 0).all()
    assert empty_seen
    torch.manual_seed(0)
    model = PhaseLM(cfg).train()
    ids = torch.randint(0, cfg.vocab_size, (16, 24))
    out = model(ids)  # (16, 24, V): 16 sequences draw every jitter
    out.logsumexp(-1).mean().backward()
    assert out.isfinite().all()
    assert all(p.grad.isfinite().all() for p in model.parameters() if p.grad is not None)
