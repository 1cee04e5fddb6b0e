"""Activation Beacon: the interleaved stream, the visibility rule against its definition, the cache holding w / r
entries per completed window, decode == parallel, and the beacon knockout."""

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from phasekv.attention.beacon import BeaconAttention, interleave, rope_position, visible
from tests.attention.family_harness import assert_decode_equals_parallel, every_cut, small_model


def test_interleave_puts_a_beacon_after_every_r_raw_tokens():
    x = torch.arange(1.0, 8.0).view(1, 7, 1)  # raw tokens 0..6 hold 1..7
    stream, slots, raw = interleave(x[:, 2:], 2, 3, torch.zeros(1))  # raw 2..6, r = 3
    assert stream.flatten().tolist() == [3, 0, 4, 5, 6, 0, 7]  # raw 2, beacon 0, raw 3 4 5, beacon 1, raw 6
    assert slots.tolist() == [2, 3, 4, 5, 6, 7, 8] and raw.tolist() == [0, 2, 3, 4, 6]
    assert rope_position(slots, 3).tolist() == [2, 2, 3, 4, 5, 5, 6]  # a beacon at the raw token before it


@pytest.mark.parametrize(("r", "w"), [(2, 4), (3, 6), (4, 4), (1, 3)])
def test_visibility_is_its_definition(r, w):
    s = torch.arange(40)
    knockout = {0}
    got = visible(s, s, r, w, knockout)
    span = w + w // r
    for q in range(40):
        for k in range(40):
            beacon = k % (r + 1) == r
            knocked = (k // (r + 1)) % (w // r) in knockout
            want = k <= q and (k // span == q // span or (beacon and not knocked and k // span < q // span))
            assert bool(got[q, k]) == want, (q, k)


def test_beacon_projections_start_as_copies_and_the_hook_sees_raw_tokens():
    model = small_model("Beacon r2 · window 4 · 2 KV")
    attn = model.layers[1].attn
    assert isinstance(attn, BeaconAttention) and attn.grids() == {"r": 2, "w": 4}
    for mine, layers in ((attn.beacon_q, attn.q_proj), (attn.beacon_k, attn.k_proj), (attn.beacon_v, attn.v_proj)):
        assert torch.equal(mine.weight, layers.weight) and mine.weight is not layers.weight
    seen = []
    attn.z_hook.register_forward_hook(lambda m, a, out: seen.append(out.shape))
    model(torch.randint(0, 61, (2, 9)))
    assert seen == [torch.Size([2, 9, 4, 16])]  # (B, T_raw, H, D)


@pytest.mark.parametrize(("name", "T"), [("Beacon r2 · window 4 · 1 KV", 23), ("Beacon r4 · window 8 · 2 KV", 21),
                                         ("Beacon r1 · window 3 · 4 KV · no RoPE", 14)])
def test_decode_equals_parallel(name, T):
    model = small_model(name)
    ids = torch.randint(0, 61, (2, T))
    for cuts in every_cut(T):
        assert_decode_equals_parallel(model, ids, cuts)


@pytest.mark.parametrize(("r", "w"), [(2, 8), (4, 8), (3, 9)])
def test_cache_keeps_w_over_r_beacons_per_completed_window(r, w):
    model = small_model(f"beacon-r{r}w{w}-1kv")
    ids = torch.randint(0, 61, (1, 3 * w + 2))
    with torch.no_grad():
        cache = model.new_cache(1)
        for t in range(ids.shape[1]):
            model(ids[:, t : t + 1], cache=cache)
            done, inside = (t + 1) // w, (t + 1) % w  # complete windows, raw tokens of the current one
            assert [layer.n for layer in cache.layers] == [done * w // r + inside + inside // r] * 2
        assert cache.layers[0].n == 3 * w // r + 2 + 2 // r


def test_without_beacons_a_window_only_sees_itself():
    """Every beacon knocked out: a window's outputs are those of its tokens alone (RoPE is relative), so nothing
    of an earlier window reaches it but through beacons."""
    model = small_model("Beacon r2 · window 6 · 1 KV")
    for layer in model.layers:
        layer.attn.beacon_knockout = {0, 1, 2}
    ids = torch.randint(0, 61, (2, 17))
    with torch.no_grad():
        whole = model(ids)
        alone = model(ids[:, 12:])
    assert (whole[:, 12:] - alone).abs().max() < 1e-4
    assert (whole[:, 6:12] - model(ids[:, 6:12])).abs().max() < 1e-4


def test_knockout_changes_only_later_windows():
    model = small_model("Beacon r2 · window 6 · 1 KV")
    ids = torch.randint(0, 61, (2, 17))
    with torch.no_grad():
        base = model(ids)
        for layer in model.layers:
            layer.attn.beacon_knockout = {1}
        knocked = model(ids)
    assert (knocked[:, :6] - base[:, :6]).abs().max() == 0  # the first window has no completed window to read
    assert (knocked[:, 6:] - base[:, 6:]).abs().max() > 1e-4


@settings(max_examples=20, deadline=None)
@given(r=st.integers(1, 4), n=st.integers(1, 3), kv=st.sampled_from([1, 2, 4]), T=st.integers(1, 30), data=st.data())
def test_decode_equals_parallel_any_length(r, n, kv, T, data):
    model = small_model(f"beacon-r{r}w{r * n}-{kv}kv")
    ids = torch.randint(0, 61, (1, T))
    cuts = sorted(set(data.draw(st.lists(st.integers(1, T), max_size=4)) + [T]))
    assert_decode_equals_parallel(model, ids, cuts)
