"""The one-token decode step at static shapes: what a CUDA graph of the whole-model step can capture.

`decode.step` reads the cache as it grows (a view of n keys, a Python position, the phase's own rows, an entry
appended only at a window's last token). Captured once, a graph replays the same shapes, the same addresses and
the same kernels at every token, so here
- the cache's buffers are allocated once for `capacity` tokens and read whole: keys not yet written are masked
  (a full layer: slots after t; a compressed layer: the ring slots t does not see, `Grid.sees_exact`, and the
  entries it does not see, `Grid.sees_entry`);
- the position is a (1,) tensor on the device; RoPE, the phase phi = (t - offset) mod S, the oldest in-flight
  window j and the ring slot t mod keep are computed from it;
- the compressor rows of every phase are one (S, rows, d) tensor indexed by phi (S divides W: every phase feeds
  the same W/S windows), and the oldest window's entry is written at every step to its slot, which no query
  sees before the window's last token; the in-flight windows move one slot older where phi = S - 1.
  A caller that knows the phase (one graph per phase: `StaticCompressed.phase`) gets a step with the phase's
  rows alone, which completes the oldest window only at phi = S - 1: ~40 fewer kernels per layer. A local
  window's ring, once full, holds only tokens the query sees: its mask is constant.
The result equals `decode.step`'s (tests: every variant with S | W, eager and static side by side); a layer
feeds its first tokens, before every phase has its windows in flight (`start`), through `decode.step`.
Staggered heads keep their last hidden states in place; S not dividing W (W5/S2: phases feed 2 or 3 windows)
has no static form.
"""

from __future__ import annotations

import torch

from phasekv.attention import blockwise, decode
from phasekv.attention.cache import CompressedLayerCache, FullLayerCache, InFlight
from phasekv.attention.compressor import Partial
from phasekv.errors import ConfigError


def reserve(store, capacity: int, like: torch.Tensor) -> None:
    """Grow a `cache.Growable` to hold `capacity` appended slots (values shaped like `like`, (B, n_kv, *, D)),
    zeros past the appended ones: a static step reads them (masked, weight 0: they must be finite)."""
    store.allocate(like)
    end = store.lead + store.n
    if store.buf.shape[2] < store.lead + capacity:
        grown = store.buf.new_empty(*store.buf.shape[:2], store.lead + capacity, store.buf.shape[3])
        grown[:, :, :end] = store.buf[:, :, :end]
        store.buf = grown
    store.buf[:, :, end:].zero_()


def start(attn) -> int:
    """The first position layer `attn`'s static step may take: from there on every phase has its W/S windows in
    flight, every staggered head its token and a local window's ring is full (0 for full attention)."""
    g = attn.grid
    if g is None:
        return 0
    if g.window % g.stride:
        raise ConfigError(f"static decode needs the stride to divide the window, got W{g.window}/S{g.stride}")
    delay = max(d for d, _ in attn.compressor.head_groups())
    full_ring = 0 if g.local_window is None else g.exact_keep - 1
    return max(g.offset + g.window - g.stride, g.offset, delay, full_ring, 0)


