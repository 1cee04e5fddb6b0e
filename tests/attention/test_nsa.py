"""NSA: a peer-compatible configuration equals `native-sparse-attention-pytorch` 0.2.3 with weights copied either
way; the fast path and the decode cache equal the plain per-query reference; the branches' limits; bad values."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from native_sparse_attention_pytorch import SparseAttention

from phasekv import ModelConfig
from phasekv.attention.nsa import PEER, PHASEKV, NSAAttention, reference
from phasekv.errors import ConfigError
from tests.attention.family_harness import assert_decode_equals_parallel, every_cut, small_model

TOL = 1e-5


def nsa_config(block=8, stride=4, select=8, top_k=2, window=16, heads=4, kv=2, head_dim=16, width=32, **kw):
    return ModelConfig(family="nsa", block=block, block_stride=stride, select_block=select, top_k=top_k,
                       sliding_window=window, n_heads=heads, n_kv_heads=kv, head_dim=head_dim, d_model=width, **kw)


def randomize(module: torch.nn.Module) -> None:
    """Every trainable weight ~ N(0, 1/fan_in): the zero-initialised memory, positions and gates included."""
    with torch.no_grad():
        for p in module.parameters():
            if p.requires_grad:  # the peer's rotary frequencies are a frozen parameter
                p.normal_(0, p.shape[-1] ** -0.5)


# ---- the peer ----
PEER_CONFIGS = [  # (l, d, l', n, w, heads, kv, head_dim, width): overlap or not, d = l' or not, GQA or not
    (8, 4, 8, 2, 6, 4, 2, 16, 32),
    (4, 4, 4, 3, 9, 4, 1, 8, 24),
    (6, 2, 4, 1, 3, 2, 2, 8, 16),
    (12, 4, 8, 2, 13, 6, 3, 8, 40),
]
LENGTHS = (1, 7, 13, 23, 37, 45, 61)


def pair(block, d, sel, n, w, heads, kv, head_dim, width, norm=False):
    """phasekv's peer-compatible NSA and the peer with the same shape (the peer sees w - 1 tokens besides its own)."""
    cfg = nsa_config(block, d, sel, n, w, heads, kv, head_dim, width, qk_norm=False)
    peer = SparseAttention(dim=width, dim_head=head_dim, heads=heads, sliding_window_size=w - 1,
                           compress_block_size=block, compress_block_sliding_stride=d, selection_block_size=sel,
                           num_selected_blocks=n, kv_heads=kv, causal=True, norm=norm)
    return NSAAttention(cfg, 0, PEER), peer


def peer_names(mine: NSAAttention) -> dict[str, str]:
    """phasekv parameter -> the peer's."""
    names = {"o_proj.weight": "combine_heads.weight", "gate.weight": "to_strategy_combine.0.weight",
             "gate.bias": "to_strategy_combine.0.bias", "k_positions": "k_intrablock_positions",
             "v_positions": "v_intrablock_positions", "memory": "compress_mem_kv"}
    for kv in "kv":  # the MLPs: phasekv Linear-ReLU-Linear, the peer's behind a Rearrange
        for ours, theirs in ((0, 1), (2, 3)):
            names |= {f"{kv}_compress.{ours}.{p}": f"{kv}_compress.{theirs}.{p}" for p in ("weight", "bias")}
    return names


def copy_from_peer(peer: SparseAttention, mine: NSAAttention) -> None:
    state = peer.state_dict()
    cfg = mine.cfg
    q, k, v = state["to_qkv.weight"].split([cfg.n_heads * cfg.head_dim] + [cfg.n_kv_heads * cfg.head_dim] * 2)
    ours = {"q_proj.weight": q, "k_proj.weight": k, "v_proj.weight": v}
    ours |= {a: state[b] for a, b in peer_names(mine).items()}
    mine.load_state_dict(ours)


def copy_to_peer(mine: NSAAttention, peer: SparseAttention) -> None:
    ours = mine.state_dict()
    state = peer.state_dict()
    state["to_qkv.weight"] = torch.cat([ours["q_proj.weight"], ours["k_proj.weight"], ours["v_proj.weight"]])
    state |= {b: ours[a] for a, b in peer_names(mine).items()}
    peer.load_state_dict(state)


