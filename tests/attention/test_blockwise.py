"""The blockwise (and flex) compressed attention equal the dense-mask reference, forward and gradients."""

import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from phasekv import ModelConfig, PhaseLM
from phasekv.attention import blockwise
from phasekv.attention.attention import attend
from phasekv.attention.cache import NO_POSITION
from phasekv.attention.positions import Grid
from phasekv.config.names import PAPER_GRID
from phasekv.errors import ConfigError
from tests.attention.variants import REPAIR_VARIANTS, V4_VARIANTS

TOL = 1e-5
SMALL = dict(preset="tiny", vocab_size=61, n_layers=2, d_model=32, n_heads=8, head_dim=16, d_ff=48)
EXTRA = ["W8/S8 · 1 KV · staggered windows", "W6/S6 · 2 KV · local window 3", "W5/S2 · 1 KV · uncompressed tail",
         "W8/S4 · 2 KV · staggered windows · uncompressed tail", *V4_VARIANTS, *REPAIR_VARIANTS]
VARIANTS = [n for n in PAPER_GRID if not n.startswith("Full") and "seed" not in n] + EXTRA


def inputs(B, H, n_kv, T, n, D, tied, ring=0):
    g = torch.Generator().manual_seed(T * 131 + n)
    q = torch.randn(B, H, T, D, generator=g)
    ek, k = torch.randn(B, n_kv, n, D, generator=g), torch.randn(B, n_kv, T, D, generator=g)
    ev = ek if tied else torch.randn(B, n_kv, n, D, generator=g)
    v = k if tied else torch.randn(B, n_kv, T, D, generator=g)
    rk, rv = torch.randn(B, n_kv, ring, D, generator=g), torch.randn(B, n_kv, ring, D, generator=g)
    leaves = [x.requires_grad_() for x in {id(x): x for x in (q, ek, ev, k, v, rk, rv)}.values()]
    return q, ek, ev, k, v, rk, rv, leaves


def reference(q, pos, ek, ev, k, v, grid, rk, rv, rpos):
    j = torch.arange(ek.shape[2])
    mask = grid.mask(pos, j, torch.cat([rpos, pos]))
    return attend(q, torch.cat([ek, rk, k], 2), torch.cat([ev, rv, v], 2), mask)


def assert_same(fast, ref, leaves):
    assert (fast - ref).abs().max() <= TOL
    up = torch.randn_like(ref)
    g_fast = torch.autograd.grad(fast, leaves, up, allow_unused=True)
    g_ref = torch.autograd.grad(ref, leaves, up, allow_unused=True)
    for x, a, b in zip(leaves, g_fast, g_ref, strict=True):
        a, b = (torch.zeros_like(x) if g is None else g for g in (a, b))  # None: the leaf is not read
        assert torch.allclose(a, b, rtol=0, atol=TOL)


@settings(max_examples=60, deadline=None)
@given(W=st.integers(1, 12), S=st.integers(1, 12), o=st.integers(0, 5), T=st.integers(1, 70),
       local=st.sampled_from([None, 1, 3, 16]), kv=st.sampled_from([1, 2, 4]), tied=st.booleans(),
       block=st.sampled_from([1, 5, 16, 128]))
def test_blockwise_equals_reference(W, S, o, T, local, kv, tied, block):
    """S not dividing T, T < W, staggered grids (o > 0), uncompressed tail, GQA, tied K/V, any block size."""
    grid = Grid(W, min(S, W), o, local)
    n = grid.n_complete(T)
    pos = torch.arange(T)
    q, ek, ev, k, v, rk, rv, leaves = inputs(2, 4, kv, T, n, 8, tied)
    fast = blockwise.blockwise_attention(q, pos, ek, ev, k, v, grid, block=block)
    assert_same(fast, reference(q, pos, ek, ev, k, v, grid, rk, rv, pos[:0]), leaves)


@settings(max_examples=30, deadline=None)
@given(W=st.integers(1, 10), S=st.integers(1, 10), t0=st.integers(1, 60), T=st.integers(1, 30),
       local=st.sampled_from([None, 1, 4, 16]), block=st.sampled_from([1, 3, 128]))
