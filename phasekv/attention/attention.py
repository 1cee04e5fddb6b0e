"""Attention of one layer: Qwen3 projections, QK-norm, RoPE, GQA; optionally over compressed entries.

A compressed layer runs ONE softmax over the union of its visible compressed entries and its exact
tokens (local window or uncompressed tail), plus an optional learned per-head attention sink;
`positions.Grid` decides visibility, the layer's `compressor.Compressor` variant makes the entries.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from phasekv.attention import blockwise, decode
from phasekv.attention.cache import CompressedLayerCache, FullLayerCache
from phasekv.attention.compressor import Partial, layer_grid, layer_rope, make_compressor
from phasekv.attention.norm import RMSNorm
from phasekv.config import ModelConfig

DECODE_CHUNK = 64  # cached chunks up to this many tokens attend in place (decode); longer ones blockwise


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor,
           sinks: torch.Tensor | None = None) -> torch.Tensor:
    """Reference masked attention. q (B, H, Tq, D); k, v (B, n_kv, N, D); mask (Tq, N) bool, or (B, n_kv, 1, Tq, N)
    per sequence and KV head; sinks (H,) logits of an attention sink (a key every query sees, value 0) or None
    -> (B, H, Tq, D)."""
    B, H, Tq, D = q.shape
    n_kv = k.shape[1]
    q = q.view(B, n_kv, H // n_kv, Tq, D)  # query heads grouped by the KV head they read
    scores = q @ k[:, :, None].transpose(-1, -2) * D**-0.5  # (B, n_kv, g, Tq, N)
    scores = scores.masked_fill(~mask, float("-inf"))
    if sinks is not None:
        sink = sinks.to(q.dtype).view(1, n_kv, H // n_kv, 1, 1).expand(B, -1, -1, Tq, 1)  # (B, n_kv, g, Tq, 1)
        scores = torch.cat([scores, sink], -1)
    probs = scores.softmax(dim=-1)[..., : k.shape[2]]  # the sink's share is dropped: it adds no value
    out = probs @ v[:, :, None]  # (B, n_kv, g, Tq, D)
    return out.view(B, H, Tq, D)


class Attention(nn.Module):
    """One layer's attention: Qwen3 projections, QK-norm, RoPE and GQA over exact keys, and, in a compressed
    layer, over the visible entries its compressor writes on the layer's window grid (one joint softmax).
    The per-head outputs z pass `z_hook` (the knockout site) before the output projection."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.cfg = cfg
        H, n_kv, D, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.d_model
        self.q_proj = nn.Linear(d, H * D, bias=False)
        self.k_proj = nn.Linear(d, n_kv * D, bias=False)
        self.v_proj = None if cfg.tied_kv else nn.Linear(d, n_kv * D, bias=False)
        self.o_proj = nn.Linear(H * D, d, bias=False)
        self.q_norm = RMSNorm(D, cfg.norm_eps) if cfg.qk_norm else nn.Identity()
        self.k_norm = RMSNorm(D, cfg.norm_eps) if cfg.qk_norm else nn.Identity()
        self.z_hook = nn.Identity()  # per-head outputs z (B, T, H, D) before o_proj: the knockout site
        self._rope = layer_rope(cfg)  # (x (B, n, T, D), pos (T,)) -> x rotated
        self.grid = layer_grid(cfg, layer) if cfg.compressed else None
        self.compressor = make_compressor(cfg, self.grid, self._rope, layer) if cfg.compressed else None
        self.sinks = nn.Parameter(torch.zeros(H)) if cfg.attention_sink else None  # per query head

    def _heads(self, x: torch.Tensor, n: int) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, n, self.cfg.head_dim).transpose(1, 2)  # (B, n, T, D)

    def _queries(self, h: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        """Queries (B, H, T, D) of hidden states h (B, T, d) at positions pos (T,): normalised, rotated."""
        return self._rope(self.q_norm(self._heads(self.q_proj(h), self.cfg.n_heads)), pos)

    def _exact_kv(self, h: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Exact keys and values (B, n_kv, T, D): normalised, rotated; tied values reuse the keys."""
        k = self._rope(self.k_norm(self._heads(self.k_proj(h), self.cfg.n_kv_heads)), pos)
        v = k if self.v_proj is None else self._heads(self.v_proj(h), self.cfg.n_kv_heads)
        return k, v

    def _entries(self, h: torch.Tensor, shift: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (B, n_kv, n, D) of the compressor's complete entries of h (B, T, d): in fused kernels on
        the triton backend, else `Compressor.entries` (the reference)."""
        if blockwise.backend(h) == "triton":
            return blockwise.triton_entries(self.compressor, h, self.k_norm, shift)
        return self.compressor.entries(h, self.k_norm, shift)

    def _entry_kv(self, raw: list[torch.Tensor], j: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Compressed keys/values (B, n_kv, n, D) of entries j from their pooled branches (the variant's rule)."""
        return self.compressor.entry_kv(raw, j, self.k_norm)

    # ---- forward ----
    def forward(self, h: torch.Tensor, pos: torch.Tensor, cache=None, shift: torch.Tensor | None = None,
                last: bool = False) -> torch.Tensor:
        """h (B, T, d) normed hidden states at positions pos (T,) -> (B, T, d). `shift` (B,): grid jitter, each
        sequence's windows start that many tokens early (training forward only). `last` (no cache): the output
        at the last position alone, (B, 1, d), from its one query over the chunk's keys."""
        if last:
            z = self._last_query(h, pos, shift)  # (B, H, 1, D)
        elif cache is not None and h.shape[1] == 1 and decode.enabled():
            z = decode.step(self, h, pos, cache)  # (B, H, 1, D)
        else:
            z = self._attend(h, pos, cache, shift)  # (B, H, T, D)
        z = self.z_hook(z.transpose(1, 2))  # (B, T, H, D)
        return self.o_proj(z.flatten(2))

    def _last_query(self, h: torch.Tensor, pos: torch.Tensor, shift: torch.Tensor | None = None) -> torch.Tensor:
        """The per-head outputs z (B, H, 1, D) of the last position: its query over every key of the chunk (full
        attention) or over the chunk's entries and the exact tokens it keeps, held as a decode ring would."""
        q = self._queries(h[:, -1:], pos[-1:])  # (B, H, 1, D)
        k, v = self._exact_kv(h, pos)  # (B, n_kv, T, D)
        if self.compressor is None:
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=True)  # the last query sees every key
        ek, ev = self._entries(h, shift)  # (B, n_kv, n, D) each
        holds = self.compressor.holds_token(ek.shape[2], shift)  # (B, n_kv, n) or None: entries with a token
        a = max(0, h.shape[1] - self.grid.exact_keep)  # oldest exact token the last query may see
        rk, k_t = k[:, :, a:-1], k[:, :, -1:]  # (B, n_kv, T - 1 - a, D): the ring before it; (B, n_kv, 1, D)
        rv, v_t = (rk, k_t) if v is k else (v[:, :, a:-1], v[:, :, -1:])  # tied K/V stay one tensor
        return blockwise.blockwise_attention(q, pos[-1:], ek, ev, k_t, v_t, self.grid, ring=(rk, rv, pos[a:-1]),
                                             sinks=self.sinks, holds=holds)

    def _attend(self, h: torch.Tensor, pos: torch.Tensor, cache, shift: torch.Tensor | None = None) -> torch.Tensor:
        """The per-head outputs z (B, H, T, D) of any chunk (the reference for `decode.step`)."""
        q = self._queries(h, pos)  # (B, H, T, D)
        k, v = self._exact_kv(h, pos)  # (B, n_kv, T, D)
        if self.compressor is None:
            return self._full(q, k, v, pos, cache)
        if cache is None:
            return self._compressed(q, k, v, h, pos, shift)
        return self._compressed_cached(q, k, v, h, pos, cache)

    def _full(self, q, k, v, pos, cache: FullLayerCache | None) -> torch.Tensor:
        if cache is None:
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        fresh = cache.k.n == 0
        cache.k.append(k)
        cache.v.append(v)
        if fresh:  # a prompt on an empty cache: plain causal attention
            return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        keys_pos = torch.arange(cache.k.n, device=pos.device)
        mask = None if q.shape[2] == 1 else keys_pos[None, :] <= pos[:, None]  # one query sees every key
        return blockwise.attend_parts(q, [(cache.k.view(k), cache.v.view(v), mask)])

    def _compressed(self, q, k, v, h, pos, shift=None) -> torch.Tensor:
        ek, ev = self._entries(h, shift)  # (B, n_kv, n, D) each
        holds = self.compressor.holds_token(ek.shape[2], shift)  # (B, n_kv, n) or None: entries with a token
        fast = blockwise.PARALLEL.get(blockwise.backend(q))  # None: the reference
        if fast is not None:
            return fast(q, pos, ek, ev, k, v, self.grid, sinks=self.sinks, holds=holds)
        j = torch.arange(ek.shape[2], device=pos.device)
        mask = self.grid.mask(pos, j, pos)  # the reference: dense (T, n + T) mask
        if holds is not None:  # per sequence and KV head: (B, n_kv, 1, T, n + T)
            mask = mask & F.pad(holds, (0, k.shape[2]), value=True)[:, :, None, None]
        return attend(q, torch.cat([ek, k], 2), torch.cat([ev, v], 2), mask, self.sinks)

    def _compressed_cached(self, q, k, v, h, pos, cache: CompressedLayerCache) -> torch.Tensor:
        self._extend_entries(h, pos, cache)
        ek = cache.entries_k.view(k)
        ev = ek if cache.entries_v is None else cache.entries_v.view(v)
        ring = cache.ring(k)
        if q.shape[2] > DECODE_CHUNK:  # a prompt: blockwise, O(T (T/S + n_local))
            z = blockwise.blockwise_attention(q, pos, ek, ev, k, v, self.grid, ring=ring, sinks=self.sinks)
        else:  # decode: the cache read in place
            z = blockwise.decode_attention(q, pos, ek, ev, k, v, self.grid, ring, sinks=self.sinks)
        cache.write_exact(k, v, pos)
        return z

    def _extend_entries(self, h: torch.Tensor, pos: torch.Tensor, cache: CompressedLayerCache) -> None:
        """Feed tokens h (B, T, d) at pos (contiguous) to the windows they belong to; store completed entries.
        A group of staggered heads reads the tokens `delay` positions late (the cache keeps the last ones)."""
        g = self.grid
        t0, t1 = int(pos[0]), int(pos[-1]) + 1
        j_lo = cache.n_entries  # oldest window not yet complete
        j_hi = g.n_started(t1) - 1  # newest window that has started
        streams = cache.delayed(h, self.compressor.head_groups())  # (x (B, T, d), delay, heads) per head group
        if j_hi < j_lo:
            return
        per_group = [self._fresh(x, delay, heads, t0, t1, j_lo, j_hi) for x, delay, heads in streams]
        fresh = [Partial.cat_heads(list(p)) for p in zip(*per_group, strict=True)]  # per branch
        n_done = g.n_complete(t1) - j_lo  # touched windows that are now complete
        partials = []
        for i, p in enumerate(fresh):
            n_old = 0 if cache.partials is None else cache.partials[i].m.shape[1]
            if n_old == p.m.shape[1]:  # every touched window was in flight already
                p = cache.partials[i].merge(p)
            elif n_old:
                p = cache.partials[i].merge(p.slice(0, n_old)).cat(p.slice(n_old))
            partials.append(p)
        if n_done > 0:
            raw = [b.finalize(p.slice(0, n_done)) for b, p in zip(self.compressor.branches(), partials, strict=True)]
            ek, ev = self._entry_kv(raw, torch.arange(j_lo, j_lo + n_done, device=h.device))
            cache.entries_k.append(ek)
            if cache.entries_v is not None:
                cache.entries_v.append(ev)
        cache.partials = [p.slice(n_done) for p in partials]

    def _fresh(self, x: torch.Tensor, delay: int, heads: slice | None, t0: int, t1: int, j_lo: int,
               j_hi: int) -> list[Partial]:
        """Per branch, the partials of windows j_lo..j_hi from tokens x (B, T, d) at positions t0..t1-1, for the
        KV heads `heads` (all when None); positions before `delay` hold no token (a staggered head's start)."""
        g, W, S = self.grid, self.grid.window, self.grid.stride
        branches = self.compressor.branches()
        if x.shape[1] == 1 and t0 >= delay:  # one decode token: only the offsets it fills in its windows
            offsets = t0 - g.entry_start(torch.arange(j_lo, j_hi + 1, device=x.device))  # (n_w,)
            return [branch.token_partial(x[:, 0], offsets, heads) for branch in branches]
        p0 = g.entry_start(j_lo)  # first position covered by the touched windows (may be < 0: absent)
        span = (j_hi - j_lo) * S + W
        ext = x.new_zeros(x.shape[0], span, x.shape[2])  # (B, span, d)
        a, b = max(t0, p0, delay), min(t1, p0 + span)
        ext[:, a - p0 : b - p0] = x[:, a - t0 : b - t0]
        present = torch.zeros(span, dtype=torch.bool, device=x.device)
        present[a - p0 : b - p0] = True
        windows = ext.unfold(1, W, S).transpose(2, 3)  # (B, n_w, W, d)
        present = present.unfold(0, W, S)  # (n_w, W)
        return [branch.partial(windows, present, heads) for branch in branches]

    def new_cache(self) -> FullLayerCache | CompressedLayerCache:
        if self.compressor is None:
            return FullLayerCache()
        return CompressedLayerCache(self.grid, tied=self.v_proj is None)

