"""Compressed attention without the dense (T, n + T) mask: O(T (T/S + n_local)) time and memory.

Queries run in blocks of consecutive positions. Visibility only grows with t, so the entries a block
can see are a prefix (those complete by its last query, `Grid.n_complete`), and its exact tokens lie
in a band: its own tokens and the `Grid.exact_keep` tokens before them, plus any exact tokens held
outside the sequence (a decode ring). `Grid.mask` on that small key set then shows every query exactly
the keys the reference `attend` over the dense mask shows it, and one SDPA call per block runs one
softmax per query over them. `Grid` stays the only place that states the visibility rule.

Backends: `blockwise` (default, every device), `flex` (FlexAttention with a block mask made once per
shape from the same rule; compiled on CUDA, eager elsewhere, where it is for testing only), `triton`
(fused Triton kernels, `triton_kernel`; CUDA, or Triton's interpreter for testing) and `reference`
(the dense mask, the obviously correct O(T^2) version). Select one with `use_backend(name)`.
"""

from __future__ import annotations

import functools
import importlib.util
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F

from phasekv.attention.positions import Grid
from phasekv.errors import ConfigError

BACKENDS = ("blockwise", "flex", "triton", "reference")
_backend: str | None = None  # selected by `use_backend`; None: the default (`backend`)
_HAS_TRITON = importlib.util.find_spec("triton") is not None


def block_size(device: torch.device, length: int) -> int:
    """Queries per block of a `length`-token chunk: large on GPUs (launch cost); small on CPU, where work ~
    block * (n_visible + block): 32 up to 2K tokens (training at 96 and the lookup at 194 tokens run 20-25%
    faster than at 128), 128 beyond, where the extra calls cost as much as the smaller bands save (measured)."""
    if device.type != "cpu":
        return 1024
    return 32 if length <= 2048 else 128


def backend(x: torch.Tensor | None = None) -> str:
    """The selected backend, or by default the one for queries x: the fused triton kernels on CUDA (fastest of the
    three at every length the H200 run measured, the whole layer fwd+bwd 4K-64K and fwd 128K:
    docs/results/performance.md) where Triton is installed (CUDA builds of torch bring it), blockwise elsewhere."""
    return _backend or ("triton" if x is not None and x.is_cuda and _HAS_TRITON else "blockwise")


@contextmanager
def use_backend(name: str) -> Iterator[None]:
    """Run compressed layers' parallel attention with `name` (one of BACKENDS) inside the block."""
    global _backend
    if name not in BACKENDS:
        raise ConfigError(f"unknown attention backend {name!r}; known: {', '.join(BACKENDS)}")
    previous, _backend = _backend, name
    try:
        yield
    finally:
        _backend = previous


