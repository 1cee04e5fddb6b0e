"""Activation Beacon (Zhang et al., ICLR 2025), interleaved: a window's raw tokens leave the cache, its beacons stay.

The context sits in windows of w raw tokens from position 0. After every r raw tokens comes a beacon token, so
the model's residual stream interleaves them: raw 0..r-1, beacon 0, raw r..2r-1, beacon 1, ... (stream slot
s = t + t // r for raw token t; beacon g at slot g (r + 1) + r). `PhaseLM` inserts a learned beacon embedding at
every beacon slot (`interleave`), runs every layer over the stream and keeps the raw tokens' outputs, so the
model's logits are per raw token as for every other variant; its attention layers get stream slots as positions.

In each layer a beacon has its own q/k/v projections (initialised as copies of the layer's) and shares the layer's
QK-norm, RoPE and output projection. A slot attends causally to the slots of its own window (raw and beacon) and to
the beacons of every completed window: once a window's last beacon is written its raw keys and values leave the
cache and its w / r beacons' stay, so after n complete windows a layer's cache holds n w / r entries plus the
current window's slots. RoPE position: a raw token's own position; a beacon's is that of the raw token before it
(the last it summarises), so raw tokens keep the positions every other variant gives them.

`z_hook` sees the raw tokens' per-head outputs (B, T_raw, H, D) (a beacon has no prediction to knock out).
Knockout (evaluation): `beacon_knockout`, a set of beacon indices i in 0..w/r-1 within a window (beacon i
summarises raw offsets i r .. i r + r - 1): those beacons of every completed window are invisible to every query.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from phasekv.attention.attention import Attention
from phasekv.attention.cache import Growable
from phasekv.config import ModelConfig


def stream_slot(t: int, ratio: int) -> int:
    """The stream slot of raw token t (also the slot where a chunk starting at raw token t starts)."""
    return t + t // ratio


def interleave(x: torch.Tensor, start: int, ratio: int, beacon: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                                      torch.Tensor]:
    """The residual stream of raw tokens x (B, T, d) at positions start.. with the beacon embedding `beacon` (d,)
    after every r-th raw token: (stream (B, T_s, d), its slots (T_s,), the raw rows (T,) in it). A beacon that
    follows the chunk's last raw token is in the chunk (the cache needs it; no raw output depends on it)."""
    B, T, d = x.shape
    slots = torch.arange(stream_slot(start, ratio), stream_slot(start + T, ratio), device=x.device)  # (T_s,)
    raw = torch.nonzero(~is_beacon(slots, ratio)).flatten()  # (T,)
    stream = beacon.to(x.dtype).expand(B, len(slots), d).index_copy(1, raw, x)  # (B, T_s, d)
    return stream, slots, raw


def is_beacon(slots: torch.Tensor, ratio: int) -> torch.Tensor:
    return slots % (ratio + 1) == ratio


def rope_position(slots: torch.Tensor, ratio: int) -> torch.Tensor:
    """RoPE positions of stream slots: a raw token's own; a beacon's, the raw token before it."""
    g, j = slots // (ratio + 1), slots % (ratio + 1)
    return g * ratio + j.clamp_max(ratio - 1)


