"""Decode caches. A compressed layer keeps only its complete entries, the softmax partials of the
windows still being written, and a ring buffer of exact recent keys/values; a full-attention layer
keeps every key/value. `nbytes` counts the data each holds.

A compressed layer stores its ring in the leading slots of the entries' buffer ([ring | entries]), so
a decode step reads every key it may see as one contiguous view of the cache (`decode.step`)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from phasekv.attention.compressor import Partial
from phasekv.attention.positions import Grid

NO_POSITION = -(2**40)  # ring slots not yet written: invisible under every visibility rule


def _nbytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class Growable:
    """A (B, n_kv, lead + n, d_head) tensor: `lead` fixed slots (a decode ring; zeros until written), then n
    slots that grow along dim 2 with amortised O(1) appends."""

    def __init__(self, lead: int = 0):
        self.lead = lead
        self.buf: torch.Tensor | None = None
        self.n = 0

    def allocate(self, like: torch.Tensor) -> None:
        """Make the buffer for values shaped like `like` (B, n_kv, *, d_head) if there is none yet."""
        if self.buf is None:
            self.buf = like.new_empty(like.shape[0], like.shape[1], self.lead + 64, like.shape[-1])
            self.buf[:, :, : self.lead] = 0  # unwritten ring slots are masked; zeros keep their weight-0 values finite

    def make_room(self, k: int, like: torch.Tensor) -> None:
        """Allocate the buffer (values shaped like `like`) or grow it to hold k more slots (doubling)."""
        self.allocate(like)
        end = self.lead + self.n
        if end + k > self.buf.shape[2]:
            grown = self.buf.new_empty(*self.buf.shape[:2], max(2 * self.buf.shape[2], end + k), self.buf.shape[3])
            grown[:, :, :end] = self.buf[:, :, :end]
            self.buf = grown

    def append(self, x: torch.Tensor) -> None:  # x (B, n_kv, k, d_head)
        k = x.shape[2]
        self.make_room(k, x)
        end = self.lead + self.n
        self.buf[:, :, end : end + k] = x
        self.n += k

    def view(self, like: torch.Tensor) -> torch.Tensor:
        """The appended (B, n_kv, n, d_head) values (an empty tensor shaped like `like` before any append)."""
        if self.buf is None:
            return like.new_zeros(like.shape[0], like.shape[1], 0, like.shape[3])
        return self.buf[:, :, self.lead : self.lead + self.n]

    def lead_view(self) -> torch.Tensor:
        """The (B, n_kv, lead, d_head) leading slots."""
        return self.buf[:, :, : self.lead]

    def whole(self) -> torch.Tensor:
        """Leading slots and appended values, (B, n_kv, lead + n, d_head): one view, no copy."""
        return self.buf.narrow(2, 0, self.lead + self.n)

    @property
    def nbytes(self) -> int:
        if self.buf is None:
            return 0
        return self.n * _nbytes(self.buf) // self.buf.shape[2]


class FullLayerCache:
    """Every key and value seen so far."""

    def __init__(self):
        self.k, self.v = Growable(), Growable()
        self.plan = None  # decode.StepPlan, made at the first one-token step

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


@dataclass
class InFlight:
    """The in-flight partials as a decode step updates them in place (`decode.extend`): per window, the log of its
    softmax normaliser and its softmax-weighted mean payload so far, so that a token merges in with one logaddexp
    and one lerp. One slot per window a token may belong to, oldest first (the started windows, then empty
    slots), every branch stacked."""

    lse: torch.Tensor  # (B, n_branches, ceil(W/S), n_kv, G): log sum_i exp(s_i); -inf in an empty slot
    mean: torch.Tensor  # (B, n_branches, ceil(W/S), n_kv, d_head): sum_i softmax_i C_i h_i; 0 in an empty slot
    live: int  # windows started

    @classmethod
    def of(cls, partials: list[Partial] | None, shape: tuple[int, ...], like: torch.Tensor) -> InFlight:
        """The reference's per-branch partials of windows n_entries.. in slots of
        shape (B, n_branches, slots, n_kv, G, d_head), with `like`'s dtype and device."""
        B, n_br, slots, n_kv, G, D = shape
        lse = like.new_full((B, n_br, slots, n_kv, G), float("-inf"))
        mean = like.new_zeros(B, n_br, slots, n_kv, D)
        live = partials[0].m.shape[1] if partials else 0
        if live:
            lse[:, :, :live] = torch.stack([p.m + p.z.log() for p in partials], 1)
            # z >= 1 once a window has seen a token (its max term is exp(0)); a staggered head's window may
            # have none yet (z = 0, acc = 0): mean 0, as an empty slot
            mean[:, :, :live] = torch.stack([p.acc / p.z.clamp_min(1.0) for p in partials], 1)
        return cls(lse, mean, live)

    def partials(self, slots: slice) -> list[Partial]:
        """Per branch, these slots as `Partial`s (m = lse, z = 1 where a token was seen else 0, acc = mean)."""
        z = self.lse[:, :, slots].isfinite().to(self.mean.dtype)
        return [Partial(self.lse[:, b, slots], z[:, b], self.mean[:, b, slots]) for b in range(self.lse.shape[1])]

    def branches(self) -> list[Partial]:
        """The started windows' partials per branch: the form `Attention._extend_entries` keeps."""
        return self.partials(slice(0, self.live))