def test_blockwise_with_ring_equals_reference(W, S, t0, T, local, block):
    """A decode chunk at t0..t0+T-1 over all entries complete by its end and a ring of earlier exact tokens."""
    grid = Grid(W, min(S, W), 0, local)
    keep = grid.exact_keep
    held = torch.arange(max(0, t0 - keep), t0)
    rpos = torch.full((keep,), NO_POSITION)
    rpos[held % keep] = held  # ring slot order, unwritten slots invisible
    pos = torch.arange(t0, t0 + T)
    q, ek, ev, k, v, rk, rv, leaves = inputs(1, 4, 2, T, grid.n_complete(t0 + T), 8, False, ring=keep)
    fast = blockwise.blockwise_attention(q, pos, ek, ev, k, v, grid, ring=(rk, rv, rpos), block=block)
    assert_same(fast, reference(q, pos, ek, ev, k, v, grid, rk, rv, rpos), leaves)


def test_default_block_size_long_sequence():
    grid = Grid(8, 4, 0, 16)
    T = 700  # several default-size blocks, a short last one
    pos = torch.arange(T)
    q, ek, ev, k, v, rk, rv, leaves = inputs(1, 4, 1, T, grid.n_complete(T), 16, False)
    fast = blockwise.blockwise_attention(q, pos, ek, ev, k, v, grid)
    assert_same(fast, reference(q, pos, ek, ev, k, v, grid, rk, rv, pos[:0]), leaves)


@pytest.mark.parametrize("cached", [True, False])
@pytest.mark.parametrize("kv,sink", [(1, False), (2, False), (4, False), (2, True)])
def test_folded_heads_and_mask_cache_equal_reference(monkeypatch, cached, kv, sink):
    """Short chunks fold the query heads of a KV head into rows over cached masks; long ones (here: the cache
    turned off) run GQA over masks made block by block; both pad keys to `key_align` and equal the reference."""
    if not cached:
        monkeypatch.setattr(blockwise, "MASK_CACHE_TOKENS", 0)
    grid = Grid(8, 4, 1, 5)
    T = 75  # blocks whose key counts are not multiples of 16
    pos = torch.arange(T)
    q, ek, ev, k, v, rk, rv, leaves = inputs(2, 4, kv, T, grid.n_complete(T), 8, False)
    sinks = torch.randn(4, requires_grad=True) if sink else None
    fast = blockwise.blockwise_attention(q, pos, ek, ev, k, v, grid, block=16, sinks=sinks)
    j = torch.arange(ek.shape[2])
    ref = attend(q, torch.cat([ek, k], 2), torch.cat([ev, v], 2), grid.mask(pos, j, pos), sinks)
    assert_same(fast, ref, leaves + ([sinks] if sink else []))


def test_masks_first_made_in_inference_mode_train():
    """The mask cache's tensors are plain ones even when an evaluation (inference mode) made them first."""
    grid = Grid(8, 8, 0, 16)
    q, ek, ev, k, v, rk, rv, leaves = inputs(1, 4, 1, 40, grid.n_complete(40), 8, False)
    blockwise._cached_block_masks.cache_clear()
    with torch.inference_mode():
        blockwise.blockwise_attention(q.detach(), torch.arange(40), ek.detach(), ev.detach(), k.detach(), v.detach(),
                                      grid)
    fast = blockwise.blockwise_attention(q, torch.arange(40), ek, ev, k, v, grid)
    assert_same(fast, reference(q, torch.arange(40), ek, ev, k, v, grid, rk, rv, torch.arange(0)), leaves)


def model_outputs(model, ids, backend):
    model.zero_grad()
    torch.manual_seed(0)  # grid jitter draws its training shifts: the same ones for both backends
    with blockwise.use_backend(backend):
        logits = model(ids)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("name", VARIANTS)
