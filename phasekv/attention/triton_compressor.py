"""A compressed layer's compressor as fused Triton kernels: its entries (forward and backward) and a decode step's
update of its in-flight windows. `Compressor.entries` and `decode.extend` stay the truth: tests hold these equal
to them, under Triton's interpreter on a CPU.

Entries. One program per (block of BM windows, sequence x KV head, branch) does what `Compressor.entries` does
in ~25 operations: for each offset i of its windows, the tokens (read in place from h, `delay` + `shift` tokens
back: staggered heads, grid jitter; absent before position 0) projected onto the offset's payload and gate rows,
tile by tile of d; an online softmax over the offsets (per channel with vector gates); then the pooled entry's
post-norm and, on the key branch, the layer's key norm and RoPE at the entry's position. The backward recomputes
the projections from the saved log-sum-exp and pooled payload and adds the gradients of h and of every weight
into one fp32 workspace (atomics: windows of W > S share tokens, every program shares the weights). One launch
forward, two backward (zeroing the workspace, the kernel), for every variant of the paper's and V4's compressors
(gates scalar, vector or none, biases and phase bands, shared payloads, tied K/V, post-norm, staggered heads,
grid jitter, any grid, RoPE in either layout or none). Both directions are custom operators
(`phasekv::compress`), so that a compiled layer captures them.

Runs on CUDA, or under Triton's interpreter (TRITON_INTERPRET=1: see `triton_kernel`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from phasekv.attention.compressor import Compressor
from phasekv.attention.rope import inv_freq
from phasekv.attention.triton_kernel import INTERPRET, TUNE

# (windows, channels of d, warps, stages): head dims of 32-128 at d_model 256-1024 (fewer windows where the head
# is wide: a program holds ~5 (windows, head dim) fp32 tiles); the first when not tuning
TILES = ((32, 64, 4, 2), (64, 32, 4, 2), (16, 64, 4, 2))


def _configs() -> list:
    if INTERPRET:
        return [triton.Config({"BM": 16, "BC": 32}, num_warps=1)]
    return [triton.Config({"BM": m, "BC": c}, num_warps=w, num_stages=st) for m, c, w, st in TILES[: None if TUNE else 1]]


OPTIONAL = {"HAS_SHIFT": lambda a: a["SHIFT"] is not None, "GATED": lambda a: a["ZK"] is not None,
            "KEY_BIAS": lambda a: a["KB"] is not None, "VALUE_BIAS": lambda a: a["VB"] is not None,
            "POST": lambda a: a["NK"] is not None, "KNORM": lambda a: a["QN"] is not None,
            "TWO": lambda a: a["PV"] is not None}


# ---- pieces shared by the forward and the backward ----
@triton.jit
def _logits(H, hrow, src, present, P, Z, BIAS, i, hd, n_kv, s_pw, d, s_ht, GATED: tl.constexpr, VEC: tl.constexpr,
            HAS_BIAS: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, BC: tl.constexpr, D: tl.constexpr,
            DOT: tl.constexpr, PREC: tl.constexpr):
    """Payloads c (BM, BD) and gate logits s (BM, BD; a scalar gate's repeated per channel) of offset i for the
    tokens at src (BM,) of the sequence at H + hrow (the absent ones read as 0), KV head hd."""
    offs_c = tl.arange(0, BD)
    p_row = i * s_pw + hd * D * d
    c = tl.zeros([BM, BD], tl.float32)
    if VEC:
        z_row = (i * n_kv + hd) * D * d
        s = tl.zeros([BM, BD], tl.float32)
    else:
        z_row = (i * n_kv + hd) * d
        s = tl.zeros([BM], tl.float32)
    for k0 in range(0, d, BC):
        kk = k0 + tl.arange(0, BC)
        x = tl.load(H + hrow + src[:, None] * s_ht + kk[None, :], mask=present[:, None] & (kk < d)[None, :],
                    other=0.0).to(DOT)  # (BM, BC)
        rows = (kk < d)[:, None] & (offs_c < D)[None, :]
        p = tl.load(P + p_row + offs_c[None, :] * d + kk[:, None], mask=rows, other=0.0)  # (BC, BD): C_i transposed
        c += tl.dot(x, p.to(DOT), input_precision=PREC)
        if GATED:
            if VEC:
                z = tl.load(Z + z_row + offs_c[None, :] * d + kk[:, None], mask=rows, other=0.0)  # (BC, BD)
                s += tl.dot(x, z.to(DOT), input_precision=PREC)
            else:
                z = tl.load(Z + z_row + kk, mask=kk < d, other=0.0).to(DOT)  # (BC,)
                s += tl.sum(x.to(tl.float32) * z.to(tl.float32)[None, :], 1)
    if HAS_BIAS:
        if VEC:
            s += tl.load(BIAS + (i * n_kv + hd) * D + offs_c, mask=offs_c < D, other=0.0).to(tl.float32)[None, :]
        else:
            s += tl.load(BIAS + i * n_kv + hd).to(tl.float32)
    if not VEC:
        s = s[:, None] + tl.zeros([BM, BD], tl.float32)
    return c, s


@triton.jit
def _rms(u, NW, eps, BD: tl.constexpr, D: tl.constexpr):
    """RMSNorm of rows u (BM, BD) (channels past D are 0) with weight NW: the rows, u / rms(u), 1 / rms(u)."""
    offs_c = tl.arange(0, BD)
    rstd = tl.rsqrt(tl.sum(u * u, 1) / D + eps)  # (BM,)
    uh = u * rstd[:, None]
    w = tl.load(NW + offs_c, mask=offs_c < D, other=0.0).to(tl.float32)
    return uh * w[None, :], uh, rstd


@triton.jit
def _rms_back(dy, uh, rstd, NW, DNW, BD: tl.constexpr, D: tl.constexpr):
    """The gradient of `_rms`'s input from dy (BM, BD); its weight's gradient added into DNW."""
    offs_c = tl.arange(0, BD)
    wdy = dy * tl.load(NW + offs_c, mask=offs_c < D, other=0.0).to(tl.float32)[None, :]
    tl.atomic_add(DNW + offs_c, tl.sum(dy * uh, 0), mask=offs_c < D)
    return rstd[:, None] * (wdy - uh * (tl.sum(wdy * uh, 1) / D)[:, None])


@triton.jit
def _rope(pos, INV, ROT: tl.constexpr, LEADING: tl.constexpr, BD: tl.constexpr, D: tl.constexpr):
    """RoPE at positions pos (BM,) as `rope.Rope` states it: cos, sin (BM, BD) per channel (1 and 0 on the
    unrotated ones) and the signed pair swap R (BD, BD), (x R)[c] = sign_c x[partner_c]: rotate-half pairs on the
    first ROT channels (LEADING), else interleaved pairs on the last ROT."""
    c = tl.arange(0, BD)
    if LEADING:
        rot = c < ROT
        f = c % (ROT // 2)
        partner = tl.where(c < ROT // 2, c + ROT // 2, c - ROT // 2)
        sign = tl.where(c < ROT // 2, -1.0, 1.0)
    else:
        rot = (c >= D - ROT) & (c < D)
        f = (c - (D - ROT)) // 2
        partner = c ^ 1  # D - ROT is even
        sign = tl.where((c - (D - ROT)) % 2 == 0, -1.0, 1.0)
    ang = pos.to(tl.float32)[:, None] * tl.load(INV + f, mask=rot, other=0.0)[None, :]  # (BM, BD)
    cos = tl.where(rot[None, :], tl.cos(ang), 1.0)
    sin = tl.where(rot[None, :], tl.sin(ang), 0.0)
    R = tl.where((c[:, None] == partner[None, :]) & rot[None, :], sign[None, :], 0.0)  # R[c', c]
    return cos, sin, R


@triton.jit
def _lse_store(LSE, row, offs_j, okj, lse, VEC: tl.constexpr, BD: tl.constexpr, D: tl.constexpr):
    offs_c = tl.arange(0, BD)
    if VEC:
        tl.store(LSE + (row + offs_j[:, None]) * D + offs_c[None, :], lse, mask=okj[:, None] & (offs_c < D)[None, :])
    else:  # every channel holds the window's one value
        tl.store(LSE + row + offs_j, tl.max(lse, 1), mask=okj)


@triton.jit
def _lse_load(LSE, row, offs_j, okj, VEC: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, D: tl.constexpr):
    offs_c = tl.arange(0, BD)
    if VEC:
        lse = tl.load(LSE + (row + offs_j[:, None]) * D + offs_c[None, :], mask=okj[:, None] & (offs_c < D)[None, :],
                      other=0.0)
    else:
        lse = tl.load(LSE + row + offs_j, mask=okj, other=0.0)[:, None] + tl.zeros([BM, BD], tl.float32)
    return lse


# ---- entries: forward ----
@triton.jit
def _windows(DELAY, SHIFT, n, n_kv, S, OFFSET, HAS_SHIFT: tl.constexpr, BM: tl.constexpr):
    """A program's (sequence x KV head) bh, branch, sequence, KV head, windows j (BM,), where in h each window's
    offset 0 reads (the head's windows start `delay` tokens early: staggered heads; the sequence's `shift`: grid
    jitter) and its row of the pooled payloads and log-sum-exps (branch, sequence, KV head)."""
    pid, bh, br = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    b, hd = bh // n_kv, bh % n_kv
    offs_j = pid * BM + tl.arange(0, BM)
    back = tl.load(DELAY + hd)
    if HAS_SHIFT:
        back += tl.load(SHIFT + b).to(tl.int32)
    return bh, br, b, hd, offs_j, offs_j * S + OFFSET - back, (br * tl.num_programs(1) + bh) * n


@triton.jit
def _fwd_block(H, hrow, start, offs_j, okj, P, Z, BIAS, NW, QN, INV, OUT, POOL, LSE, row, hd, n_kv, s_pw, d, s_ht,
               S, OFFSET, ROPE_AT, W, eps, qk_eps, KEY: tl.constexpr, GATED: tl.constexpr, VEC: tl.constexpr,
               HAS_BIAS: tl.constexpr, POST: tl.constexpr, KNORM: tl.constexpr, ROT: tl.constexpr,
               LEADING: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, BC: tl.constexpr, D: tl.constexpr,
               DOT: tl.constexpr, PREC: tl.constexpr):
    """One branch's entries of BM windows j (the tokens of offset i at start + i): pooled in one online softmax over
    the offsets, post-normed and, on the key branch, key-normed and rotated; stored at OUT (the sequence and KV
    head's), with the pooled payload and the log-sum-exp the backward reads at `row` (the branch's too)."""
    offs_c = tl.arange(0, BD)
    m = tl.zeros([BM, BD], tl.float32) - 1.0e30  # finite: an absent token (logit -inf) leaves the state as it is
    z = tl.zeros([BM, BD], tl.float32)  # softmax normaliser
    acc = tl.zeros([BM, BD], tl.float32)
    for i in range(W):
        present = okj & (start + i >= 0)
        c, s = _logits(H, hrow, start + i, present, P, Z, BIAS, i, hd, n_kv, s_pw, d, s_ht, GATED, VEC, HAS_BIAS, BM,
                       BD, BC, D, DOT, PREC)
        s = tl.where(present[:, None], s, float("-inf"))
        m_new = tl.maximum(m, s)
        alpha, p = tl.exp(m - m_new), tl.exp(s - m_new)
        z = z * alpha + p
        acc = acc * alpha + p * c
        m = m_new
    pooled = acc / tl.where(z > 0, z, 1.0)  # a window holding no token: an explicit zero entry
    cols = okj[:, None] & (offs_c < D)[None, :]
    tl.store(POOL + (row + offs_j[:, None]) * D + offs_c[None, :], pooled, mask=cols)
    _lse_store(LSE, row, offs_j, okj, m + tl.log(tl.maximum(z, 1e-30)), VEC, BD, D)  # ~-1e30: no token
    y = _entry(pooled, offs_j * S + OFFSET + ROPE_AT, NW, QN, INV, eps, qk_eps, KEY, POST, KNORM, ROT, LEADING, BD, D)
    tl.store(OUT + offs_j[:, None] * D + offs_c[None, :], y.to(OUT.dtype.element_ty), mask=cols)


@triton.jit
def _entry(y, pos, NW, QN, INV, eps, qk_eps, KEY: tl.constexpr, POST: tl.constexpr, KNORM: tl.constexpr,
           ROT: tl.constexpr, LEADING: tl.constexpr, BD: tl.constexpr, D: tl.constexpr):
    """Entries from pooled payloads y (BM, BD) as `Compressor.entry_kv` makes them: post-normed and, on the key
    branch, key-normed and rotated to their positions pos (BM,)."""
    if POST:
        y, _, _ = _rms(y, NW, eps, BD, D)
    if KEY:
        if KNORM:
            y, _, _ = _rms(y, QN, qk_eps, BD, D)
        if ROT > 0:
            cos, sin, R = _rope(pos, INV, ROT, LEADING, BD, D)
            y = y * cos + tl.dot(y, R, input_precision="ieee") * sin  # exact: R holds one +-1 per column
    return y


@triton.autotune(_configs(), key=["d", "W", "D"])
@triton.heuristics(OPTIONAL)
@triton.jit
def _fwd_kernel(H, DELAY, SHIFT, PK, ZK, KB, NK, PV, ZV, VB, NV, QN, INV, OUTK, OUTV, POOL, LSE, n, d, s_hb, s_ht,
                s_pw, n_kv, S, OFFSET, ROPE_AT, W, eps, qk_eps, VEC: tl.constexpr, ROT: tl.constexpr,
                LEADING: tl.constexpr, HAS_SHIFT: tl.constexpr, GATED: tl.constexpr, KEY_BIAS: tl.constexpr,
                VALUE_BIAS: tl.constexpr, POST: tl.constexpr, KNORM: tl.constexpr, TWO: tl.constexpr,
                BM: tl.constexpr, BD: tl.constexpr, BC: tl.constexpr, D: tl.constexpr, DOT: tl.constexpr,
                PREC: tl.constexpr):
    bh, br, b, hd, offs_j, start, row = _windows(DELAY, SHIFT, n, n_kv, S, OFFSET, HAS_SHIFT, BM)
    if br == 0:
        _fwd_block(H, b * s_hb, start, offs_j, offs_j < n, PK, ZK, KB, NK, QN, INV, OUTK + bh * n * D, POOL, LSE,
                   row, hd, n_kv, s_pw, d, s_ht, S, OFFSET, ROPE_AT, W, eps, qk_eps, True, GATED, VEC, KEY_BIAS, POST,
                   KNORM, ROT, LEADING, BM, BD, BC, D, DOT, PREC)
    if TWO:
        if br == 1:
            _fwd_block(H, b * s_hb, start, offs_j, offs_j < n, PV, ZV, VB, NV, QN, INV, OUTV + bh * n * D, POOL,
                       LSE, row, hd, n_kv, s_pw, d, s_ht, S, OFFSET, ROPE_AT, W, eps, qk_eps, False, GATED, VEC,
                       VALUE_BIAS, POST, KNORM, ROT, LEADING, BM, BD, BC, D, DOT, PREC)


# ---- entries: backward ----
@triton.jit
def _entry_back(dy, pooled, pos, NW, QN, INV, DNW, DQN, eps, qk_eps, KEY: tl.constexpr, POST: tl.constexpr,
                KNORM: tl.constexpr, ROT: tl.constexpr, LEADING: tl.constexpr, BD: tl.constexpr, D: tl.constexpr):
    """The pooled payload's gradient (BM, BD) from its entry's dy: back through RoPE, the key norm and the
    post-norm (recomputed from the pooled payload); the norms' weight gradients added into DNW, DQN."""
    u = pooled
    if POST:
        u, uh1, r1 = _rms(pooled, NW, eps, BD, D)
    if KEY:
        if KNORM:
            _, uh2, r2 = _rms(u, QN, qk_eps, BD, D)
        if ROT > 0:
            cos, sin, R = _rope(pos, INV, ROT, LEADING, BD, D)
            dy = dy * cos + tl.dot(dy * sin, tl.trans(R), input_precision="ieee")  # R is a rotation: R^-1 = R^T
        if KNORM:
            dy = _rms_back(dy, uh2, r2, QN, DQN, BD, D)
    if POST:
        dy = _rms_back(dy, uh1, r1, NW, DNW, BD, D)
    return dy


@triton.jit
def _offset_grads(H, hrow, dhrow, src, present, dc, ds, P, Z, WS, OFF_P, OFF_Z, OFF_B, i, hd, n_kv, s_pw, d, s_ht,
                  GATED: tl.constexpr, VEC: tl.constexpr, HAS_BIAS: tl.constexpr, BD: tl.constexpr, BC: tl.constexpr,
                  D: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr):
    """Offset i's share of the gradients, from its payloads' dc and gate logits' ds (BM, BD, per channel): into the
    workspace WS, the tokens' dh (at dhrow) and the offset's payload, gate and bias rows (at OFF_P, OFF_Z, OFF_B)."""
    offs_c = tl.arange(0, BD)
    p_row = i * s_pw + hd * D * d
    if GATED:
        if VEC:
            z_row = (i * n_kv + hd) * D * d
            if HAS_BIAS:
                tl.atomic_add(WS + OFF_B + (i * n_kv + hd) * D + offs_c, tl.sum(ds, 0), mask=offs_c < D)
        else:
            z_row = (i * n_kv + hd) * d
            ds1 = tl.sum(ds, 1)  # (BM,) a scalar gate's: the sum over its channels
            if HAS_BIAS:
                tl.atomic_add(WS + OFF_B + i * n_kv + hd, tl.sum(ds1, 0))
    for k0 in range(0, d, BC):
        kk = k0 + tl.arange(0, BC)
        tokens = present[:, None] & (kk < d)[None, :]
        rows = (offs_c < D)[:, None] & (kk < d)[None, :]  # (BD, BC)
        x = tl.load(H + hrow + src[:, None] * s_ht + kk[None, :], mask=tokens, other=0.0).to(DOT)  # (BM, BC)
        p = tl.load(P + p_row + offs_c[:, None] * d + kk[None, :], mask=rows, other=0.0).to(DOT)  # (BD, BC)
        dx = tl.dot(dc.to(DOT), p, input_precision=PREC)  # (BM, BC)
        tl.atomic_add(WS + OFF_P + p_row + offs_c[:, None] * d + kk[None, :],
                      tl.dot(tl.trans(dc.to(DOT)), x, input_precision=PREC), mask=rows)
        if GATED:
            if VEC:
                z = tl.load(Z + z_row + offs_c[:, None] * d + kk[None, :], mask=rows, other=0.0).to(DOT)  # (BD, BC)
                dx += tl.dot(ds.to(DOT), z, input_precision=PREC)
                tl.atomic_add(WS + OFF_Z + z_row + offs_c[:, None] * d + kk[None, :],
                              tl.dot(tl.trans(ds.to(DOT)), x, input_precision=PREC), mask=rows)
            else:
                z = tl.load(Z + z_row + kk, mask=kk < d, other=0.0).to(DOT).to(tl.float32)  # (BC,)
                dx += ds1[:, None] * z[None, :]
                tl.atomic_add(WS + OFF_Z + z_row + kk, tl.sum(ds1[:, None] * x.to(tl.float32), 0), mask=kk < d)
        tl.atomic_add(WS + dhrow + src[:, None] * d + kk[None, :], dx, mask=tokens)


@triton.jit
def _bwd_block(H, hrow, dhrow, start, offs_j, okj, P, Z, BIAS, NW, QN, INV, DOUT, POOL, LSE, WS, OFF_P, OFF_Z, OFF_B,
               OFF_N, OFF_QN, row, hd, n_kv, s_pw, d, s_ht, S, OFFSET, ROPE_AT, W, eps, qk_eps, KEY: tl.constexpr,
               GATED: tl.constexpr, VEC: tl.constexpr, HAS_BIAS: tl.constexpr, POST: tl.constexpr,
               KNORM: tl.constexpr, ROT: tl.constexpr, LEADING: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr,
               BC: tl.constexpr, D: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr):
    """One branch's gradients from BM windows' entries: each offset's softmax share alpha = exp(s - lse), then
    d payload = alpha dpool and d logit = alpha dpool (c - pooled) (summed over the channels of a scalar gate)."""
    offs_c = tl.arange(0, BD)
    cols = okj[:, None] & (offs_c < D)[None, :]
    dy = tl.load(DOUT + offs_j[:, None] * D + offs_c[None, :], mask=cols, other=0.0).to(tl.float32)
    pooled = tl.load(POOL + (row + offs_j[:, None]) * D + offs_c[None, :], mask=cols, other=0.0)
    lse = _lse_load(LSE, row, offs_j, okj, VEC, BM, BD, D)
    dpool = _entry_back(dy, pooled, offs_j * S + OFFSET + ROPE_AT, NW, QN, INV, WS + OFF_N, WS + OFF_QN, eps, qk_eps, KEY,
                        POST, KNORM, ROT, LEADING, BD, D)
    for i in range(W):
        present = okj & (start + i >= 0)
        c, s = _logits(H, hrow, start + i, present, P, Z, BIAS, i, hd, n_kv, s_pw, d, s_ht, GATED, VEC, HAS_BIAS, BM,
                       BD, BC, D, DOT, PREC)
        dc = tl.where(present[:, None], tl.exp(s - lse), 0.0) * dpool  # (BM, BD)
        _offset_grads(H, hrow, dhrow, start + i, present, dc, dc * (c - pooled), P, Z, WS, OFF_P, OFF_Z, OFF_B, i, hd,
                      n_kv, s_pw, d, s_ht, GATED, VEC, HAS_BIAS, BD, BC, D, DOT, PREC)


@triton.autotune(_configs(), key=["d", "W", "D"], reset_to_zero=["WS"])  # the workspace is zeroed for every trial
@triton.heuristics(OPTIONAL)
@triton.jit
def _bwd_kernel(H, DELAY, SHIFT, PK, ZK, KB, NK, PV, ZV, VB, NV, QN, INV, DOUTK, DOUTV, POOL, LSE, WS, OFF_PK, OFF_ZK, OFF_KB,
                OFF_NK, OFF_PV, OFF_ZV, OFF_VB, OFF_NV, OFF_QN, T, n, d, s_hb, s_ht, s_pw, n_kv, S, OFFSET, ROPE_AT, W,
                eps, qk_eps, VEC: tl.constexpr, ROT: tl.constexpr, LEADING: tl.constexpr, HAS_SHIFT: tl.constexpr,
                GATED: tl.constexpr, KEY_BIAS: tl.constexpr, VALUE_BIAS: tl.constexpr, POST: tl.constexpr,
                KNORM: tl.constexpr, TWO: tl.constexpr, BM: tl.constexpr, BD: tl.constexpr, BC: tl.constexpr,
                D: tl.constexpr, DOT: tl.constexpr, PREC: tl.constexpr):
    bh, br, b, hd, offs_j, start, row = _windows(DELAY, SHIFT, n, n_kv, S, OFFSET, HAS_SHIFT, BM)
    if br == 0:
        _bwd_block(H, b * s_hb, b * T * d, start, offs_j, offs_j < n, PK, ZK, KB, NK, QN, INV, DOUTK + bh * n * D,
                   POOL, LSE, WS,
                   OFF_PK, OFF_ZK, OFF_KB, OFF_NK, OFF_QN, row, hd, n_kv, s_pw, d, s_ht, S, OFFSET, ROPE_AT, W, eps, qk_eps,
                   True, GATED, VEC, KEY_BIAS, POST, KNORM, ROT, LEADING, BM, BD, BC, D, DOT, PREC)
    if TWO:
        if br == 1:
            _bwd_block(H, b * s_hb, b * T * d, start, offs_j, offs_j < n, PV, ZV, VB, NV, QN, INV,
                       DOUTV + bh * n * D, POOL, LSE, WS, OFF_PV, OFF_ZV, OFF_VB, OFF_NV, OFF_QN, row, hd, n_kv,
                       s_pw, d, s_ht, S, OFFSET, ROPE_AT, W, eps, qk_eps, False, GATED, VEC, VALUE_BIAS, POST, KNORM,
                       ROT, LEADING, BM, BD, BC, D, DOT, PREC)


# ---- entries: the operators ----
DOTS = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}
Maybe = torch.Tensor | None


