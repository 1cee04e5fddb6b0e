"""The one-token decode step (`decode.step`) equals the reference chunk path, for every variant and every mix of
chunks and single tokens; its pieces (RoPE at one position, the in-place read) equal theirs."""

import pytest
import torch

from phasekv import ModelConfig, PhaseLM
from phasekv.attention import blockwise, decode
from phasekv.attention.positions import Grid
from phasekv.attention.rope import Rope
from phasekv.config.names import PAPER_GRID
from tests.attention.variants import V4_VARIANTS

SMALL = dict(preset="tiny", vocab_size=61, n_layers=2, d_model=32, n_heads=8, head_dim=16, d_ff=48)
VARIANTS = [n for n in PAPER_GRID if "seed" not in n] + [
    "W8/S8 · 1 KV · staggered windows", "W6/S6 · 2 KV · local window 3", "W5/S2 · 1 KV · uncompressed tail",
    "W6/S2 · 2 KV · vector gates · staggered windows · uncompressed tail", *V4_VARIANTS]
CUTS = [1, 2, 3, 11, 12, 13, 14, 30, 31, 32, 33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43]  # singles around chunks


def run(model, ids, cuts, reference: bool):
    """Logits of ids fed in the chunks ending at `cuts`, and the cache's bytes after each chunk."""
    cache, out, sizes, a = model.new_cache(ids.shape[0]), [], [], 0
    with torch.no_grad(), blockwise.use_backend("reference" if reference else "blockwise"):
        for b in cuts:
            out.append(model(ids[:, a:b], cache=cache))
            sizes.append(cache.nbytes)
            a = b
    return torch.cat(out, 1), sizes, cache


@pytest.mark.parametrize("name", VARIANTS)
def test_step_equals_reference(name):
    model = PhaseLM(ModelConfig.from_name(name, **SMALL)).eval()
    ids = torch.randint(0, 61, (2, 43))
    fast, fast_bytes, cache = run(model, ids, CUTS, reference=False)
    ref, ref_bytes, ref_cache = run(model, ids, CUTS, reference=True)
    assert (fast - ref).abs().max() <= 1e-5
    assert fast_bytes == ref_bytes
    assert all(layer.plan is not None for layer in cache.layers)  # the fast step ran
    assert all(layer.plan is None for layer in ref_cache.layers)


def test_step_off_under_autograd():
    """With gradients on, one-token steps take the reference path (the plan would hold copies of weights)."""
    model = PhaseLM(ModelConfig.from_name("W8/S8 · 1 KV", **SMALL))
    cache = model.new_cache(1)
    for i in range(10):
        model(torch.tensor([[i]]), cache=cache)
    assert cache.layers[0].plan is None and not decode.enabled()


@pytest.mark.parametrize("rope", [Rope(16, 1e4), Rope(8, 1e4), Rope(16, 1e4, "trailing"), Rope(6, 100.0, "trailing"),
                                  Rope(0, 1e4)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rope_at_one_position(rope, dtype):
    x = torch.randn(2, 5, 16).to(dtype)  # (B, heads, D)
    for t in (0, 1, 7, 1023, 1024, 5000):
        ref = rope(x[:, :, None], torch.tensor([t]))[:, :, 0]
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        assert (rope.at(x, t).float() - ref.float()).abs().max() <= tol * max(1.0, t / 1000)


@pytest.mark.parametrize("sinks", [False, True])
def test_read_equals_attend_parts(sinks):
    B, H, n_kv, N, R, D = 2, 8, 2, 40, 6, 16
    q, keys, values = torch.randn(B, H, D), torch.randn(B, n_kv, N, D), torch.randn(B, n_kv, N, D)
    visible = torch.tensor([True, False, True, True, False, True])
    sink = torch.randn(H) if sinks else None
    z = decode.read(q * D**-0.5, keys, values, ~visible, sink)
    ref = blockwise.attend_parts(q[:, :, None], [(keys[:, :, :R], values[:, :, :R], visible[None]),
                                                  (keys[:, :, R:], values[:, :, R:], None)], sink)
    assert (z - ref).abs().max() <= 1e-5


@pytest.mark.parametrize("grid", [Grid(8, 8), Grid(8, 4, offset=-4, local_window=None), Grid(6, 3, offset=2, local_window=5),
                                  Grid(5, 2, local_window=None), Grid(8, 8, offset=3, local_window=None)])
def test_ring_masks_follow_grid(grid):
    """The step's periodic ring masks are `Grid.exact_visible` over what the ring holds after each token."""
    masks, keep = decode.RingMasks.build(grid, torch.device("cpu")), grid.exact_keep
    ring = torch.full((keep,), -(2**40))
    for t in range(120):
        ring[t % keep] = t
        pos = torch.tensor([t])
        hidden = masks.at(grid, t, ring)
        want = ~grid.exact_visible(pos, ring)[0]
        assert torch.equal(torch.zeros(keep, dtype=torch.bool) if hidden is None else hidden, want), t


@pytest.mark.parametrize("name", ["W8/S6 · 1 KV", "W5/S2 · 1 KV · uncompressed tail · vector gates",
                                  "W8/S4 · 2 KV · staggered windows · uniform averaging", "W8/S4 · 1 KV · V4 compressor"])
def test_step_updates_windows_in_place(name, monkeypatch):
    """Past a grid's first tokens, one-token steps never fall back to the reference compressor update (any W, S)."""
    from phasekv.attention.attention import Attention

    calls = []
    reference = Attention._extend_entries
    monkeypatch.setattr(Attention, "_extend_entries", lambda self, h, pos, cache: calls.append(int(pos[0])) or
                        reference(self, h, pos, cache))
    cfg = ModelConfig.from_name(name, **SMALL)
    run(PhaseLM(cfg).eval(), torch.randint(0, 61, (1, 60)), list(range(1, 61)), reference=False)
    assert all(t < cfg.window + cfg.stride for t in calls), calls