def test_model_blockwise_equals_reference(name):
    cfg = ModelConfig.from_name(name, **SMALL)
    model = PhaseLM(cfg)
    ids = torch.randint(0, 61, (2, 157))  # no stride divides 157
    with blockwise.use_backend("blockwise"):
        assert blockwise.backend() == "blockwise"
    fast, g_fast = model_outputs(model, ids, "blockwise")
    ref, g_ref = model_outputs(model, ids, "reference")
    assert (fast - ref).abs().max() <= TOL
    assert g_fast.keys() == g_ref.keys()
    for n in g_ref:
        assert (g_fast[n] - g_ref[n]).abs().max() <= TOL, n


@pytest.mark.parametrize("name", ["W8/S8 · 1 KV", "W8/S4 · 2 KV · staggered windows", "W5/S2 · 1 KV · uncompressed tail",
                                  "DeepSeek-style kernel"])
@torch.no_grad()
def test_model_flex_equals_reference(name):
    """FlexAttention's block mask (eager on CPU: forward only) shows the same keys as the dense mask."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    model = PhaseLM(ModelConfig.from_name(name, **SMALL)).eval()
    ids = torch.randint(0, 61, (2, 150))
    with blockwise.use_backend("reference"):
        ref = model(ids)
    with blockwise.use_backend("flex"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert (model(ids) - ref).abs().max() <= TOL


def test_unknown_backend_is_a_config_error():
    with pytest.raises(ConfigError, match="backend 'dense'"), blockwise.use_backend("dense"):
        pass
    assert blockwise.backend() == "blockwise"


# ---- decode: long prompts through the cache take the blockwise path, single tokens read the cache in place ----
@pytest.mark.parametrize("name", ["W8/S8 · 1 KV", "W8/S4 · 2 KV · staggered windows", "W5/S2 · 1 KV · uncompressed tail",
                                  "DeepSeek-style kernel", "W8/S8 · 1 KV · uniform averaging · tied K/V · post-norm",
                                  "Full attention · 4 KV"])
@torch.no_grad()
def test_long_prompt_then_decode_equals_parallel(name):
    from phasekv.attention.attention import DECODE_CHUNK

    model = PhaseLM(ModelConfig.from_name(name, **SMALL)).eval()
    ids = torch.randint(0, 61, (3, DECODE_CHUNK + 83))
    with blockwise.use_backend("reference"):
        ref = model(ids)
    cache = model.new_cache(3)
    cuts = [DECODE_CHUNK + 5, DECODE_CHUNK + 6, DECODE_CHUNK + 7, DECODE_CHUNK + 40, *range(DECODE_CHUNK + 41, ids.shape[1] + 1)]
    out, a = [], 0
    for b in cuts:  # a long prompt (blockwise), single tokens (in place), a mid-size chunk, single tokens again
        out.append(model(ids[:, a:b], cache=cache))
        a = b
    assert (torch.cat(out, 1) - ref).abs().max() <= TOL


def test_token_partial_is_partial_of_a_lone_token():
    cfg = ModelConfig.from_name("W8/S4 · 2 KV · vector gates", **SMALL)
    model = PhaseLM(cfg)
    branch = model.layers[0].attn.compressor.key
    h = torch.randn(2, cfg.d_model)
    offsets = torch.tensor([5, 1])  # the token at offset 5 of one window and 1 of the next
    windows = torch.zeros(2, 2, cfg.window, cfg.d_model)
    present = torch.zeros(2, cfg.window, dtype=torch.bool)
    for w, i in enumerate(offsets.tolist()):
        windows[:, w, i], present[w, i] = h, True
    want, got = branch.partial(windows, present), branch.token_partial(h, offsets)
    for a, b in [(want.m, got.m), (want.z, got.z), (want.acc, got.acc)]:
        assert torch.allclose(a, b, rtol=0, atol=1e-6)


@settings(max_examples=30, deadline=None)
@given(Tq=st.integers(1, 6), parts=st.lists(st.integers(0, 20), min_size=1, max_size=3), kv=st.sampled_from([1, 2, 4]))
def test_attend_parts_equals_one_softmax(Tq, parts, kv):
    q = torch.randn(2, 4, Tq, 8)
    sets = [(torch.randn(2, kv, n, 8), torch.randn(2, kv, n, 8), torch.rand(Tq, n) < 0.7) for n in parts]
    sets.append((torch.randn(2, kv, 1, 8), torch.randn(2, kv, 1, 8), None))  # every query sees >= 1 key
    full_mask = torch.cat([torch.ones(Tq, 1, dtype=torch.bool) if m is None else m for _, _, m in sets], 1)
    ref = attend(q, torch.cat([k for k, _, _ in sets], 2), torch.cat([v for _, v, _ in sets], 2), full_mask)
    assert (blockwise.attend_parts(q, sets) - ref).abs().max() <= TOL


@pytest.mark.parametrize("cached,kv,sink", [(True, 2, False), (False, 2, True), (True, 1, True), (False, 4, False)])
def test_entries_without_a_token_are_masked_per_sequence(monkeypatch, cached, kv, sink):
    """`holds` (B, n_kv, n) masks, per sequence and KV head, the entries whose windows hold no token (grid jitter past
    a staggered head's delay): the blockwise path (folded rows over cached masks, or GQA rows) equals the reference
    over the same mask, forward and gradients, and a masked entry's key and value change nothing."""
    if not cached:
        monkeypatch.setattr(blockwise, "MASK_CACHE_TOKENS", 0)
    grid = Grid(8, 4, 1, 5)
    T = 75
    pos = torch.arange(T)
    q, ek, ev, k, v, rk, rv, leaves = inputs(3, 4, kv, T, grid.n_complete(T), 8, False)
    holds = torch.ones(3, kv, ek.shape[2], dtype=torch.bool)
    holds[1, -1, :2] = holds[2, 0, :1] = False  # the first windows of one head in two sequences
    sinks = torch.randn(4, requires_grad=True) if sink else None
    fast = blockwise.blockwise_attention(q, pos, ek, ev, k, v, grid, block=16, sinks=sinks, holds=holds)
    j = torch.arange(ek.shape[2])
    mask = grid.mask(pos, j, pos) & F.pad(holds, (0, T), value=True)[:, :, None, None]  # (3, kv, 1, T, n + T)
    ref = attend(q, torch.cat([ek, k], 2), torch.cat([ev, v], 2), mask, sinks)
    assert_same(fast, ref, leaves + ([sinks] if sink else []))
    other = torch.where(holds[..., None], ek, torch.randn_like(ek) * 100)  # masked entries: anything at all
    again = blockwise.blockwise_attention(q, pos, other, torch.where(holds[..., None], ev, 7.0), k, v, grid,
                                          block=16, sinks=sinks, holds=holds)
    assert (again - fast).abs().max() <= TOL
    unmasked = blockwise.blockwise_attention(q, pos, other, ev, k, v, grid, block=16, sinks=sinks)
    assert (unmasked - fast).abs().max() > 1e-2  # the test can tell a masked entry from a seen one


def test_jittered_staggered_heads_train_the_same_on_every_backend():
    """A training forward whose jitter puts a staggered head's first windows before position 0: the blockwise,
    reference and (eager) flex paths mask the same entries; outputs and gradients agree and are finite."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    model = PhaseLM(ModelConfig.from_name("W8/S8 · 2 KV · grid jitter · staggered heads", **SMALL))
    comp = model.layers[0].attn.compressor
    # head 1 reads 4 tokens late: a jitter of 4 or more puts its first window (positions 0-7) before position 0
    assert comp.holds_token(3, torch.tensor([0, 4, 7])).tolist() == [[[True] * 3] * 2, *[[[True] * 3,
                                                                                        [False, True, True]]] * 2]
    assert comp.holds_token(3, None) is None and comp.holds_token(3, torch.tensor([3, 0])) is None
    ids = torch.randint(0, 61, (8, 40))  # 8 sequences: some draw a jitter of 4 or more
    fast, g_fast = model_outputs(model, ids, "blockwise")
    ref, g_ref = model_outputs(model, ids, "reference")
    assert fast.isfinite().all() and (fast - ref).abs().max() <= TOL
    for n in g_ref:
        assert g_fast[n].isfinite().all() and (g_fast[n] - g_ref[n]).abs().max() <= TOL, n
    torch.manual_seed(0)
    with blockwise.use_backend("flex"), warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")
        assert (model(ids) - ref).abs().max() <= TOL
