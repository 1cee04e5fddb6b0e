"""The joint softmax over [visible entries | exact tokens] as fused Triton kernels, forward and backward.

FlashAttention-2 tiling over `Grid`'s rule: for a block of queries the visible entries are a prefix (entry j
is seen by t iff jS + o + W - 1 <= t) and the exact tokens a band (the local window t - n_local < p <= t, or
the uncompressed tail after the newest visible entry), so one program per (query head, query block) runs one
online softmax over the entry prefix and then the band, reading both in place (no concatenated keys, no mask
tensor). The entries every query of the block sees run unmasked; only the ragged edge and the band are
masked. Backward: a dq kernel (the same loops; it also writes rowsum(dO O)) and a key/value-gradient kernel
per (query head, key block, chunk of queries), run over the entry blocks (the column of queries from the
first that sees them to the end, cut into chunks where few blocks would leave the GPU idle) and over the
exact-token blocks (a band of at most `exact_keep` queries); heads and chunks meet by fp32 atomic adds. The
first position is read on the device (no host sync), the longest tiles launch first, and the tiles are
autotuned per (power-of-2 bucket of T, head dim).

Covers every variant of the parallel path: any grid (staggered offsets, the V4 leading partial window, the
uncompressed tail), GQA, tied K/V, attention sinks (a logit in every softmax, value 0: the online softmax
starts from it) and `holds` (entries without a token masked per sequence and KV head). Not the ring of a
cached prompt: that stays on `blockwise_attention` (the layer never sends it here). Both directions are
custom operators (`phasekv::joint_attention`), so that `torch.compile(fullgraph=True)` captures a layer that
calls them.

Without CUDA the kernels run only under Triton's interpreter, which Triton's own switch selects:
TRITON_INTERPRET=1 in the environment before triton is first imported (slow: for equality checks; the tests
set it, `benchmarks/triton_cpu.py` is the switch for scripts).
"""

from __future__ import annotations

import os

import torch

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
if not INTERPRET and not torch.cuda.is_available():
    raise ImportError("the triton kernels need CUDA, or Triton's interpreter (TRITON_INTERPRET=1 in the "
                      "environment before triton is first imported)")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from phasekv.attention.positions import Grid  # noqa: E402

LOG2E = 1.4426950408889634

# Tiles (queries, keys, warps, pipeline stages), the fastest per (power-of-2 bucket of T, head dim, dtypes) picked
# on a kernel's first call there (triton.autotune, ~0.3 s a kernel): head dims of 32-128 and the bands' short key
# runs favour different tiles; the bucket spares evaluation runs of many lengths a tuning per length. Under the
# interpreter one 32 x 32 tile: slow per program, so few programs, and T of 64-200 still spans several tiles.
Q_TILES = ((64, 64, 4, 2), (128, 64, 4, 3))  # forward and dq; two each: every tile compiles (~1 s) once a machine
KV_TILES = ((64, 64, 4, 2), (128, 64, 8, 3))  # key/value gradients
CHUNK_ALIGN = 32 if INTERPRET else 128  # the entry-gradient kernel's query chunks: whole tiles of any size
TUNE = os.environ.get("PHASEKV_TRITON_TUNE", "1") != "0"  # 0: the first tiles only (equality checks: no tuning)
# the optional inputs (`triton.heuristics`): a kernel given None for HOLDS (every entry holds a token) or SINKS
# compiles without them
HOLDS_GIVEN = {"HAS_HOLDS": lambda a: a["HOLDS"] is not None}


def _configs(tiles: tuple[tuple[int, int, int, int], ...]) -> list:
    if INTERPRET:
        return [triton.Config({"BM": 32, "BN": 32}, num_warps=1)]
    tiles = tiles if TUNE else tiles[:1]
    return [triton.Config({"BM": m, "BN": n}, num_warps=w, num_stages=st) for m, n, w, st in tiles]