def blockwise_attention(q: torch.Tensor, pos: torch.Tensor, ek: torch.Tensor, ev: torch.Tensor, k: torch.Tensor,
                        v: torch.Tensor, grid: Grid, ring: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                        block: int | None = None, sinks: torch.Tensor | None = None,
                        holds: torch.Tensor | None = None) -> torch.Tensor:
    """q (B, H, T, D) at contiguous positions pos (T,); entries ek, ev (B, n_kv, n, D) numbered 0..n-1;
    exact k, v (B, n_kv, T, D) of the same positions; ring: exact rk, rv (B, n_kv, R, D) at rpos (R,)
    held from before pos[0]; sinks (H,) attention-sink logits or None; holds (B, n_kv, n) bool or None: per
    sequence, the entries whose windows hold a token (`Compressor.holds_token`; the others are masked). Returns
    (B, H, T, D), equal to `attend` over `Grid.mask` (and `holds`)."""
    block = block or block_size(q.device, q.shape[2])
    tied = ev is ek and v is k
    rk, rv, rpos = ring if ring is not None else (k[:, :, :0], v[:, :, :0], pos[:0])
    keep = grid.exact_keep
    k_bands = _bands(k, block, keep)
    v_bands = k_bands if tied else _bands(v, block, keep)
    masks = block_masks(grid, int(pos[0]), q.shape[2], ek.shape[2], rpos, block, q.shape[1] // k.shape[1])
    qs = q if sinks is None else sink_query(q, sinks)  # (B, H, T, D or D + 1)
    out = []
    # split, not slicing: its backward is one op, not a full-size grad per block
    for i, (q_b, (n_b, pad, mask)) in enumerate(zip(qs.split(block, 2), masks, strict=True)):
        zeros = [k.new_zeros(*k.shape[:2], pad, k.shape[3])] if pad else []  # masked keys up to `key_align`
        keys = torch.cat([ek[:, :, :n_b], rk, *k_bands[i], *zeros], 2)  # (B, n_kv, N, D)
        values = keys if tied else torch.cat([ev[:, :, :n_b], rv, *v_bands[i], *zeros], 2)
        if holds is not None:  # per sequence and KV head: (rows, N) -> (B, n_kv, rows, N)
            mask = mask & F.pad(holds[:, :, :n_b], (0, keys.shape[2] - n_b), value=True)[:, :, None]
        out.append(sdpa(q_b, keys, values, mask, sinks is not None))
    return torch.cat(out, 1).transpose(1, 2)  # (B, H, T, D) in (B, T, H, D) memory: o_proj reads it in place


MASK_CACHE_TOKENS = 2048  # chunks up to this long (training, evaluation prompts) reuse their blocks' masks


def block_masks(grid: Grid, t0: int, T: int, n: int, rpos: torch.Tensor, block: int,
                g: int) -> Iterator[tuple[int, int, torch.Tensor]]:
    """Per query block of a chunk of T queries at t0.., (n_b, pad, mask): the entries it sees (a prefix of the
    n), the masked zero keys that pad its keys to `key_align`, and its `Grid.mask` over [entries, ring tokens at
    rpos, its band of exact tokens, padding]. A chunk of at most MASK_CACHE_TOKENS with no ring reuses masks made
    once per (grid, t0, T, n), with one row per query head (t-major, g per KV head: `sdpa`'s folded rows);
    longer chunks make them block by block, one row per query (their masks would be large to repeat or keep)."""
    align = key_align(rpos.device)
    if rpos.numel() == 0 and T <= MASK_CACHE_TOKENS:
        return iter(_cached_block_masks(grid, t0, T, n, block, align, g, rpos.device))
    return _block_masks(grid, t0, T, n, rpos, block, align, 1)


def _block_masks(grid: Grid, t0: int, T: int, n: int, rpos: torch.Tensor, block: int, align: int,
                 rows: int) -> Iterator[tuple[int, int, torch.Tensor]]:
    pos = torch.arange(t0, t0 + T, device=rpos.device)  # (T,)
    j = torch.arange(n, device=rpos.device)
    for a in range(0, T, block):
        b = min(a + block, T)
        n_b = min(n, grid.n_complete(t0 + b))  # entries complete by the block's last query
        lo = max(0, a - grid.exact_keep + 1)  # oldest exact token the block's first query may see
        mask = grid.mask(pos[a:b], j[:n_b], torch.cat([rpos, pos[lo:b]]))  # (b - a, n_b + R + b - lo)
        pad = -mask.shape[1] % align
        yield n_b, pad, F.pad(mask, (0, pad), value=False).repeat_interleave(rows, 0)


@functools.lru_cache(maxsize=16)
def _cached_block_masks(grid: Grid, t0: int, T: int, n: int, block: int, align: int, g: int,
                        device: torch.device) -> tuple[tuple[int, int, torch.Tensor], ...]:
    with torch.inference_mode(False), torch.no_grad():  # plain tensors even if first asked for in inference mode
        return tuple(_block_masks(grid, t0, T, n, torch.zeros(0, dtype=torch.long, device=device), block, align, g))


def key_align(device: torch.device) -> int:
    """Keys per block padded to a multiple of this: CPU's SDPA kernel runs 1.2-2x slower on a key count that is
    not a multiple of its 16-float vectors (measured, 32 queries over 55-59 against 48-64 keys); none on GPUs."""
    return 16 if device.type == "cpu" else 1


def sink_query(q: torch.Tensor, sinks: torch.Tensor) -> torch.Tensor:
    """An attention sink as one more key: q (B, H, T, D) -> [q, sink_h sqrt(D)] (B, H, T, D + 1), so that with
    keys [k, 0] and the sink key [0, ..., 0, 1] (value 0) the sink's score is exactly sink_h (see `sdpa`)."""
    col = (sinks.to(q.dtype) * q.shape[-1] ** 0.5).view(1, -1, 1, 1).expand(q.shape[0], -1, q.shape[2], 1)
    return torch.cat([q, col], -1)


def sdpa(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor, sink: bool) -> torch.Tensor:
    """One softmax per query over the masked keys (B, n_kv, N, D) of q (B, H, Tq, D) -> (B, Tq, H, D); with
    `sink`, q comes from `sink_query` and the sink key joins every query's softmax. `mask` (Tq, N) has a row per
    query, or (Tq * g, N) a row per query head (t-major, g = H / n_kv per KV head): then the g heads reading one
    KV head run as Tq * g rows of one head, one kernel call without GQA's per-group reduction of key and value
    gradients (~10% faster on CPU, measured). Either may be per sequence and KV head, (B, n_kv, rows, N)."""
    B, H, Tq, _ = q.shape
    n_kv, D = keys.shape[1], values.shape[-1]
    g = H // n_kv
    if sink:
        sink_key = keys.new_zeros(*keys.shape[:2], 1, D + 1)
        sink_key[..., D] = 1.0
        keys = torch.cat([F.pad(keys, (0, 1)), sink_key], 2)  # (B, n_kv, N + 1, D + 1)
        values = F.pad(values, (0, 0, 0, 1))  # (B, n_kv, N + 1, D): the sink adds no value
        mask = F.pad(mask, (0, 1), value=True)  # (Tq or Tq * g, N + 1)
    if mask.shape[-2] == Tq:
        mask = mask if mask.dim() == 2 else mask.repeat_interleave(g, 1)  # (B, H, Tq, N): one per query head
        z = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, enable_gqa=True, scale=D**-0.5)
        return z.transpose(1, 2)  # (B, Tq, H, D)
    rows = q.transpose(1, 2).reshape(B, Tq, n_kv, g, -1).transpose(1, 2).reshape(B, n_kv, Tq * g, q.shape[-1])
    z = F.scaled_dot_product_attention(rows, keys, values, attn_mask=mask, scale=D**-0.5)  # (B, n_kv, Tq g, D)
    return z.view(B, n_kv, Tq, g, D).transpose(1, 2).reshape(B, Tq, H, D)