@pytest.mark.parametrize("direction", ["peer->phasekv", "phasekv->peer"])
@pytest.mark.parametrize("shape", PEER_CONFIGS, ids=lambda s: "l{}d{}sel{}n{}w{}-{}h{}kv".format(*s[:7]))
@torch.no_grad()
def test_equals_peer(shape, direction):
    mine, peer = pair(*shape)
    if direction == "peer->phasekv":
        randomize(peer)
        copy_from_peer(peer, mine)
    else:
        randomize(mine)
        copy_to_peer(mine, peer)
    lengths = [T for T in LENGTHS if all(T % b for b in shape[:3])]  # T a multiple of no block size
    assert len(lengths) >= 3
    for T in lengths:
        x = torch.randn(2, T, shape[-1])
        err = (mine(x, torch.arange(T)) - peer(x)).abs().max().item()
        assert err <= TOL, f"T={T}: {err:.2e}"


@settings(max_examples=8, deadline=None)
@given(d=st.integers(1, 4), l_mult=st.integers(1, 3), sel_mult=st.integers(1, 3), n=st.integers(1, 4),
       w=st.integers(2, 12), kv=st.sampled_from([1, 2]), group=st.integers(1, 3), T=st.integers(1, 50))
@torch.no_grad()
def test_equals_peer_random(d, l_mult, sel_mult, n, w, kv, group, T):
    shape = (d * l_mult, d, d * sel_mult, n, w, kv * group, kv, 8, 16)
    mine, peer = pair(*shape)
    randomize(peer)
    copy_from_peer(peer, mine)
    x = torch.randn(2, T, 16)
    assert (mine(x, torch.arange(T)) - peer(x)).abs().max().item() <= TOL


@torch.no_grad()
def test_equals_peer_with_its_input_norm():
    """The peer's own RMSNorm is the block's pre-attention norm: applied to the input, the two agree."""
    mine, peer = pair(*PEER_CONFIGS[0], norm=True)
    randomize(peer)
    copy_from_peer(peer, mine)
    x = torch.randn(2, 29, PEER_CONFIGS[0][-1])
    assert (mine(peer.norm(x), torch.arange(29)) - peer(x)).abs().max().item() <= TOL


# ---- the reference ----
REFERENCE_CASES = [  # (config overrides, conventions, branch_gates)
    (dict(), PHASEKV, None),
    (dict(kv=1, top_k=1, window=5), PHASEKV, "sel"),
    (dict(block=6, stride=2, select=4, forced_blocks=True, top_k=3), PHASEKV, None),
    (dict(qk_norm=False, rope_dims=8, window=3), PEER, "cmp+win"),
    (dict(block=12, stride=4, select=8, top_k=3, forced_blocks=True), PEER, None),
]


@pytest.mark.parametrize("overrides,conventions,gates", REFERENCE_CASES,
                         ids=["default", "1kv-top1-sel", "l6d2sel4-forced", "peer-rope8-cmp+win", "peer-l12d4sel8-forced"])
@torch.no_grad()
def test_fast_path_and_decode_equal_reference(overrides, conventions, gates):
    attn = NSAAttention(nsa_config(**overrides), 0, conventions)
    randomize(attn)
    attn.branch_gates = gates
    T = 29
    h = torch.randn(1, T, attn.cfg.d_model)
    ref = reference(attn, h)  # (1, T, d)
    assert (attn(h, torch.arange(T)) - ref).abs().max().item() <= TOL
    cache = attn.new_cache()
    steps = torch.cat([attn(h[:, t : t + 1], torch.arange(t, t + 1), cache) for t in range(T)], 1)
    assert (steps - ref).abs().max().item() <= TOL
    assert (attn(h, torch.arange(T), last=True) - ref[:, -1:]).abs().max().item() <= TOL