class CompressedLayerCache:
    """Complete entries + partials of in-flight windows + a ring buffer of exact tokens."""

    def __init__(self, grid: Grid, tied: bool):
        self.grid, self.tied = grid, tied
        keep = grid.exact_keep
        self.entries_k, self.entries_v = Growable(keep), (None if tied else Growable(keep))  # [ring | entries]
        self._partials: list[Partial] | None = None  # one per branch; windows n_entries, n_entries+1, ...
        self.inflight: InFlight | None = None  # the same partials in the decode step's form (one of the two is set)
        self.ring_pos: torch.Tensor | None = None  # (keep,) positions held by each ring slot; None before any write
        self.plan = None  # decode.StepPlan, made at the first one-token step
        self.history: torch.Tensor | None = None  # (B, max delay, d) last hidden states (staggered heads only)

    @property
    def n_entries(self) -> int:
        return self.entries_k.n

    def delayed(self, h: torch.Tensor, groups: list[tuple[int, slice | None]]) -> list[tuple[torch.Tensor, int,
                                                                                             slice | None]]:
        """(x, delay, heads) per head group: the chunk h (B, T, d) as the group reads it, position t holding
        h[t - delay] (zeros before the sequence's start); keeps the last hidden states the next chunk needs."""
        keep = max(d for d, _ in groups)
        if keep == 0:
            return [(h, 0, heads) for _, heads in groups]
        T = h.shape[1]
        past = h[:, :0] if self.history is None else self.history
        seq = torch.cat([past, h], 1)  # (B, n_past + T, d)
        self.history = seq[:, -keep:]
        seq = F.pad(seq, (0, 0, max(0, T + keep - seq.shape[1]), 0))  # zeros before position 0
        end = seq.shape[1]
        return [(seq[:, end - T - d : end - d], d, heads) for d, heads in groups]

    @property
    def partials(self) -> list[Partial] | None:
        """Per branch, the partials of windows n_entries, n_entries+1, ... (taken from `inflight` if it holds them)."""
        if self.inflight is not None:
            self._partials, self.inflight = self.inflight.branches(), None
        return self._partials

    @partials.setter
    def partials(self, value: list[Partial]) -> None:
        self._partials, self.inflight = value, None

    def _allocate(self, k: torch.Tensor, v: torch.Tensor) -> None:
        self.entries_k.allocate(k)
        if self.entries_v is not None:
            self.entries_v.allocate(v)
        if self.ring_pos is None:
            self.ring_pos = torch.full((self.grid.exact_keep,), NO_POSITION, dtype=torch.long, device=k.device)

    def write_exact(self, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> None:
        """Put the newest exact tokens k, v (B, n_kv, T, d_head) at positions pos (T,) into the ring."""
        keep = self.grid.exact_keep
        self._allocate(k, v)
        k, v, pos = k[:, :, -keep:], v[:, :, -keep:], pos[-keep:]
        slot = pos % keep
        self.entries_k.buf[:, :, slot] = k
        if self.entries_v is not None:
            self.entries_v.buf[:, :, slot] = v
        self.ring_pos[slot] = pos

    def write_token(self, k: torch.Tensor, v: torch.Tensor, t: int) -> None:
        """`write_exact` of one token k, v (B, n_kv, d_head) at position t, without index tensors."""
        self._allocate(k, v)
        slot = t % self.grid.exact_keep
        self.entries_k.buf.select(2, slot).copy_(k)
        if self.entries_v is not None:
            self.entries_v.buf.select(2, slot).copy_(v)
        self.ring_pos[slot] = t

    def ring(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Exact keys, values (B, n_kv, keep, d_head) and their positions (keep,); empty before any write."""
        if self.ring_pos is None:
            empty = like[:, :, :0]
            return empty, empty, torch.zeros(0, dtype=torch.long, device=like.device)
        rk = self.entries_k.lead_view()
        return rk, (rk if self.entries_v is None else self.entries_v.lead_view()), self.ring_pos

    @property
    def nbytes(self) -> int:
        entries = self.entries_k.nbytes + (0 if self.entries_v is None else self.entries_v.nbytes)
        in_flight = self.inflight.branches() if self.inflight else self._partials or []
        partials = sum(p.nbytes for p in in_flight)
        ring = 0
        if self.ring_pos is not None:
            per_slot = _nbytes(self.entries_k.buf) // self.entries_k.buf.shape[2]
            ring = self.grid.exact_keep * per_slot * (1 if self.entries_v is None else 2)
        return entries + partials + ring + _nbytes(self.history)


class PhaseCache:
    """Per-layer caches plus the position of the next token. Made by `PhaseLM.new_cache(batch_size)`."""

    def __init__(self, layers: list, batch_size: int):
        self.layers = layers
        self.batch_size = batch_size
        self.pos = 0  # position of the next token fed

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)