# ---- the visibility rule, in kernel form (positions.Grid states it; tests hold the two equal) ----
@triton.jit
def _n_visible(t, S, END0):
    """Entries complete by position t: j with jS + END0 <= t (END0 = o + W - 1), t a scalar or a tensor."""
    return tl.maximum(t - END0 + S, 0) // S


@triton.jit
def _sees(t, idx, t0, ENTRY: tl.constexpr, S, END0, LOCAL, TAIL: tl.constexpr):
    """(BM, BN) bool: query at t (BM, 1) sees key idx (1, BN): entry idx, or the exact token at t0 + idx."""
    if ENTRY:
        vis = idx * S + END0 <= t
    else:
        p = idx + t0
        if not TAIL:
            vis = (p <= t) & (p > t - LOCAL)
        else:  # uncompressed tail: after the newest visible entry's end (-1 when none is visible)
            nv = _n_visible(t, S, END0)
            vis = (p <= t) & (p > tl.where(nv > 0, (nv - 1) * S + END0, -1))
    return vis


@triton.jit
def _exact_lo(t, t0, S, END0, LOCAL, TAIL: tl.constexpr):
    """Index (from t0) of the oldest exact token the query at scalar t sees, clamped at 0."""
    if not TAIL:
        lo = t - LOCAL + 1
    else:
        nv = _n_visible(t, S, END0)
        lo = tl.where(nv > 0, (nv - 1) * S + END0 + 1, 0)
    return tl.maximum(lo - t0, 0)


# ---- forward ----
@triton.jit
def _key_tile(kp, vp, HOLDS, hrow, s_kn, start, hi, t, t0, ENTRY: tl.constexpr, MASK: tl.constexpr,
              HAS_HOLDS: tl.constexpr, S, END0, LOCAL, TAIL: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr,
              D: tl.constexpr):
    """The BN keys and values from `start` (k, v at kp, vp; none at or past hi), and which (query at t, key)
    pairs count: the key exists and, with MASK, the query sees it and, with HAS_HOLDS, the entry holds a window
    (HOLDS + hrow: this sequence and KV head's row)."""
    offs_n = start + tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    ok = offs_n < hi
    tile = offs_n[:, None] * s_kn + offs_d[None, :]
    k = tl.load(kp + tile, mask=ok[:, None] & (offs_d[None, :] < D), other=0.0)  # (BN, BD)
    v = tl.load(vp + tile, mask=ok[:, None] & (offs_d[None, :] < D), other=0.0)  # (BN, BD)
    keep = ok[None, :]  # (1, BN), broadcast to (BM, BN) below
    if MASK:
        keep = keep & _sees(t[:, None], offs_n[None, :], t0, ENTRY, S, END0, LOCAL, TAIL)
    if HAS_HOLDS:
        keep = keep & (tl.load(HOLDS + hrow + offs_n, mask=ok, other=0) != 0)[None, :]
    return k, v, keep


@triton.jit
def _fwd_tiles(acc, m_i, l_i, q, t, kp, vp, HOLDS, hrow, s_kn, lo, hi, t0, qk_scale,
               ENTRY: tl.constexpr, MASK: tl.constexpr, HAS_HOLDS: tl.constexpr, S,
               END0, LOCAL, TAIL: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, D: tl.constexpr,
               PREC: tl.constexpr):
    """Online softmax of queries q (BM, BD) at t (BM,) over keys lo..hi-1 (k, v at kp, vp). MASK False: every
    query sees every one of them and lo..hi-1 are whole tiles, so no score is masked (unless by `holds`)."""
    for start in range(lo, hi, BN):
        k, v, keep = _key_tile(kp, vp, HOLDS, hrow, s_kn, start, hi, t, t0, ENTRY, MASK, HAS_HOLDS, S, END0, LOCAL,
                               TAIL, BN, BD, D)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale  # (BM, BN), log2 units
        if MASK or HAS_HOLDS:
            s = tl.where(keep, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC)
        m_i = m_new
    return acc, m_i, l_i