def _bands(x: torch.Tensor, block: int, keep: int) -> list[list[torch.Tensor]]:
    """Per query block i, the exact tokens max(0, i*block - keep + 1) .. (i+1)*block - 1 of x (B, n_kv, T, D) as
    pieces of x's block-sized chunks: a band's pieces reach back ceil((keep - 1) / block) chunks, and the backward
    of a chunk's slice fills a grad of one chunk, so the bands cost O(T (1 + keep / block)) either way (slices of
    x would each fill a full-size grad; an unfold's backward is a slow scatter)."""
    chunks = x.split(block, 2)
    bands = []
    for i in range(len(chunks)):
        lo = max(0, i * block - keep + 1)
        first = lo // block
        bands.append([chunks[first][:, :, lo - first * block :], *chunks[first + 1 : i + 1]])
    return bands


FLEX_BLOCK = 128  # FlexAttention's tile (its default): the entries are padded to a multiple, so the exact tokens'
# tiles line up with the query tiles and each query tile's band of exact tokens touches at most two of them


def flex_attention(q: torch.Tensor, pos: torch.Tensor, ek: torch.Tensor, ev: torch.Tensor, k: torch.Tensor,
                   v: torch.Tensor, grid: Grid, sinks: torch.Tensor | None = None,
                   holds: torch.Tensor | None = None) -> torch.Tensor:
    """The parallel path with FlexAttention: keys [entries, zero padding to FLEX_BLOCK, exact tokens], a block
    mask made once per (grid, t0, T, n, device) from `Grid`'s rule (`flex_block_mask`), `holds` (as in
    `blockwise_attention`) as a score modification, so that the cached mask does not depend on it. Compiled once
    per shape on CUDA (dynamic=False), eager elsewhere, where it is for testing only (forward)."""
    if sinks is not None:
        raise ConfigError("the flex backend has no attention sink; use the blockwise, triton or reference backend")
    n, T = ek.shape[2], q.shape[2]
    n_pad = -(-n // FLEX_BLOCK) * FLEX_BLOCK
    mask = flex_block_mask(grid, int(pos[0]), T, n, q.device)
    zeros = [ek.new_zeros(*ek.shape[:2], n_pad - n, ek.shape[3])] if n_pad > n else []
    keys = torch.cat([ek, *zeros, k], 2)  # (B, n_kv, n_pad + T, D)
    values = keys if (ev is ek and v is k) else torch.cat([ev, *zeros, v], 2)
    from torch.nn.attention.flex_attention import flex_attention as flex

    run = _compiled_flex() if q.is_cuda else _flex
    return run(flex, q, keys, values, mask, holds, n)


def _flex(flex, q, keys, values, mask, holds: torch.Tensor | None, n: int) -> torch.Tensor:
    score_mod = None
    if holds is not None:  # made inside the compiled call: a fresh closure per step is no new guard
        g = q.shape[1] // holds.shape[1]

        def score_mod(score, b, h, q_idx, kv_idx):
            held = holds[b, h // g, kv_idx.clamp(max=n - 1)]
            return torch.where((kv_idx >= n) | held, score, float("-inf"))

    return flex(q, keys, values, score_mod=score_mod, block_mask=mask, enable_gqa=True)


FLEX_SHAPES = 64  # shapes (lengths, batch, dtype, with holds or not) flex compiles for in one process; past
# dynamo's default of 8 it would fall back to eager flex, which materialises every score


@functools.cache
def _compiled_flex():
    """`_flex` compiled with one graph per shape (dynamic=False): every step of a run reuses its shape's graph."""
    return torch._dynamo.config.patch(recompile_limit=FLEX_SHAPES)(torch.compile(_flex, dynamic=False))


@functools.lru_cache(maxsize=16)
def flex_block_mask(grid: Grid, t0: int, T: int, n: int, device: torch.device, block: int = FLEX_BLOCK):
    """FlexAttention's block mask of T queries at t0.. over [n entries, padding, T exact tokens], made from the
    rule per pair of tiles (a tile of queries ta..tb, one of keys): entries ja..jb are seen by some query iff
    entry ja is by tb, by all iff jb is by ta; exact tokens pa..pb by some iff pa <= tb and pb lies after the
    oldest token ta sees, by all iff pb <= ta and pa lies after the oldest token tb sees. A partial tile runs
    `Grid`'s rule per element (the mask_mod); tiles at the ragged ends are partial. O((T / block)^2) small work,
    where `create_block_mask` evaluates the rule on all T (n + T) pairs (seconds at 64K+)."""
    from torch.nn.attention.flex_attention import BlockMask

    n_pad = -(-n // block) * block
    with torch.inference_mode(False), torch.no_grad():  # plain tensors even if first asked for in inference mode
        ta = torch.arange(0, T, block, device=device)[:, None] + t0  # (Qb, 1) first and last query of each tile
        tb = (ta - t0 + block).clamp(max=T) - 1 + t0
        q_whole = (ta - t0 + block <= T)
        ja = torch.arange(0, n_pad, block, device=device)[None, :]  # (1, Eb) entry tiles
        jb = ja + block - 1
        e_any = (ja < n) & grid.sees_entry(tb, ja)
        e_all = (jb < n) & grid.sees_entry(ta, jb) & q_whole
        pa = torch.arange(0, T, block, device=device)[None, :] + t0  # (1, Xb) exact-token tiles
        pb = (pa - t0 + block).clamp(max=T) - 1 + t0
        x_any = (pa <= tb) & (pb >= _oldest_exact(grid, ta))
        x_all = (pb <= ta) & (pa >= _oldest_exact(grid, tb)) & (pb - pa + 1 == block) & q_whole
        any_, all_ = torch.cat([e_any, x_any], 1), torch.cat([e_all, x_all], 1)  # (Qb, Eb + Xb)

        def mask_mod(b, h, q_idx, kv_idx):
            t = q_idx + t0
            entry = grid.sees_entry(t, kv_idx) & (kv_idx < n)
            return torch.where(kv_idx < n_pad, entry, grid.sees_exact(t, kv_idx - n_pad + t0))

        return BlockMask.from_kv_blocks(*_ordered(any_ & ~all_), *_ordered(all_), BLOCK_SIZE=block, mask_mod=mask_mod,
                                        seq_lengths=(T, n_pad + T))


def _oldest_exact(grid: Grid, t: torch.Tensor) -> torch.Tensor:
    """Position of the oldest exact token the query at t sees (`Grid.sees_exact`'s lower end)."""
    if grid.local_window is not None:
        return t - grid.local_window + 1
    return grid.last_visible_end(t) + 1


def _ordered(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(Qb, Kb) bool -> BlockMask's per query tile count of key tiles (1, 1, Qb) and their indices first
    (1, 1, Qb, Kb), int32."""
    count = tiles.sum(-1, dtype=torch.int32)
    order = torch.argsort((~tiles).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return count[None, None], order[None, None]


def triton_attention(q: torch.Tensor, pos: torch.Tensor, ek: torch.Tensor, ev: torch.Tensor, k: torch.Tensor,
                     v: torch.Tensor, grid: Grid, sinks: torch.Tensor | None = None,
                     holds: torch.Tensor | None = None) -> torch.Tensor:
    """The parallel path in fused Triton kernels (`triton_kernel`): every variant, one kernel per direction."""
    fused = _fused()[0].triton_attention
    return guarded("attention", lambda: fused(q, pos, ek, ev, k, v, grid, sinks, holds),
                   lambda: blockwise_attention(q, pos, ek, ev, k, v, grid, sinks=sinks, holds=holds))


def triton_entries(compressor, h: torch.Tensor, k_norm=None, shift: torch.Tensor | None = None):
    """`compressor.entries(h, k_norm, shift)` in fused Triton kernels (`triton_compressor`): the triton backend's
    compressor, as `triton_attention` is its attention."""
    fused = _fused()[1].entries
    return guarded("compressor", lambda: fused(compressor, h, k_norm, shift),
                   lambda: compressor.entries(h, k_norm, shift))


def triton_decode_update(*args) -> bool:
    """`triton_compressor.decode_update`: a decode step's merge of its token into the in-flight windows, and the
    oldest window's entry where the token ends it, in one fused kernel (the triton backend's); False where it
    cannot run here (the caller's reference runs instead)."""
    fused = _fused()[1].decode_update
    return guarded("decode update", lambda: fused(*args) or True, lambda: False)


def _fused():
    """The fused kernels' modules, `triton_kernel` and `triton_compressor`, whose import needs CUDA or Triton's
    interpreter (an import statement: a compiled layer traces it)."""
    try:
        from phasekv.attention import triton_compressor, triton_kernel
    except ImportError as e:
        raise ConfigError(f"the triton backend cannot run here: {e}") from e
    return triton_kernel, triton_compressor


FAILED: dict[str, str] = {}  # fused kernels that failed on this machine: what -> why (said once on stderr)


def guarded(what: str, fused, reference):
    """fused(), or where its kernels fail on this machine (a Triton that cannot compile them) reference() from then
    on, the reason said once on stderr, as the fused CPU kernels fall back (`phasekv.kernels`); inside a compiled
    graph fused() alone."""
    if what in FAILED:
        return reference()
    if torch.compiler.is_compiling():
        return fused()
    try:
        return fused()
    except Exception as e:
        FAILED[what] = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:200]}"
        print(f"phasekv: the fused Triton {what} failed here ({FAILED[what]}); running the reference", file=sys.stderr)
        return reference()


# a compressed layer's parallel path (no ring) per fast backend; same arguments, same result
PARALLEL = {"blockwise": blockwise_attention, "flex": flex_attention, "triton": triton_attention}


def attend_parts(q: torch.Tensor, parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]],
                 sinks: torch.Tensor | None = None) -> torch.Tensor:
    """One softmax over several key sets, each read in place (no concatenation of keys or values).

    q (B, H, Tq, D); parts: (k, v, mask) with k, v (B, n_kv, N_i, D) and mask (Tq, N_i) bool, or None when
    every query sees every key of the set; sinks (H,) attention-sink logits joining every softmax, or None.
    Every query must see at least one key. -> (B, H, Tq, D).
    For few queries over long caches (decode): O(Tq * sum N_i), no dense mask over what all queries see.
    """
    B, H, Tq, D = q.shape
    n_kv = parts[0][0].shape[1]
    g = H // n_kv
    qg = q.reshape(B, n_kv, g * Tq, D) * D**-0.5  # query heads grouped by the KV head they read
    parts = [p for p in parts if p[0].shape[2] > 0]
    scores = []
    for k, _, mask in parts:
        s = qg @ k.transpose(-1, -2)  # (B, n_kv, g * Tq, N_i)
        if mask is not None:
            s = s.view(B, n_kv, g, Tq, -1).masked_fill(~mask, float("-inf")).view(B, n_kv, g * Tq, -1)
        scores.append(s)
    sizes = [k.shape[2] for k, _, _ in parts]
    if sinks is not None:
        scores.append(sinks.to(q.dtype).view(1, n_kv, g, 1, 1).expand(B, n_kv, g, Tq, 1).reshape(B, n_kv, g * Tq, 1))
        sizes.append(1)
    probs = torch.cat(scores, -1).softmax(-1).split(sizes, -1)
    out = sum(p @ v for p, (_, v, _) in zip(probs, parts, strict=False))  # (B, n_kv, g * Tq, D); a sink adds no value
    return out.view(B, H, Tq, D)


def decode_attention(q: torch.Tensor, pos: torch.Tensor, ek: torch.Tensor, ev: torch.Tensor, k: torch.Tensor,
                     v: torch.Tensor, grid: Grid, ring: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
                     sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Same contract as `blockwise_attention`, for a few queries over a decode cache: the entries every query
    sees are read in place without a mask; only entries completing inside the chunk and the exact tokens
    (ring + chunk, at most `exact_keep + Tq`) are masked by `Grid`."""
    rk, rv, rpos = ring
    n, n_all = ek.shape[2], min(ek.shape[2], grid.n_complete(int(pos[0]) + 1))  # entries all queries see
    xk, xpos = torch.cat([rk, k], 2), torch.cat([rpos, pos])
    xv = xk if (rv is rk and v is k) else torch.cat([rv, v], 2)
    parts = [(ek[:, :, :n_all], ev[:, :, :n_all], None), (xk, xv, grid.exact_visible(pos, xpos))]
    if n_all < n:  # entries completing inside the chunk
        j = torch.arange(n_all, n, device=q.device)
        parts.append((ek[:, :, n_all:], ev[:, :, n_all:], grid.entry_visible(pos, j)))
    return attend_parts(q, parts, sinks)