def visible(q_slots: torch.Tensor, k_slots: torch.Tensor, ratio: int, window: int,
            knockout: set[int] | frozenset[int] = frozenset()) -> torch.Tensor:
    """(Tq, N) bool: which key slots each query slot sees: causal within its own window, and the beacons of
    completed windows (except the knocked-out beacon indices)."""
    span = window + window // ratio  # stream slots per window
    qw, kw = q_slots[:, None] // span, k_slots[None, :] // span  # (Tq, 1), (1, N)
    beacon = is_beacon(k_slots, ratio)[None, :]  # (1, N)
    if knockout:
        index = (k_slots // (ratio + 1)) % (window // ratio)  # beacon index within its window
        beacon = beacon & ~torch.isin(index, torch.tensor(sorted(knockout), device=k_slots.device))[None, :]
    return (k_slots[None, :] <= q_slots[:, None]) & ((kw == qw) | (beacon & (kw < qw)))


class BeaconCache:
    """The keys and values of the stream slots a later slot may still see: the beacons of completed windows and
    every slot of the current window; `slots` (N,) their stream slots."""

    def __init__(self, ratio: int, window: int):
        self.ratio, self.window = ratio, window
        self.k, self.v = Growable(), Growable()
        self.slots: torch.Tensor | None = None

    def extend(self, k: torch.Tensor, v: torch.Tensor, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor,
                                                                                     torch.Tensor]:
        """Keys and values (B, n_kv, N, D) of the cache and a chunk's k, v (B, n_kv, T, D) at `slots`, and the
        N slots they hold (the chunk appended)."""
        self.k.append(k)
        self.v.append(v)
        self.slots = slots if self.slots is None else torch.cat([self.slots, slots])
        return self.k.view(k), self.v.view(v), self.slots

    def evict(self, end: int) -> None:
        """Drop the raw slots of every window complete before stream slot `end` (the next slot to come)."""
        span = self.window + self.window // self.ratio
        keep = is_beacon(self.slots, self.ratio) | (self.slots // span >= end // span)  # (N,)
        if bool(keep.all()):
            return
        idx = torch.nonzero(keep).flatten()
        k, v = self.k.view(self.k.buf).index_select(2, idx), self.v.view(self.v.buf).index_select(2, idx)
        self.k, self.v, self.slots = Growable(), Growable(), self.slots[idx]
        self.k.append(k)
        self.v.append(v)

    @property
    def n(self) -> int:
        """Entries held (per layer, per KV head)."""
        return self.k.n

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes + (0 if self.slots is None else self.slots.numel() * 8)


class BeaconAttention(Attention):
    """One layer's attention over an interleaved raw/beacon stream (module docstring): the layer's projections for
    raw slots, `beacon_q`, `beacon_k`, `beacon_v` for beacon slots. `beacon_knockout`: beacon indices or None."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__(cfg, layer)
        self.beacon_q = nn.Linear(*self.q_proj.weight.shape[::-1], bias=False)
        self.beacon_k = nn.Linear(*self.k_proj.weight.shape[::-1], bias=False)
        self.beacon_v = nn.Linear(*self.v_proj.weight.shape[::-1], bias=False)
        self.beacon_knockout: set[int] | None = None
        self.init_copies()

    @torch.no_grad()
    def init_copies(self) -> None:
        """Beacon projections := the layer's (also run by `PhaseLM`'s init after it initialises the layer's)."""
        for mine, layers in ((self.beacon_q, self.q_proj), (self.beacon_k, self.k_proj), (self.beacon_v, self.v_proj)):
            mine.weight.copy_(layers.weight)

    def grids(self) -> dict[str, int]:
        return self.cfg.grids

    def _project(self, h: torch.Tensor, beacon: torch.Tensor, raw_proj: nn.Linear, beacon_proj: nn.Linear,
                 n: int) -> torch.Tensor:
        """Heads (B, n, T_s, D) of a projection: the layer's on raw slots, the beacon's on beacon slots."""
        idx = torch.nonzero(beacon).flatten()
        x = raw_proj(h).index_copy(1, idx, beacon_proj(h[:, idx]))  # (B, T_s, n D)
        return self._heads(x, n)

    def forward(self, h: torch.Tensor, pos: torch.Tensor, cache: BeaconCache | None = None,
                shift: torch.Tensor | None = None, last: bool = False) -> torch.Tensor:
        """h (B, T_s, d): normed hidden states of the stream slots pos (T_s,) -> (B, T_s, d); with a cache the chunk
        continues it; with `last` (no cache) the last raw slot alone, (B, 1, d). `shift` (grid jitter) does not apply."""
        cfg, r, w = self.cfg, self.cfg.beacon_ratio, self.cfg.beacon_window
        beacon = is_beacon(pos, r)  # (T_s,)
        rope = rope_position(pos, r)  # (T_s,)
        q = self._rope(self.q_norm(self._project(h, beacon, self.q_proj, self.beacon_q, cfg.n_heads)), rope)
        k = self._rope(self.k_norm(self._project(h, beacon, self.k_proj, self.beacon_k, cfg.n_kv_heads)), rope)
        v = self._project(h, beacon, self.v_proj, self.beacon_v, cfg.n_kv_heads)  # (B, n_kv, T_s, D)
        k_slots = pos
        if cache is not None:
            k, v, k_slots = cache.extend(k, v, pos)  # every slot a later one may see
        mask = visible(pos, k_slots, r, w, frozenset(self.beacon_knockout or ()))  # (T_s, N)
        z = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)  # (B, H, T_s, D)
        if cache is not None:
            cache.evict(int(pos[-1]) + 1)
        raw = torch.nonzero(~beacon).flatten()
        z = z.transpose(1, 2)  # (B, T_s, H, D)
        z = z.index_copy(1, raw, self.z_hook(z[:, raw]))  # the hook sees raw tokens only
        if last:
            z = z[:, raw[-1:]]  # (B, 1, H, D)
        return self.o_proj(z.flatten(2))

    def new_cache(self) -> BeaconCache:
        return BeaconCache(self.cfg.beacon_ratio, self.cfg.beacon_window)