@triton.jit
def _query_block(Q, POS, T, n, s_qb, s_qh, s_qt, s_eb, s_eh, s_kb, s_kh, H: tl.constexpr, G: tl.constexpr, S, END0,
                 LOCAL, TAIL: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, D: tl.constexpr):
    """The forward and dq kernels' prologue: this program's (sequence x query head) bh and query block, its
    queries q (BM, BD) at positions t, the offsets of its KV head's entries and exact tokens, and the ranges its
    queries see: entries 0..n_all-1 (whole tiles) by every one, n_all..n_hi-1 by some, exact tokens lo..x_hi-1
    (indices from the first position t0, read on the device: the host never waits for it)."""
    bh, pid_m = tl.program_id(0), tl.num_programs(1) - 1 - tl.program_id(1)  # every head's longest tiles first
    b, h = bh // H, bh % H
    kvh = h // G
    t0 = tl.load(POS).to(tl.int32)
    offs_m = pid_m * BM + tl.arange(0, BM)
    offs_d = tl.arange(0, BD)
    rows = (offs_m[:, None] < T) & (offs_d[None, :] < D)
    q = tl.load(Q + b * s_qb + h * s_qh + offs_m[:, None] * s_qt + offs_d[None, :], mask=rows, other=0.0)
    t_first, t_last = t0 + pid_m * BM, t0 + tl.minimum(pid_m * BM + BM, T) - 1
    n_all = tl.minimum(_n_visible(t_first, S, END0), n) // BN * BN
    n_hi = tl.minimum(_n_visible(t_last, S, END0), n)
    lo = _exact_lo(t_first, t0, S, END0, LOCAL, TAIL)
    hrow = (b * (H // G) + kvh) * n  # `holds` row of the sequence and KV head
    return (bh, offs_m, rows, q, t0, t0 + offs_m, b * s_eb + kvh * s_eh, b * s_kb + kvh * s_kh, hrow, n_all, n_hi,
            lo, t_last - t0 + 1)


@triton.autotune(_configs(Q_TILES), key=["T_BUCKET", "D"])
@triton.heuristics({**HOLDS_GIVEN, "HAS_SINKS": lambda a: a["SINKS"] is not None})
@triton.jit
def _fwd_kernel(Q, EK, EV, K, V, OUT, LSE, HOLDS, SINKS, POS, qk_scale, T, n, T_BUCKET,
                s_qb, s_qh, s_qt, s_eb, s_eh, s_en, s_kb, s_kh, s_kt, s_ob, s_oh, s_ot,
                H: tl.constexpr, G: tl.constexpr, S, END0, LOCAL, TAIL: tl.constexpr,
                HAS_HOLDS: tl.constexpr, HAS_SINKS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                BD: tl.constexpr, D: tl.constexpr, PREC: tl.constexpr):
    bh, offs_m, rows, q, t0, t, e_off, x_off, hrow, n_all, n_hi, lo, x_hi = _query_block(
        Q, POS, T, n, s_qb, s_qh, s_qt, s_eb, s_eh, s_kb, s_kh, H, G, S, END0, LOCAL, TAIL, BM, BN, BD, D)
    if HAS_SINKS:  # the sink's logit starts every softmax: exp(sink - m) with m = sink
        m_i = tl.zeros([BM], tl.float32) + tl.load(SINKS + bh % H).to(tl.float32) * 1.4426950408889634
        l_i = tl.zeros([BM], tl.float32) + 1.0
    else:
        m_i = tl.zeros([BM], tl.float32) - 1.0e30  # finite: a fully masked tile leaves the state unchanged
        l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, BD], tl.float32)
    acc, m_i, l_i = _fwd_tiles(acc, m_i, l_i, q, t, EK + e_off, EV + e_off, HOLDS, hrow, s_en, 0, n_all, t0,
                               qk_scale, True, False, HAS_HOLDS, S, END0, LOCAL, TAIL, BN, BD, D, PREC)
    acc, m_i, l_i = _fwd_tiles(acc, m_i, l_i, q, t, EK + e_off, EV + e_off, HOLDS, hrow, s_en, n_all, n_hi, t0,
                               qk_scale, True, True, HAS_HOLDS, S, END0, LOCAL, TAIL, BN, BD, D, PREC)
    acc, m_i, l_i = _fwd_tiles(acc, m_i, l_i, q, t, K + x_off, V + x_off, HOLDS, hrow, s_kt, lo, x_hi, t0, qk_scale,
                               False, True, False, S, END0, LOCAL, TAIL, BN, BD, D, PREC)
    l_i = tl.where(offs_m < T, l_i, 1.0)  # rows past the end saw no key (never stored)
    acc = acc / l_i[:, None]
    out = OUT + bh // H * s_ob + bh % H * s_oh + offs_m[:, None] * s_ot + tl.arange(0, BD)[None, :]
    tl.store(out, acc.to(OUT.dtype.element_ty), mask=rows)
    tl.store(LSE + bh * T + offs_m, m_i + tl.log2(l_i), mask=offs_m < T)