@settings(max_examples=20, deadline=None)
@given(d=st.integers(1, 4), l_mult=st.integers(1, 3), sel_mult=st.integers(1, 3), top_k=st.integers(1, 4),
       window=st.integers(1, 12), kv=st.sampled_from([1, 2, 4]), forced=st.booleans(), peer=st.booleans(),
       T=st.integers(1, 40), data=st.data())
@torch.no_grad()
def test_decode_equals_parallel_random(d, l_mult, sel_mult, top_k, window, kv, forced, peer, T, data):
    cfg = nsa_config(block=d * l_mult, stride=d, select=d * sel_mult, top_k=max(top_k, 3) if forced else top_k,
                     window=window, kv=kv, head_dim=8, width=16, forced_blocks=forced)
    attn = NSAAttention(cfg, 0, PEER if peer else PHASEKV)
    randomize(attn)
    h = torch.randn(2, T, 16)
    whole = attn(h, torch.arange(T))
    cuts = sorted(set(data.draw(st.lists(st.integers(1, T), max_size=5)) + [T]))
    cache, out, a = attn.new_cache(), [], 0
    for b in cuts:
        out.append(attn(h[:, a:b], torch.arange(a, b), cache))
        a = b
    assert (torch.cat(out, 1) - whole).abs().max().item() <= TOL
    assert cache.n == T and cache.ck.n == T // d and cache.nbytes > 0


def test_model_decode_equals_parallel():
    """Through PhaseLM (the family's registry): cached chunks and `last` equal the whole forward."""
    model = small_model("NSA l8/d4 · select 8 top 2 · window 16 · 1 KV")
    ids = torch.randint(0, 61, (2, 45))
    for cuts in every_cut(45):
        assert_decode_equals_parallel(model, ids, cuts)


# ---- the branches' limits ----
@torch.no_grad()
def test_selected_and_window_at_their_limits_are_causal_attention():
    """Selecting every block, or a window as long as the sequence, is plain causal attention over the exact
    tokens."""
    T = 37
    for gates, overrides in (("sel", dict(top_k=T)), ("win", dict(window=T))):
        attn = NSAAttention(nsa_config(**overrides), 0)
        randomize(attn)
        attn.branch_gates = gates
        h = torch.randn(2, T, 32)
        pos = torch.arange(T)
        q, k, v = attn.project(h)
        z = F.scaled_dot_product_attention(attn._rope(q, pos), attn._rope(k, pos), v, is_causal=True,
                                           enable_gqa=True)  # (B, H, T, D)
        assert (attn(h, pos) - attn.o_proj(z.transpose(1, 2).flatten(2))).abs().max().item() <= TOL


def test_knockouts_and_grids():
    attn = NSAAttention(nsa_config(), 0)
    assert attn.grids() == {"d": 4, "l'": 8}
    h = torch.randn(1, 20, 32)
    attn.branch_gates = "cmp+sel+win"
    both = attn(h, torch.arange(20))
    parts = []
    for b in ("cmp", "sel", "win"):
        attn.branch_gates = b
        parts.append(attn(h, torch.arange(20)))
    assert (both - sum(parts)).abs().max().item() <= TOL  # o_proj is linear: the branches add up
    for bad in ("", "cmp+local", "all"):
        with pytest.raises(ConfigError, match="branch_gates"):
            attn.branch_gates = bad


# ---- bad values ----
@pytest.mark.parametrize("overrides,field", [  # a ModelConfig error
    (dict(block=6, stride=4), "block_stride"),  # l not a multiple of d
    (dict(select=6), "select_block"),  # l' not a multiple of d
    (dict(window=0), "sliding_window"),
    (dict(top_k=2, forced_blocks=True), "top_k"),
])
def test_bad_values_are_one_line_errors(overrides, field):
    with pytest.raises(ConfigError) as e:
        NSAAttention(nsa_config(**overrides), 0)
    assert field in str(e.value) and "\n" not in str(e.value)


def test_cache_must_continue_its_sequence():
    attn = NSAAttention(nsa_config(), 0)
    cache = attn.new_cache()
    attn(torch.randn(1, 5, 32), torch.arange(5), cache)
    with pytest.raises(ConfigError, match="position 7"):
        attn(torch.randn(1, 1, 32), torch.arange(7, 8), cache)