def _vec(zk: Maybe) -> bool:
    """Vector gates (a logit per channel), not scalar ones or none."""
    return zk is not None and zk.shape[2] > 1


def _dense(*ts: Maybe) -> list[Maybe]:
    return [None if t is None else t.contiguous() for t in ts]


def _args(h: torch.Tensor, pk: torch.Tensor, zk: Maybe, grid: list[int], rope: list[int], eps: list[float],
          dot: torch.dtype) -> tuple[tuple, dict]:
    """The kernels' scalar arguments after the tensors, and their compile-time ones."""
    n, *rule = grid  # S, offset, rope_at, W
    D = pk.shape[2]
    scalars = (n, h.shape[2], h.stride(0), h.stride(1), 0 if pk.shape[0] == 1 else pk.stride(0), pk.shape[1], *rule,
               *eps)
    return scalars, dict(VEC=_vec(zk), ROT=rope[0], LEADING=bool(rope[1]), BD=max(16, triton.next_power_of_2(D)),
                         D=D, DOT=DOTS[dot], PREC="ieee" if dot == torch.float32 else "tf32")


def _launch(h: torch.Tensor, pk: torch.Tensor, pv: Maybe, n: int):
    return lambda meta: (triton.cdiv(n, meta["BM"]), h.shape[0] * pk.shape[1], 1 if pv is None else 2)


