"""MoBA: the block selection and attention against a plain per-query loop, the paper's two limits (top-1 is causal
block-diagonal attention, top-k >= blocks is full causal attention), the oracle-block knockout, and the decode cache."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from phasekv.attention.moba import MoBAAttention, block_means, moba_attention
from phasekv.errors import ConfigError
from tests.attention.family_harness import assert_decode_equals_parallel, every_cut, small_model


def loop_reference(q, k, v, block, top_k, oracle=None):
    """MoBA written from the published algorithm, one query at a time: q (B, H, T, D), k, v (B, n_kv, T, D)."""
    B, H, T, D = q.shape
    g = H // k.shape[1]
    out = torch.zeros_like(q)
    for b in range(B):
        for h in range(H):
            kk, vv = k[b, h // g], v[b, h // g]  # (T, D)
            for t in range(T):
                own = t // block
                scores = {j: float(q[b, h, t].double() @ kk[j * block : (j + 1) * block].double().mean(0))
                          for j in range(own)}  # earlier blocks: q · mean key
                forced = [own] + ([int(oracle[b])] if oracle is not None and int(oracle[b]) < own else [])
                rest = sorted((j for j in scores if j not in forced), key=lambda j: -scores[j])
                chosen = set(forced) | set(rest[: max(0, top_k - len(forced))])
                keys = [s for s in range(t + 1) if s // block in chosen]
                w = torch.softmax(kk[keys] @ q[b, h, t] * D**-0.5, 0)
                out[b, h, t] = w @ vv[keys]
    return out


def random_qkv(B=2, H=4, n_kv=2, T=23, D=8):
    return torch.randn(B, H, T, D), torch.randn(B, n_kv, T, D), torch.randn(B, n_kv, T, D)


def run(q, k, v, block, top_k, oracle=None):
    return moba_attention(q, torch.arange(q.shape[2]), k, v, block_means(k, block), block, top_k, oracle)


@pytest.mark.parametrize(("block", "top_k", "n_kv"), [(4, 2, 2), (5, 3, 1), (3, 1, 4), (8, 2, 1), (2, 4, 2)])
def test_equals_the_per_query_loop(block, top_k, n_kv):
    q, k, v = random_qkv(n_kv=n_kv)
    assert (run(q, k, v, block, top_k) - loop_reference(q, k, v, block, top_k)).abs().max() < 1e-5


def test_top_1_is_causal_block_diagonal_attention():
    q, k, v = random_qkv(T=29)
    t = torch.arange(29)
    mask = (t[None] <= t[:, None]) & (t[None] // 4 == t[:, None] // 4)  # (T, T)
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)
    assert (run(q, k, v, 4, 1) - ref).abs().max() < 1e-6


@pytest.mark.parametrize("top_k", [8, 9, 100])  # 29 tokens in blocks of 4: 8 blocks
def test_top_k_at_least_the_blocks_is_full_causal_attention(top_k):
    q, k, v = random_qkv(T=29)
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    assert (run(q, k, v, 4, top_k) - ref).abs().max() < 1e-6


def test_oracle_block_is_chosen_in_place_of_the_lowest_ranked():
    q, k, v = random_qkv(T=31)
    oracle = torch.tensor([2, 5])
    out = run(q, k, v, 3, 3, oracle)
    assert (out - loop_reference(q, k, v, 3, 3, oracle)).abs().max() < 1e-5
    assert (out[:, :, :9] - run(q, k, v, 3, 3)[:, :, :9]).abs().max() == 0  # queries up to block 2 cannot see it


def test_oracle_needs_top_2_and_one_block_per_sequence():
    model = small_model("MoBA B4 top 1 · 1 KV")
    attn = model.layers[0].attn
    assert isinstance(attn, MoBAAttention) and attn.grids() == {"B": 4}
    attn.oracle_blocks = torch.tensor([0, 1])
    with pytest.raises(ConfigError, match="top_k >= 2"):
        model(torch.randint(0, 61, (2, 9)))


@pytest.mark.parametrize("name", ["MoBA B4 top 2 · 1 KV", "MoBA B3 top 3 · 2 KV", "MoBA B5 top 1 · 4 KV · no RoPE"])
def test_decode_equals_parallel(name):
    model = small_model(name)
    ids = torch.randint(0, 61, (2, 23))  # 23: no block size divides it
    for cuts in every_cut(23):
        cache = assert_decode_equals_parallel(model, ids, cuts)
    layer = cache.layers[0]
    B = model.config.block
    assert (layer.k.n, layer.means.n) == (23, 23 // B)  # every key kept, one mean key per complete block


@settings(max_examples=20, deadline=None)
@given(block=st.integers(1, 7), top_k=st.integers(1, 5), kv=st.sampled_from([1, 2, 4]), T=st.integers(1, 30),
       data=st.data())
def test_decode_equals_parallel_any_length(block, top_k, kv, T, data):
    model = small_model(f"moba-b{block}k{top_k}-{kv}kv")
    ids = torch.randint(0, 61, (1, T))
    cuts = sorted(set(data.draw(st.lists(st.integers(1, T), max_size=4)) + [T]))
    assert_decode_equals_parallel(model, ids, cuts)
