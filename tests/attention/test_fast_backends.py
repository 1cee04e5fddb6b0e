"""The CUDA backends checked on the CPU: the fused Triton kernels (under Triton's interpreter) and FlexAttention's
cached block mask equal the dense-mask reference, forward and q/k/v/entry/sink gradients."""

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from phasekv import ModelConfig, PhaseLM
from phasekv.attention import blockwise
from phasekv.attention.attention import attend
from phasekv.attention.positions import Grid
from tests.attention.test_blockwise import assert_same, inputs, model_outputs


def dense_reference(q, pos, ek, ev, k, v, grid, sinks=None, holds=None):
    mask = grid.mask(pos, torch.arange(ek.shape[2]), pos)  # (T, n + T)
    if holds is not None:  # per sequence and KV head: (B, n_kv, 1, T, n + T)
        mask = mask & F.pad(holds, (0, k.shape[2]), value=True)[:, :, None, None]
    return attend(q, torch.cat([ek, k], 2), torch.cat([ev, v], 2), mask, sinks)


# (name, grid, KV heads, T, t0, tied K/V, sinks, holds): T not a multiple of the interpreter's 32-query tiles
CASES = [
    ("W8/S8 · 1 KV", Grid(8, 8, 0, 16), 1, 100, 0, False, False, False),
    ("W8/S4 · 2 KV · staggered windows, entries without a token", Grid(8, 4, 2, 16), 2, 75, 0, False, False, True),
    ("W5/S2 · 1 KV · uncompressed tail", Grid(5, 2, 0, None), 1, 67, 0, False, False, False),
    ("W2/S1 · 1 KV: whole tiles of entries every query of a tile sees (unmasked)", Grid(2, 1, 0, 16), 1, 100, 0,
     False, False, False),
    ("W8/S4 · V4 leading window · sink · tied K/V, at t0 = 9", Grid(8, 4, -4, 16), 1, 50, 9, True, True, False),
    ("W6/S3 · 2 KV · V4 · uncompressed tail · sink, entries without a token", Grid(6, 3, -3, None), 2, 45, 0, False,
     True, True),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_triton_kernels_equal_reference(case):
    pytest.importorskip("triton", reason="the triton package is not installed")
    _, grid, kv, T, t0, tied, sink, hold = case
    pos = torch.arange(t0, t0 + T)
    H = 2 * kv  # two query heads per KV head: GQA, and few programs (the interpreter is slow per program)
    q, ek, ev, k, v, _, _, leaves = inputs(1, H, kv, T, grid.n_complete(t0 + T), 16, tied)
    sinks = torch.randn(H, requires_grad=True) if sink else None
    holds = None
    if hold:
        holds = torch.ones(1, kv, ek.shape[2], dtype=torch.bool)
        holds[0, -1, :2] = False  # the first windows of the last KV head hold no token
    fast = blockwise.triton_attention(q, pos, ek, ev, k, v, grid, sinks=sinks, holds=holds)
    assert fast.shape == q.shape and fast.transpose(1, 2).is_contiguous()  # o_proj reads (B, T, H, D) in place
    assert_same(fast, dense_reference(q, pos, ek, ev, k, v, grid, sinks, holds), leaves + ([sinks] if sink else []))


def test_model_on_triton_backend_equals_reference():
    """The layer's dispatch: a model trained on the triton backend has the reference's logits and gradients."""
    pytest.importorskip("triton", reason="the triton package is not installed")
    cfg = ModelConfig.from_name("W8/S4 · 2 KV · staggered windows · attention sink", preset="tiny", vocab_size=61,
                                n_layers=1, d_model=32, n_heads=4, head_dim=8, d_ff=48)
    model = PhaseLM(cfg)
    ids = torch.randint(0, 61, (1, 40))  # two 32-query tiles, the second short
    fast, g_fast = model_outputs(model, ids, "triton")
    ref, g_ref = model_outputs(model, ids, "reference")
    assert (fast - ref).abs().max() <= 1e-5
    assert g_fast.keys() == g_ref.keys()
    for n in g_ref:
        assert (g_fast[n] - g_ref[n]).abs().max() <= 1e-5, n


@settings(max_examples=40, deadline=None)
@given(W=st.integers(1, 12), S=st.integers(1, 12), o=st.integers(-6, 5), T=st.integers(1, 130),
       t0=st.sampled_from([0, 7]), local=st.sampled_from([None, 1, 5, 16, 40]))
def test_flex_block_mask_is_the_rule(W, S, o, T, t0, local):
    """The block mask made per pair of tiles (16 here) shows every query exactly `Grid.mask`'s keys: a full tile
    is all visible, a missing one none, a partial one by the mask_mod."""
    pytest.importorskip("torch.nn.attention.flex_attention")
    S = min(S, W)
    grid = Grid(W, S, max(o, -S), local)
    n = grid.n_complete(t0 + T)
    block = 16
    mask = blockwise.flex_block_mask(grid, t0, T, n, torch.device("cpu"), block)
    n_pad = -(-n // block) * block
    pos = torch.arange(t0, t0 + T)
    truth = grid.mask(pos, torch.arange(n), pos)
    truth = torch.cat([truth[:, :n], truth.new_zeros(T, n_pad - n), truth[:, n:]], 1)  # (T, n_pad + T)

    def tiles(count, index):  # BlockMask's (1, 1, Qb), (1, 1, Qb, Kb) -> (T, n_pad + T) per element
        dense = torch.zeros(index.shape[-2:], dtype=torch.bool)
        for i, c in enumerate(count[0, 0].tolist()):
            dense[i, index[0, 0, i, :c].long()] = True
        return dense.repeat_interleave(block, 0).repeat_interleave(block, 1)[:T, : n_pad + T]

    full = tiles(mask.full_kv_num_blocks, mask.full_kv_indices)
    partial = tiles(mask.kv_num_blocks, mask.kv_indices)
    assert not (full & partial).any()
    rule = mask.mask_mod(0, 0, torch.arange(T)[:, None], torch.arange(n_pad + T)[None, :])
    assert torch.equal(full | (partial & rule), truth)


def test_triton_kernels_in_half_precision():
    """fp16 inputs (the interpreter cannot multiply bf16; the GPU check covers it): output and gradients within
    fp16's rounding of the fp32 reference on the same inputs, relative to the largest value."""
    pytest.importorskip("triton", reason="the triton package is not installed")
    grid, T = Grid(8, 4, 2, 16), 70
    pos = torch.arange(T)
    q, ek, ev, k, v, _, _, _ = inputs(1, 2, 1, T, grid.n_complete(T), 16, False)
    halves = [x.detach().half().requires_grad_() for x in (q, ek, ev, k, v)]
    singles = [x.detach().float().requires_grad_() for x in halves]
    fast = blockwise.triton_attention(halves[0], pos, *halves[1:], grid)
    ref = dense_reference(singles[0], pos, *singles[1:], grid)
    up = torch.randn_like(ref)
    got = [fast, *torch.autograd.grad(fast, halves, up.half())]
    want = [ref, *torch.autograd.grad(ref, singles, up)]
    for a, b in zip(got, want, strict=True):
        assert a.dtype == torch.float16
        assert (a.float() - b).abs().max() <= 1e-2 * b.abs().max()


@pytest.mark.slow
@settings(max_examples=25, deadline=None)
@given(W=st.integers(1, 12), S=st.integers(1, 12), o=st.integers(-6, 5), T=st.integers(1, 80),
       t0=st.sampled_from([0, 5]), local=st.sampled_from([None, 1, 3, 16, 40]), kv=st.sampled_from([1, 2]),
       tied=st.booleans(), sink=st.booleans())
def test_triton_kernels_on_random_grids(W, S, o, T, t0, local, kv, tied, sink):
    """Any grid (S = 1, W = S, a leading partial window, local windows of 1 to past T), GQA, tied K/V, sinks."""
    pytest.importorskip("triton", reason="the triton package is not installed")
    S = min(S, W)
    grid = Grid(W, S, max(o, -S), local)
    pos = torch.arange(t0, t0 + T)
    q, ek, ev, k, v, _, _, leaves = inputs(1, 2, kv, T, grid.n_complete(t0 + T), 8, tied)
    sinks = torch.randn(2, requires_grad=True) if sink else None
    fast = blockwise.triton_attention(q, pos, ek, ev, k, v, grid, sinks=sinks)
    assert_same(fast, dense_reference(q, pos, ek, ev, k, v, grid, sinks), leaves + ([sinks] if sink else []))


def test_a_fused_kernel_that_fails_here_falls_back_to_the_reference(monkeypatch, capsys):
    """A kernel that cannot run on this machine (a Triton that cannot compile it): the reference runs instead, the
    reason said once on stderr, and the kernel is not tried again."""
    monkeypatch.setattr(blockwise, "FAILED", {})
    tries = []

    def broken():
        tries.append(1)
        raise RuntimeError("cannot compile\ndetails")

    assert blockwise.guarded("compressor", broken, lambda: "reference") == "reference"
    assert blockwise.guarded("compressor", broken, lambda: "again") == "again" and tries == [1]
    assert "fused Triton compressor failed here (RuntimeError: cannot compile); running the reference" in \
        capsys.readouterr().err