class StaticFull:
    """A full-attention layer's cache, keys and values preallocated for `capacity` tokens."""

    def __init__(self, attn, cache: FullLayerCache, batch: int, capacity: int):
        self.cache, self.capacity = cache, capacity
        like = attn.k_proj.weight.new_empty(batch, attn.cfg.n_kv_heads, 0, attn.cfg.head_dim)
        for store in (cache.k, cache.v):
            reserve(store, capacity, like)
        cache.plan = cache.plan or decode.StepPlan.build(attn)
        self.slots = torch.arange(capacity, device=like.device)  # (capacity,)

    def step(self, attn, h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """One token h (B, 1, d) at position t (1,) -> z (B, H, 1, D), as `decode.step`."""
        q, k, v = decode.project(attn, self.cache.plan, h.select(1, 0), t)  # (B, H, D), (B, n_kv, D) x2
        keys, values = (s.buf.narrow(2, 0, self.capacity) for s in (self.cache.k, self.cache.v))
        keys.index_copy_(2, t, k[:, :, None])
        values.index_copy_(2, t, v[:, :, None])
        return decode.read(q, keys, values, self.slots > t, None)  # (B, H, 1, D)

    def sync(self, pos: int) -> None:
        """Leave the cache as `decode.step` would after positions < pos (an eager step may follow)."""
        self.cache.k.n = self.cache.v.n = pos


class StaticCompressed:
    """A compressed layer's cache: [ring | entries] preallocated for the entries of `capacity` tokens, the in-flight
    partials updated in place, the compressor rows of every phase stacked."""

    def __init__(self, attn, cache: CompressedLayerCache, batch: int, capacity: int):
        g = self.grid = attn.grid
        cache.plan = cache.plan or decode.StepPlan.build(attn)
        self.cache, self.keep = cache, g.exact_keep
        self.delay = max(d for d, _ in attn.compressor.head_groups())
        n_br, k, _, D, G = cache.plan.phases[0][1].shape  # (a group's KV heads: every head's below)
        n_kv = attn.cfg.n_kv_heads
        self.n = g.n_complete(capacity) + 1  # entry slots: every entry of capacity tokens, and the one in flight
        like = attn.k_proj.weight.new_empty(batch, n_kv, 0, D)
        cache._allocate(like, like)
        for store in filter(None, (cache.entries_k, cache.entries_v)):
            reserve(store, self.n, like)
        cache.inflight = cache.inflight or InFlight.of(cache.partials, (batch, n_br, k, n_kv, G, D), like)
        self.rows = [(torch.stack(r.rows), torch.stack(r.bias)) for _, r in cache.plan.phases]  # (S, R, d), (S, R)
        self.entry_end = g.entry_end(torch.arange(self.n, device=like.device))  # (n,): seen from t = its end on
        self.seen = like.new_ones(batch, 1, n_kv, G)  # z of the oldest window's partial: it holds a token
        self.phase: int | None = None  # phi of the next step where the caller knows it (`at`); None: on the device
        self.hidden = torch.zeros(self.keep + self.n, dtype=torch.bool, device=like.device)  # keys t does not see

    def at(self, pos: int | None) -> None:
        """The next step is at position pos, known on the host (one graph per phase), or None (any position)."""
        g = self.grid
        self.phase = None if pos is None else (pos - g.offset) % g.stride

    def step(self, attn, h: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """One token h (B, 1, d) at position t (1,), t >= `start(attn)` -> z (B, H, 1, D), as `decode.step`."""
        g, cache, x = self.grid, self.cache, h.select(1, 0)  # x (B, d)
        q, k, v = decode.project(attn, cache.plan, x, t)  # (B, H, D), (B, n_kv, D) x2
        self._extend(attn, x, t)
        slot = t % self.keep  # (1,)
        keys = cache.entries_k.buf.narrow(2, 0, self.keep + self.n)  # (B, n_kv, keep + n, D): [ring | entries]
        values = keys if cache.entries_v is None else cache.entries_v.buf.narrow(2, 0, self.keep + self.n)
        keys.index_copy_(2, slot, k[:, :, None])
        if cache.entries_v is not None:
            values.index_copy_(2, slot, v[:, :, None])
        cache.ring_pos.index_copy_(0, slot, t)
        if g.local_window is None:  # the uncompressed tail: the ring slots seen change with t
            self.hidden[: self.keep] = ~g.sees_exact(t, cache.ring_pos)
        # (a full ring holds the local window: every slot seen)
        torch.gt(self.entry_end, t, out=self.hidden[self.keep :])  # ~Grid.sees_entry
        return decode.read(q, keys, values, self.hidden, attn.sinks)

    def _extend(self, attn, x: torch.Tensor, t: torch.Tensor) -> None:
        """`decode.extend` of token x (B, d) at t: merge it into its W/S windows, write the oldest's entry (on the
        triton backend one fused kernel, which completes the oldest window where t is its last)."""
        g, cache, state = self.grid, self.cache, self.cache.inflight
        if self.phase is None:
            phi = (t - g.offset) % g.stride  # (1,)
            rows = [(w.index_select(0, phi)[0], b.index_select(0, phi)) for w, b in self.rows]  # (R, d), (1, R)
        else:
            rows = [(w[self.phase], b[self.phase]) for w, b in self.rows]
        groups = attn.compressor.head_groups()
        xs = [x if d == 0 else cache.history[:, self.delay - d] for d, _ in groups]  # (B, d) each: views
        k = state.lse.shape[2]
        payload, gate = decode.token_windows(xs, [(w, b, p.shape[2]) for (w, b), (_, p) in zip(rows, cache.plan.phases,
                                                                                             strict=True)],
                                             k, cache.plan.phases[0][1].shape, cache.plan.phases[0][1].gated)
        if self.delay:  # after the views above are read
            cache.history.copy_(torch.cat([cache.history[:, 1:], x[:, None]], 1))
        if blockwise.backend(x) == "triton" and blockwise.triton_decode_update(
                attn.compressor, attn.k_norm, state.lse, state.mean, payload, gate, k, t, cache.entries_k.buf,
                getattr(cache.entries_v, "buf", None), self.keep):
            return
        decode.merge(state, payload, gate)
        if self.phase is None:
            self._complete(attn, t, phi == g.stride - 1)
        elif self.phase == g.stride - 1:
            self._complete(attn, t, None)

    def _complete(self, attn, t: torch.Tensor, done: torch.Tensor | None) -> None:
        """Write the oldest in-flight window's entry to its slot and move the windows one slot older, where `done`
        (1,) holds (the token at t is that window's last), or always (None)."""
        g, cache, state = self.grid, self.cache, self.cache.inflight
        j = torch.div(t - g.offset - g.window, g.stride, rounding_mode="floor") + 1  # (1,) oldest window in flight
        oldest = [Partial(state.lse[:, b, :1], self.seen, state.mean[:, b, :1]) for b in range(state.lse.shape[1])]
        raw = [b.finalize(p) for b, p in zip(attn.compressor.branches(), oldest, strict=True)]
        ek, ev = attn.compressor.entry_kv(raw, j, attn.k_norm)  # (B, n_kv, 1, D): seen from its last token on
        cache.entries_k.buf.index_copy_(2, self.keep + j, ek)
        if cache.entries_v is not None:
            cache.entries_v.buf.index_copy_(2, self.keep + j, ev)
        for buf, empty in ((state.lse, float("-inf")), (state.mean, 0.0)):
            older = torch.cat([buf[:, :, 1:], torch.full_like(buf[:, :, :1], empty)], 2)
            buf.copy_(older if done is None else torch.where(done, older, buf))

    def sync(self, pos: int) -> None:
        """Leave the cache as `decode.step` would after positions < pos (an eager step may follow)."""
        g = self.grid
        self.cache.entries_k.n = g.n_complete(pos)
        if self.cache.entries_v is not None:
            self.cache.entries_v.n = g.n_complete(pos)
        self.cache.inflight.live = g.n_started(pos) - g.n_complete(pos)


def make(attn, cache, batch: int, capacity: int) -> StaticFull | StaticCompressed:
    """The static step of layer `attn` (the study's `Attention`) over its decode cache, from `start(attn)` on; the
    cache is the static step's from then on (a chunk through `PhaseLM.forward` would replace its in-flight state)."""
    if isinstance(cache, FullLayerCache):
        return StaticFull(attn, cache, batch, capacity)
    return StaticCompressed(attn, cache, batch, capacity)