# ---- backward ----
@triton.jit
def _dq_tiles(dq, q, do, lse, delta, t, kp, vp, HOLDS, hrow, s_kn, lo, hi, t0, qk_scale,
              ENTRY: tl.constexpr, MASK: tl.constexpr, HAS_HOLDS: tl.constexpr, S,
              END0, LOCAL, TAIL: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, D: tl.constexpr,
              PREC: tl.constexpr):
    for start in range(lo, hi, BN):
        k, v, keep = _key_tile(kp, vp, HOLDS, hrow, s_kn, start, hi, t, t0, ENTRY, MASK, HAS_HOLDS, S, END0, LOCAL,
                               TAIL, BN, BD, D)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale
        p = tl.exp2(s - lse[:, None])  # (BM, BN)
        if MASK or HAS_HOLDS:
            p = tl.where(keep, p, 0.0)
        dp = tl.dot(do, tl.trans(v), input_precision=PREC)
        ds = p * (dp - delta[:, None])
        dq += tl.dot(ds.to(k.dtype), k, input_precision=PREC)
    return dq


@triton.autotune(_configs(Q_TILES), key=["T_BUCKET", "D"])
@triton.heuristics(HOLDS_GIVEN)
@triton.jit
def _dq_kernel(Q, EK, EV, K, V, OUT, DO, DQ, LSE, DELTA, HOLDS, POS, qk_scale, sm_scale, T, n, T_BUCKET,
               s_qb, s_qh, s_qt, s_eb, s_eh, s_en, s_kb, s_kh, s_kt, s_ob, s_oh, s_ot, s_db, s_dh, s_dt,
               H: tl.constexpr, G: tl.constexpr, S, END0, LOCAL, TAIL: tl.constexpr,
               HAS_HOLDS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr, D: tl.constexpr,
               PREC: tl.constexpr):
    bh, offs_m, rows, q, t0, t, e_off, x_off, hrow, n_all, n_hi, lo, x_hi = _query_block(
        Q, POS, T, n, s_qb, s_qh, s_qt, s_eb, s_eh, s_kb, s_kh, H, G, S, END0, LOCAL, TAIL, BM, BN, BD, D)
    b, h, offs_d = bh // H, bh % H, tl.arange(0, BD)
    do = tl.load(DO + b * s_db + h * s_dh + offs_m[:, None] * s_dt + offs_d[None, :], mask=rows, other=0.0)
    o = tl.load(OUT + b * s_ob + h * s_oh + offs_m[:, None] * s_ot + offs_d[None, :], mask=rows, other=0.0)
    delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)  # (BM,) rowsum(dO * O), kept for the dkv kernels
    tl.store(DELTA + bh * T + offs_m, delta, mask=offs_m < T)
    lse = tl.load(LSE + bh * T + offs_m, mask=offs_m < T, other=0.0)
    dq = tl.zeros([BM, BD], tl.float32)
    dq = _dq_tiles(dq, q, do, lse, delta, t, EK + e_off, EV + e_off, HOLDS, hrow, s_en, 0, n_all, t0, qk_scale, True,
                   False, HAS_HOLDS, S, END0, LOCAL, TAIL, BN, BD, D, PREC)
    dq = _dq_tiles(dq, q, do, lse, delta, t, EK + e_off, EV + e_off, HOLDS, hrow, s_en, n_all, n_hi, t0, qk_scale,
                   True, True, HAS_HOLDS, S, END0, LOCAL, TAIL, BN, BD, D, PREC)
    dq = _dq_tiles(dq, q, do, lse, delta, t, K + x_off, V + x_off, HOLDS, hrow, s_kt, lo, x_hi, t0, qk_scale, False,
                   True, False, S, END0, LOCAL, TAIL, BN, BD, D, PREC)
    tl.store(DQ + bh * T * D + offs_m[:, None] * D + offs_d[None, :], (dq * sm_scale).to(DQ.dtype.element_ty),
             mask=rows)


