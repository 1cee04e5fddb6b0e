"""The compressed decode cache gives the parallel forward's logits, for every variant."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from phasekv import ModelConfig, PhaseLM
from phasekv.config.names import PAPER_GRID
from tests.attention.variants import REPAIR_VARIANTS, V4_VARIANTS

SMALL = dict(preset="tiny", vocab_size=61, n_layers=2, d_model=32, n_heads=8, head_dim=16, d_ff=48)
VARIANTS = PAPER_GRID + ["W8/S8 · 1 KV · staggered windows", "W6/S6 · 2 KV · local window 3", "W5/S2 · 1 KV · uncompressed tail",
                         *V4_VARIANTS, *REPAIR_VARIANTS]


def decode_all(model, ids, chunks):
    cache = model.new_cache(ids.shape[0])
    out, a = [], 0
    for b in chunks:
        out.append(model(ids[:, a:b], cache=cache))
        a = b
    return torch.cat(out, 1), cache


@pytest.mark.parametrize("name", VARIANTS)
@torch.no_grad()
def test_decode_equals_parallel(name):
    cfg = ModelConfig.from_name(name, **SMALL)
    model = PhaseLM(cfg).eval()
    ids = torch.randint(0, 61, (2, 43))  # 43: no stride divides it
    ref = model(ids)
    steps, cache = decode_all(model, ids, range(1, 44))
    assert (steps - ref).abs().max() <= 1e-5
    chunked, _ = decode_all(model, ids, [3, 4, 17, 30, 43])
    assert (chunked - ref).abs().max() <= 1e-5
    assert cache.pos == 43


@settings(max_examples=25, deadline=None)
@given(W=st.integers(1, 10), S=st.integers(1, 10), T=st.integers(1, 40), local=st.sampled_from([None, 1, 2, 5, 16]),
       kv=st.sampled_from([1, 2, 4]), gate=st.sampled_from(["scalar", "vector", "uniform"]), heads=st.booleans(),
       data=st.data())
@torch.no_grad()
def test_decode_equals_parallel_random(W, S, T, local, kv, gate, heads, data):
    S = min(S, W)
    cfg = ModelConfig(vocab_size=37, n_layers=2, d_model=24, n_heads=4, n_kv_heads=kv, head_dim=8, d_ff=32,
                      window=W, stride=S, local_window=local, gate=gate,
                      head_stagger=heads and kv > 1 and local is not None)
    model = PhaseLM(cfg).eval()
    ids = torch.randint(0, 37, (2, T))
    cuts = sorted(set(data.draw(st.lists(st.integers(1, T), max_size=4)) + [T]))
    out, _ = decode_all(model, ids, cuts)
    assert (out - model(ids)).abs().max() <= 1e-5


@pytest.mark.parametrize("name", ["W8/S8 · 1 KV", "W8/S4 · 1 KV", "W8/S8 · 1 KV · uncompressed tail", "Full attention · 1 KV",
                                  "DeepSeek-style kernel"])
def test_causality(name):
    """Changing the token at t never changes outputs before t, compressed branch included."""
    cfg = ModelConfig.from_name(name, **SMALL)
    model = PhaseLM(cfg).eval()
    ids = torch.randint(0, 61, (1, 40))
    base = model(ids)
    for t in (0, 7, 8, 15, 23, 39):
        changed = ids.clone()
        changed[0, t] = (changed[0, t] + 1) % 61
        out = model(changed)
        assert torch.equal(out[:, :t], base[:, :t])
        assert not torch.equal(out[:, t:], base[:, t:])


def test_compressed_branch_carries_old_tokens():
    """A token outside the local window still changes later outputs through its compressed entry."""
    cfg = ModelConfig.from_name("W8/S8 · 1 KV · local window 2", **(SMALL | {"n_layers": 1}))
    model = PhaseLM(cfg).eval()
    ids = torch.randint(0, 61, (1, 40))
    changed = ids.clone()
    changed[0, 3] = (changed[0, 3] + 1) % 61
    # position 3 sits in entry 0 (visible from t=7) and in the local window of t=3,4 only
    d = (model(changed) - model(ids))[0].abs().amax(-1)  # (T,)
    assert d[3:5].min() > 0 and d[5:7].max() == 0 and d[7:].min() > 0


def test_cache_bytes_scale_with_stride():
    from phasekv.model.cli import cache_bytes

    for name, ratio in [("W8/S8 · 1 KV", 1 / 8), ("W8/S4 · 1 KV", 1 / 4), ("W8/S4 · 2 KV · staggered heads", 1 / 4)]:
        cfg = ModelConfig.from_name(name, **SMALL)
        model = PhaseLM(cfg).eval()
        T = 512
        with torch.no_grad():
            _, cache = decode_all(model, torch.randint(0, 61, (1, T)), [T - 1, T])
        full = cache_bytes(cfg.full_attention(), T)
        assert cache.nbytes == cache_bytes(cfg, T)
        assert ratio < cache.nbytes / full < ratio + (16 + cfg.window + 1) / T


@pytest.mark.parametrize("name", ["Full attention · 1 KV", *VARIANTS])
@torch.no_grad()
def test_last_position_equals_the_whole_forward(name):
    """`last=True` (an evaluation's query: the last layer runs for the last position only) gives the last
    position's logits of the whole forward, for every variant and lengths around the window grid."""
    model = PhaseLM(ModelConfig.from_name(name, **SMALL)).eval()
    for T in (1, 7, 16, 17, 43):
        ids = torch.randint(0, 61, (3, T))
        assert (model(ids, last=True) - model(ids)[:, -1]).abs().max() <= 1e-5


@settings(max_examples=25, deadline=None)
@given(W=st.integers(1, 10), S=st.integers(1, 10), T=st.integers(1, 40), local=st.sampled_from([None, 1, 2, 5, 16]),
       kv=st.sampled_from([1, 2, 4]), gate=st.sampled_from(["scalar", "vector", "uniform"]), heads=st.booleans())
@torch.no_grad()
def test_last_position_equals_the_whole_forward_random(W, S, T, local, kv, gate, heads):
    cfg = ModelConfig(vocab_size=37, n_layers=2, d_model=24, n_heads=4, n_kv_heads=kv, head_dim=8, d_ff=32,
                      window=W, stride=min(S, W), local_window=local, gate=gate,
                      head_stagger=heads and kv > 1 and local is not None)
    model = PhaseLM(cfg).eval()
    ids = torch.randint(0, 37, (2, T))
    assert (model(ids, last=True) - model(ids)[:, -1]).abs().max() <= 1e-5


def test_last_position_with_a_hook_on_the_last_layer_runs_every_position():
    """A hook on the last layer (a knockout, a capture) sees the shapes of the whole forward."""
    model = PhaseLM(ModelConfig.from_name("W8/S4 · 1 KV", **SMALL)).eval()
    ids = torch.randint(0, 61, (2, 30))
    seen = []
    handle = model.layers[-1].attn.z_hook.register_forward_hook(lambda m, a, out: seen.append(out.shape))
    with torch.no_grad():
        got = model(ids, last=True)
    handle.remove()
    assert seen == [torch.Size([2, 30, 8, 16])]
    assert (got - model(ids)[:, -1]).abs().max() <= 1e-5
    with pytest.raises(Exception, match="no cache"):
        model(ids, cache=model.new_cache(2), last=True)