@torch.library.custom_op("phasekv::compress", mutates_args=())
def compress(h: torch.Tensor, delay: torch.Tensor, shift: Maybe, pk: torch.Tensor, zk: Maybe, kb: Maybe, nk: Maybe,
             pv: Maybe, zv: Maybe, vb: Maybe, nv: Maybe, qn: Maybe, inv: Maybe, grid: list[int], rope: list[int],
             eps: list[float], dot: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keys and values (B, n_kv, n, D) (no values: empty) of hidden states h (B, T, d) and, for the backward, the
    pooled payloads (n_branches, B, n_kv, n, D) and the gate log-sum-exps (.., G), fp32. Per branch: payload rows
    (1 or W, n_kv, D, d), gate rows (W, n_kv, G, d) and biases (W, n_kv, G) or None, post-norm weight (D,) or None;
    qn the key norm's weight; inv RoPE's inverse frequencies; grid [n, S, offset, rope_at, W]; rope [dims, leading];
    eps [post-norm, key norm]; dot the dtype the products run in (autocast's)."""
    h = h if h.stride(-1) == 1 else h.contiguous()
    pk, zk, kb, pv, zv, vb = _dense(pk, zk, kb, pv, zv, vb)
    ek, ev, pool, lse = _compress_fake(h, delay, shift, pk, zk, kb, nk, pv, zv, vb, nv, qn, inv, grid, rope, eps, dot)
    if grid[0]:
        scalars, statics = _args(h, pk, zk, grid, rope, eps, dot)
        _fwd_kernel[_launch(h, pk, pv, grid[0])](h, delay, shift, pk, zk, kb, nk, pv, zv, vb, nv, qn, inv, ek, ev, pool,
                                                 lse, *scalars, **statics)
    return ek, ev, pool, lse


@compress.register_fake
def _compress_fake(h, delay, shift, pk, zk, kb, nk, pv, zv, vb, nv, qn, inv, grid, rope, eps, dot):
    B, n, (n_kv, D) = h.shape[0], grid[0], pk.shape[1:3]
    shape = (1 if pv is None else 2, B, n_kv, n)
    return (h.new_empty(*shape[1:], D), h.new_empty(*shape[1:], D) if pv is not None else h.new_empty(0),
            h.new_empty(*shape, D, dtype=torch.float32), h.new_empty(*shape, D if _vec(zk) else 1, dtype=torch.float32))


def _grad_sizes(h: torch.Tensor, weights: list[Maybe]) -> list[int]:
    """The gradients' sizes in the backward's workspace: h's, then each weight's (0 where None)."""
    return [h.numel()] + [0 if w is None else w.numel() for w in weights]


@torch.library.custom_op("phasekv::compress_backward", mutates_args=())
def compress_backward(dek: torch.Tensor, dev: Maybe, h: torch.Tensor, delay: torch.Tensor, shift: Maybe,
                      pk: torch.Tensor, zk: Maybe, kb: Maybe, nk: Maybe, pv: Maybe, zv: Maybe, vb: Maybe, nv: Maybe,
                      qn: Maybe, inv: Maybe, pool: torch.Tensor, lse: torch.Tensor, grid: list[int], rope: list[int],
                      eps: list[float], dot: torch.dtype) -> torch.Tensor:
    """The gradients of h and of pk, zk, kb, nk, pv, zv, vb, nv, qn, one after the other in one fp32 workspace, from
    the keys' and values' dek, dev."""
    h = h if h.stride(-1) == 1 else h.contiguous()
    pk, zk, kb, pv, zv, vb, dek, dev = _dense(pk, zk, kb, pv, zv, vb, dek, dev)
    weights = [pk, zk, kb, nk, pv, zv, vb, nv, qn]
    sizes = _grad_sizes(h, weights)
    ws = torch.zeros(sum(sizes), dtype=torch.float32, device=h.device)
    if grid[0]:
        scalars, statics = _args(h, pk, zk, grid, rope, eps, dot)
        offsets = [sum(sizes[: i + 1]) for i in range(len(weights))]  # each weight's gradient, after h's
        _bwd_kernel[_launch(h, pk, pv, grid[0])](h, delay, shift, *weights, inv, dek, dev, pool, lse, ws, *offsets,
                                                 h.shape[1], *scalars, **statics)
    return ws


@compress_backward.register_fake
def _compress_backward_fake(dek, dev, h, delay, shift, pk, zk, kb, nk, pv, zv, vb, nv, qn, inv, pool, lse, grid, rope,
                            eps, dot):
    return h.new_empty(sum(_grad_sizes(h, [pk, zk, kb, nk, pv, zv, vb, nv, qn])), dtype=torch.float32)


def _setup(ctx, inputs, output) -> None:
    h, delay, shift, *weights, inv, grid, rope, eps, dot = inputs
    ctx.save_for_backward(h, delay, shift, *weights, inv, *output)
    ctx.statics = (grid, rope, eps, dot)
    ctx.set_materialize_grads(False)  # no zeros for the outputs only the backward reads


def _backward(ctx, dek, dev, _dpool, _dlse):
    h, delay, shift, *weights, inv, ek, ev, pool, lse = ctx.saved_tensors
    dek = torch.zeros_like(ek) if dek is None else dek  # the values' alone reached the loss
    dev = torch.zeros_like(ev) if dev is None and weights[4] is not None else dev
    ws = compress_backward(dek, dev, h, delay, shift, *weights, inv, pool, lse, *ctx.statics)
    grads = [None if x is None else g.view(x.shape).to(x.dtype)
             for x, g in zip([h, *weights], ws.split(_grad_sizes(h, weights)), strict=True)]
    return grads[0], None, None, *grads[1:], None, None, None, None, None


compress.register_autograd(_backward, setup_context=_setup)


def entries(compressor: Compressor, h: torch.Tensor, k_norm: torch.nn.Module | None = None,
            shift: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """`compressor.entries(h, k_norm, shift)` in the fused kernels: keys and values (B, n_kv, n, D) of every complete
    entry of hidden states h (B, T, d) (tied K/V: the keys twice)."""
    (pk, zk, kb), *value = [b.stored_params() for b in compressor.branches()]
    pv, zv, vb = value[0] if value else (None, None, None)
    post = [b.post_norm for b in compressor.branches()] + [None]
    qn = getattr(k_norm, "weight", None) if compressor.applies_k_norm else None
    g, rope = compressor.grid, compressor.rope
    inv = inv_freq(rope.dims, rope.theta, h.device) if rope.dims else None
    dot = torch.get_autocast_dtype("cuda") if h.is_cuda and torch.is_autocast_enabled("cuda") else h.dtype
    eps = [getattr(post[0], "eps", 1e-6), getattr(k_norm, "eps", 1e-6)]
    ek, ev, _, _ = compress(h, compressor.delay_table, shift, pk, zk, kb, getattr(post[0], "weight", None), pv, zv, vb,
                            getattr(post[1], "weight", None), qn, inv, [g.n_complete(h.shape[1]), g.stride, g.offset,
                            g.rope_at, g.window], [rope.dims, rope.layout == "leading"], eps, dot)
    return ek, (ek if pv is None else ev)  # (B, n_kv, n, D) each


# ---- the decode step's update of the in-flight windows ----
@triton.jit
def _slots(PAY, GATE, LSE, MEAN, b, br, hd, n_br, n_kv, n, k, s_pb, s_pr, s_ps, s_ph, s_gb, s_gr, s_gs, s_gh,
           VEC: tl.constexpr, GATED: tl.constexpr, BS: tl.constexpr, BD: tl.constexpr, D: tl.constexpr):
    """One token merged into the first n of the k in-flight slots (oldest first) of sequence b, branch br, KV head
    hd: each slot's log-normaliser and mean payload (BS, BD) as `decode.extend` makes them."""
    slots, c = tl.arange(0, BS), tl.arange(0, BD)
    rows = ((b * n_br + br) * k + slots) * n_kv + hd  # (BS,) state rows
    inside = (slots < k)[:, None] & (c < D)[None, :]
    mean = tl.load(MEAN + rows[:, None] * D + c[None, :], mask=inside, other=0.0).to(tl.float32)
    if VEC:
        lse = tl.load(LSE + rows[:, None] * D + c[None, :], mask=inside, other=float("-inf")).to(tl.float32)
    else:
        lse = tl.load(LSE + rows, mask=slots < k, other=float("-inf")).to(tl.float32)[:, None] + tl.zeros([BS, BD],
                                                                                                        tl.float32)
    live = tl.broadcast_to((slots < n)[:, None], [BS, BD])  # every channel, the padding's too
    pay = tl.load(PAY + b * s_pb + br * s_pr + slots[:, None] * s_ps + hd * s_ph + c[None, :],
                  mask=live & (c < D)[None, :], other=0.0).to(tl.float32)
    s = tl.zeros([BS, BD], tl.float32)
    if GATED:
        if VEC:
            s += tl.load(GATE + b * s_gb + br * s_gr + slots[:, None] * s_gs + hd * s_gh + c[None, :],
                         mask=live & (c < D)[None, :], other=0.0).to(tl.float32)
        else:
            s += tl.load(GATE + b * s_gb + br * s_gr + slots * s_gs + hd * s_gh, mask=slots < n,
                         other=0.0).to(tl.float32)[:, None]
    hi = tl.maximum(lse, s)
    new = hi + tl.log(1.0 + tl.exp(tl.minimum(lse, s) - hi))  # logaddexp: an empty slot (-inf) takes s
    mean = tl.where(live, mean + tl.exp(s - new) * (pay - mean), mean)  # the token's share of each window so far
    return rows, tl.where(live, new, lse), mean


@triton.jit
def _decode_kernel(POS, PAY, GATE, LSE, MEAN, EK, EV, NK, NV, QN, INV, n_kv, n, k, S, OFFSET, ROPE_AT, W, lead, eps,
                   qk_eps, s_pb, s_pr, s_ps, s_ph, s_gb, s_gr, s_gs, s_gh, s_eb, s_eh, s_en, VEC: tl.constexpr,
                   GATED: tl.constexpr, POST: tl.constexpr, KNORM: tl.constexpr, ROT: tl.constexpr,
                   LEADING: tl.constexpr, TWO: tl.constexpr, BS: tl.constexpr, BD: tl.constexpr, D: tl.constexpr):
    """A token at position POS (read on the device) merged into its windows; where it is the oldest window's last,
    that window's entry (post-normed; key: key-normed and rotated) written to slot lead + j of EK or EV and the
    windows moved one slot older, the newest emptied. One program per (sequence x KV head, branch)."""
    bh, br = tl.program_id(0), tl.program_id(1)
    b, hd = bh // n_kv, bh % n_kv
    rows, lse, mean = _slots(PAY, GATE, LSE, MEAN, b, br, hd, tl.num_programs(1), n_kv, n, k, s_pb, s_pr, s_ps, s_ph,
                             s_gb, s_gr, s_gs, s_gh, VEC, GATED, BS, BD, D)
    since = tl.load(POS).to(tl.int32) - OFFSET - W + S  # >= 0 here: S (t - j S - o - W + S) + the phase
    j, done = since // S, since % S == S - 1  # the oldest window in flight; the token its last
    slots, c = tl.arange(0, BS), tl.arange(0, BD)
    tl.debug_barrier()  # every slot read before any is overwritten (the stores move them between threads)
    dest = rows - tl.where(done, n_kv, 0)  # one slot older when the oldest completes
    keep = (slots < k) & (slots >= tl.where(done, 1, 0))
    tl.store(MEAN + dest[:, None] * D + c[None, :], mean.to(MEAN.dtype.element_ty), mask=keep[:, None] & (c < D)[None, :])
    if VEC:
        tl.store(LSE + dest[:, None] * D + c[None, :], lse.to(LSE.dtype.element_ty), mask=keep[:, None] & (c < D)[None, :])
    else:
        tl.store(LSE + dest, tl.max(lse, 1).to(LSE.dtype.element_ty), mask=keep)
    if done:
        newest = rows - (slots - (k - 1)) * n_kv  # (BS,) the newest slot's row, in every row
        tl.store(MEAN + newest[:, None] * D + c[None, :], tl.zeros([BS, BD], MEAN.dtype.element_ty),
                 mask=(slots == 0)[:, None] & (c < D)[None, :])
        if VEC:
            tl.store(LSE + newest[:, None] * D + c[None, :], tl.full([BS, BD], float("-inf"), LSE.dtype.element_ty),
                     mask=(slots == 0)[:, None] & (c < D)[None, :])
        else:
            tl.store(LSE + newest, tl.full([BS], float("-inf"), LSE.dtype.element_ty), mask=slots == 0)
        at = b * s_eb + hd * s_eh + (lead + j) * s_en + c[None, :] + slots[:, None] * 0  # (BS, BD): row 0 stored
        if br == 0:
            _decode_entry(mean, j * S + OFFSET + ROPE_AT + slots * 0, NK, QN, INV, EK + at, eps, qk_eps, True, POST,
                          KNORM, ROT, LEADING, BS, BD, D)
        if TWO:
            if br == 1:
                _decode_entry(mean, slots * 0, NV, QN, INV, EV + at, eps, qk_eps, False, POST, KNORM, ROT, LEADING, BS,
                              BD, D)


@triton.jit
def _decode_entry(mean, pos, NW, QN, INV, at, eps, qk_eps, KEY: tl.constexpr, POST: tl.constexpr, KNORM: tl.constexpr,
                  ROT: tl.constexpr, LEADING: tl.constexpr, BS: tl.constexpr, BD: tl.constexpr, D: tl.constexpr):
    """The entry of the oldest slot (row 0 of mean (BS, BD)) as `Compressor.entry_kv` makes it, stored at `at`."""
    y = _entry(mean, pos, NW, QN, INV, eps, qk_eps, KEY, POST, KNORM, ROT, LEADING, BD, D)
    c, slots = tl.arange(0, BD), tl.arange(0, BS)
    tl.store(at, y.to(at.dtype.element_ty), mask=(slots == 0)[:, None] & (c < D)[None, :])


def decode_update(compressor: Compressor, k_norm: torch.nn.Module | None, lse: torch.Tensor, mean: torch.Tensor,
                  payload: torch.Tensor, gate: torch.Tensor | None, n: int, pos: torch.Tensor, ek: torch.Tensor,
                  ev: torch.Tensor | None, lead: int) -> None:
    """`decode.merge` of one token at pos ((1,), on the device) into the first n of the in-flight slots lse
    (B, n_branches, k, n_kv, G), mean (.., D), from its payloads (B, n_branches, n, n_kv, D) and gate logits (.., G)
    or None (uniform averaging), in place; where the token ends the oldest window, `decode.complete` too: the entry
    written to slot lead + j of the keys' ek (B, n_kv, *, D) or the values' ev buffer, the slots moved. One launch."""
    B, n_br, k, n_kv, G = lse.shape
    D = mean.shape[-1]
    post = [b.post_norm for b in compressor.branches()] + [None]
    qn = getattr(k_norm, "weight", None) if compressor.applies_k_norm else None
    g, rope = compressor.grid, compressor.rope
    inv = inv_freq(rope.dims, rope.theta, pos.device) if rope.dims else None
    _decode_kernel[(B * n_kv, n_br)](
        pos, payload, gate, lse, mean, ek, ev, getattr(post[0], "weight", None), getattr(post[1], "weight", None), qn,
        inv, n_kv, n, k, g.stride, g.offset, g.rope_at, g.window, lead, getattr(post[0], "eps", 1e-6),
        getattr(k_norm, "eps", 1e-6), *payload.stride()[:4], *(gate.stride()[:4] if gate is not None else (0,) * 4),
        *ek.stride()[:3], VEC=G > 1, GATED=gate is not None, POST=post[0] is not None, KNORM=qn is not None,
        ROT=rope.dims, LEADING=rope.layout == "leading", TWO=ev is not None, BS=max(16, triton.next_power_of_2(k)),
        BD=max(16, triton.next_power_of_2(D)), D=D)