@triton.jit
def _dkv_tiles(dk, dv, k, v, keep_n, offs_n, qp, dop, lp, dlp, s_qt, s_ot, lo, hi, T, t0, qk_scale,
               ENTRY: tl.constexpr, MASK: tl.constexpr, HAS_HOLDS: tl.constexpr, S, END0, LOCAL, TAIL: tl.constexpr,
               BM: tl.constexpr, BD: tl.constexpr, D: tl.constexpr, PREC: tl.constexpr):
    """Key and value gradients of keys k, v (BN, BD) from queries lo..hi-1 of one head (q, dO at qp, dop; lse
    and delta at lp, dlp)."""
    offs_d = tl.arange(0, BD)
    for start in range(lo, hi, BM):
        offs_m = start + tl.arange(0, BM)
        ok = offs_m < hi
        rows = ok[:, None] & (offs_d[None, :] < D)
        q = tl.load(qp + offs_m[:, None] * s_qt + offs_d[None, :], mask=rows, other=0.0)
        do = tl.load(dop + offs_m[:, None] * s_ot + offs_d[None, :], mask=rows, other=0.0)
        lse = tl.load(lp + offs_m, mask=ok, other=0.0)
        delta = tl.load(dlp + offs_m, mask=ok, other=0.0)
        s = tl.dot(q, tl.trans(k), input_precision=PREC) * qk_scale  # (BM, BN)
        p = tl.exp2(s - lse[:, None])
        if MASK or HAS_HOLDS:  # else rows past hi (q, dO, delta loaded 0) and keys past N (not stored) add nothing
            keep = ok[:, None] & keep_n[None, :]
            if MASK:
                keep = keep & _sees((t0 + offs_m)[:, None], offs_n[None, :], t0, ENTRY, S, END0, LOCAL, TAIL)
            p = tl.where(keep, p, 0.0)
        dv += tl.dot(tl.trans(p.to(do.dtype)), do, input_precision=PREC)
        dp = tl.dot(do, tl.trans(v), input_precision=PREC)
        ds = p * (dp - delta[:, None])
        dk += tl.dot(tl.trans(ds.to(q.dtype)), q, input_precision=PREC)
    return dk, dv


@triton.autotune(_configs(KV_TILES), key=["T_BUCKET", "D", "ENTRY"], reset_to_zero=["DK", "DV"])  # zeroed per trial
@triton.heuristics(HOLDS_GIVEN)
@triton.jit
def _dkv_kernel(Q, KX, VX, DO, DK, DV, LSE, DELTA, HOLDS, POS, qk_scale, sm_scale, T, N, n, T_BUCKET, KEEP, CHUNK,
                s_qb, s_qh, s_qt, s_xb, s_xh, s_xn, s_ob, s_oh, s_ot,
                H: tl.constexpr, G: tl.constexpr, ENTRY: tl.constexpr, S, END0, LOCAL,
                TAIL: tl.constexpr, HAS_HOLDS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                BD: tl.constexpr, D: tl.constexpr, PREC: tl.constexpr):
    """Gradients of N keys and values KX, VX (entries, or the T exact tokens) per (sequence x query head, key
    block, chunk of CHUNK queries): over the chunk's queries that see any of them, added (fp32 atomics) into
    DK, DV (B, n_kv, N, D), where the G query heads of a KV head and the chunks meet."""
    bh, pid_n, pid_c = tl.program_id(0), tl.program_id(1), tl.program_id(2)  # heads first: block 0 is longest
    b, h = bh // H, bh % H
    t0 = tl.load(POS).to(tl.int32)
    bkv = b * (H // G) + h // G
    offs_n = pid_n * BN + tl.arange(0, BN)
    offs_d = tl.arange(0, BD)
    cols = (offs_n[:, None] < N) & (offs_d[None, :] < D)
    xo = b * s_xb + (h // G) * s_xh + offs_n[:, None] * s_xn + offs_d[None, :]
    k = tl.load(KX + xo, mask=cols, other=0.0)
    v = tl.load(VX + xo, mask=cols, other=0.0)
    keep_n = offs_n < N
    if HAS_HOLDS:
        keep_n = keep_n & (tl.load(HOLDS + bkv * n + offs_n, mask=offs_n < N, other=0) != 0)
    if ENTRY:  # queries from the first that sees the block's first entry to the end; all see it from m_all on
        m_lo, m_hi = tl.maximum(pid_n * BN * S + END0 - t0, 0), T
        m_all = tl.maximum((tl.minimum(pid_n * BN + BN, N) - 1) * S + END0 - t0, 0)
    else:  # the exact tokens' band: a token at p is seen by at most the KEEP queries p .. p + KEEP - 1
        m_lo, m_hi = pid_n * BN, tl.minimum(pid_n * BN + BN - 1 + KEEP, T)
        m_all = m_hi
    m_lo, m_hi = tl.maximum(m_lo, pid_c * CHUNK), tl.minimum(m_hi, pid_c * CHUNK + CHUNK)
    m_split = tl.minimum(m_lo + tl.maximum(m_all - m_lo + BM - 1, 0) // BM * BM, m_hi)  # masked tiles end
    qp, dop = Q + b * s_qb + h * s_qh, DO + b * s_ob + h * s_oh
    lp, dlp = LSE + bh * T, DELTA + bh * T
    dk = tl.zeros([BN, BD], tl.float32)
    dv = tl.zeros([BN, BD], tl.float32)
    dk, dv = _dkv_tiles(dk, dv, k, v, keep_n, offs_n, qp, dop, lp, dlp, s_qt, s_ot, m_lo, m_split, T, t0, qk_scale,
                        ENTRY, True, HAS_HOLDS, S, END0, LOCAL, TAIL, BM, BD, D, PREC)
    dk, dv = _dkv_tiles(dk, dv, k, v, keep_n, offs_n, qp, dop, lp, dlp, s_qt, s_ot, m_split, m_hi, T, t0, qk_scale,
                        ENTRY, False, HAS_HOLDS, S, END0, LOCAL, TAIL, BM, BD, D, PREC)
    if m_lo < m_hi:
        out = bkv * N * D + offs_n[:, None] * D + offs_d[None, :]
        tl.atomic_add(DK + out, dk * sm_scale, mask=cols)
        tl.atomic_add(DV + out, dv, mask=cols)


# ---- the operators and the entry point ----
def _statics(q: torch.Tensor, k: torch.Tensor, stride: int, end0: int, local: int) -> dict:
    """The kernels' compile-time and grid arguments; local 0: the uncompressed tail."""
    D = q.shape[-1]
    return dict(H=q.shape[1], G=q.shape[1] // k.shape[1], S=stride, END0=end0, LOCAL=local, TAIL=local == 0,
                BD=max(16, triton.next_power_of_2(D)), D=D,
                PREC="ieee" if q.dtype == torch.float32 else "tf32")  # fp32 means fp32 (bf16/fp16 ignore it)


PROGRAMS = 1024  # entry gradients: the query range is split in chunks until about this many programs run


def _query_chunk(T: int, rows: int) -> int:
    """Queries per chunk of the entry-gradient kernel, whose programs are (sequence x head, key block, chunk),
    for `rows` = entries x sequences x heads: the entries of a block are read by every later query, so few
    blocks (short T) would leave most of the GPU idle; their query ranges are split instead."""
    chunks = max(1, min(triton.cdiv(T, CHUNK_ALIGN), PROGRAMS // max(triton.cdiv(rows, 64), 1)))
    return triton.cdiv(triton.cdiv(T, chunks), CHUNK_ALIGN) * CHUNK_ALIGN


def _bucket(T: int) -> int:
    """The autotuning key of a length (the kernels do not read it)."""
    return triton.next_power_of_2(T)


def _strides(x: torch.Tensor) -> tuple[int, int, int]:
    return x.stride(0), x.stride(1), x.stride(2)


def _pair(a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and values as the kernels read them: one set of strides for both, the last one 1 (tied stay tied)."""
    if a.stride(-1) == 1 and (b is a or b.stride() == a.stride()):
        return a, b
    a = a.contiguous()
    return a, a if b is a else b.contiguous()


def _int8(holds: torch.Tensor | None) -> torch.Tensor | None:
    return None if holds is None else holds.to(torch.int8).contiguous()


@torch.library.custom_op("phasekv::joint_attention", mutates_args=())
def joint_attention(q: torch.Tensor, ek: torch.Tensor, ev: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    pos: torch.Tensor, sinks: torch.Tensor | None, holds: torch.Tensor | None, stride: int, end0: int,
                    local: int, keep: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward: o (B, H, T, D) in (B, T, H, D) memory and each softmax's log-sum-exp (B, H, T), log2 units."""
    q = q if q.stride(-1) == 1 else q.contiguous()
    ek, ev = _pair(ek, ev)
    k, v = _pair(k, v)
    B, H, T, D = q.shape
    o, lse = _joint_attention_fake(q, ek, ev, k, v, pos, sinks, holds, stride, end0, local, keep)
    sinks = None if sinks is None else sinks.float().contiguous()
    _fwd_kernel[lambda meta: (B * H, triton.cdiv(T, meta["BM"]))](
        q, ek, ev, k, v, o, lse, _int8(holds), sinks, pos, D**-0.5 * LOG2E, T, ek.shape[2], _bucket(T),
        *_strides(q), *_strides(ek), *_strides(k), *_strides(o), **_statics(q, k, stride, end0, local))
    return o, lse


@joint_attention.register_fake
def _joint_attention_fake(q, ek, ev, k, v, pos, sinks, holds, stride, end0, local, keep):
    B, H, T, D = q.shape
    o = q.new_empty(B, T, H, D).transpose(1, 2)  # (B, H, T, D) in (B, T, H, D) memory: o_proj reads it in place
    return o, q.new_empty(B, H, T, dtype=torch.float32)


@torch.library.custom_op("phasekv::joint_attention_backward", mutates_args=())
def joint_attention_backward(do: torch.Tensor, q: torch.Tensor, ek: torch.Tensor, ev: torch.Tensor, k: torch.Tensor,
                             v: torch.Tensor, o: torch.Tensor, lse: torch.Tensor, pos: torch.Tensor,
                             holds: torch.Tensor | None, stride: int, end0: int, local: int,
                             keep: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq (B, H, T, D); the key and value gradients, fp32 (2, B n_kv (n + T) D): [entries | exact tokens] each;
    rowsum(dO O) (B, H, T)."""
    q = q if q.stride(-1) == 1 else q.contiguous()
    ek, ev = _pair(ek, ev)
    k, v = _pair(k, v)
    do = do if do.stride(-1) == 1 else do.contiguous()
    B, H, T, D = q.shape
    n, st = ek.shape[2], _statics(q, k, stride, end0, local)
    sm_scale = D**-0.5
    dq, acc, delta = _joint_attention_backward_fake(do, q, ek, ev, k, v, o, lse, pos, holds, stride, end0, local, keep)
    holds = _int8(holds)
    _dq_kernel[lambda meta: (B * H, triton.cdiv(T, meta["BM"]))](
        q, ek, ev, k, v, o, do, dq, lse, delta, holds, pos, sm_scale * LOG2E, sm_scale, T, n, _bucket(T),
        *_strides(q), *_strides(ek), *_strides(k), *_strides(o), *_strides(do), **st)
    acc.zero_()
    sizes = [B * k.shape[1] * n * D, B * k.shape[1] * T * D]
    for (entry, kx, vx), part in zip(((True, ek, ev), (False, k, v)), acc.split(sizes, 1), strict=True):
        N = kx.shape[2]
        if N:
            chunk = _query_chunk(T, N * B * H) if entry else T
            _dkv_kernel[lambda meta, N=N, chunk=chunk: (B * H, triton.cdiv(N, meta["BN"]), triton.cdiv(T, chunk))](
                q, kx, vx, do, part[0], part[1], lse, delta, holds if entry else None, pos, sm_scale * LOG2E, sm_scale,
                T, N, n, _bucket(T), keep, chunk, *_strides(q), *_strides(kx), *_strides(do), ENTRY=entry, **st)
    return dq, acc, delta


@joint_attention_backward.register_fake
def _joint_attention_backward_fake(do, q, ek, ev, k, v, o, lse, pos, holds, stride, end0, local, keep):
    B, H, T, D = q.shape
    n_kv, n = k.shape[1], ek.shape[2]
    acc = q.new_empty(2, B * n_kv * (n + T) * D, dtype=torch.float32)
    return q.new_empty(B, H, T, D), acc, q.new_empty(B, H, T, dtype=torch.float32)


def _setup(ctx, inputs, output) -> None:
    q, ek, ev, k, v, pos, sinks, holds, *grid = inputs
    ctx.save_for_backward(q, ek, ev, k, v, *output, pos, sinks, holds)
    ctx.grid = grid
    ctx.set_materialize_grads(False)  # the log-sum-exp's gradient is None, not a tensor of zeros


def _backward(ctx, do, _):
    q, ek, ev, k, v, o, lse, pos, sinks, holds = ctx.saved_tensors
    dq, acc, delta = joint_attention_backward(do, q, ek, ev, k, v, o, lse, pos, holds, *ctx.grid)
    B, n_kv, n, D = ek.shape
    sizes = [B * n_kv * n * D, B * n_kv * k.shape[2] * D]
    (dek, dev), (dk, dv) = (g.view(2, B, n_kv, -1, D).unbind(0) for g in acc.to(k.dtype).split(sizes, 1))
    dsinks = None
    if sinks is not None:  # d sink_h = -sum_{b,t} p_sink delta: the sink's share of each softmax, times -rowsum(dO O)
        p_sink = torch.exp2(sinks.float().view(1, -1, 1) * LOG2E - lse)  # (B, H, T)
        dsinks = -(p_sink * delta).sum((0, 2)).to(sinks.dtype)
    return dq, dek, dev, dk, dv, None, dsinks, None, None, None, None, None


joint_attention.register_autograd(_backward, setup_context=_setup)


def triton_attention(q: torch.Tensor, pos: torch.Tensor, ek: torch.Tensor, ev: torch.Tensor, k: torch.Tensor,
                     v: torch.Tensor, grid: Grid, sinks: torch.Tensor | None = None,
                     holds: torch.Tensor | None = None) -> torch.Tensor:
    """The parallel path in fused kernels; the contract of `blockwise.blockwise_attention` without a ring: q
    (B, H, T, D) at contiguous positions pos (T,), entries ek, ev (B, n_kv, n, D), exact k, v (B, n_kv, T, D)
    -> (B, H, T, D) in (B, T, H, D) memory."""
    return joint_attention(q, ek, ev, k, v, pos, sinks, holds, grid.stride, grid.offset + grid.window - 1,
                           grid.local_window or 0, grid.exact_keep)[0]
