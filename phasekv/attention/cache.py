"""Decode caches. A compressed layer keeps only its complete entries, the softmax partials of the
windows still being written, and a ring buffer of exact recent keys/values; a full-attention layer
keeps every key/value. `nbytes` counts the data each holds."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from phasekv.attention.compressor import Partial
from phasekv.attention.positions import Grid

NO_POSITION = -(2**40)  # ring slots not yet written: invisible under every visibility rule


def _nbytes(*tensors: torch.Tensor | None) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


class Growable:
    """A (B, n_kv, n, d_head) tensor that grows along n with amortised O(1) appends."""

    def __init__(self):
        self.buf: torch.Tensor | None = None
        self.n = 0

    def append(self, x: torch.Tensor) -> None:  # x (B, n_kv, k, d_head)
        k = x.shape[2]
        if self.buf is None:
            self.buf = x.new_empty(x.shape[0], x.shape[1], max(64, k), x.shape[3])
        if self.n + k > self.buf.shape[2]:
            grown = self.buf.new_empty(*self.buf.shape[:2], max(2 * self.buf.shape[2], self.n + k), self.buf.shape[3])
            grown[:, :, : self.n] = self.buf[:, :, : self.n]
            self.buf = grown
        self.buf[:, :, self.n : self.n + k] = x
        self.n += k

    def view(self, like: torch.Tensor) -> torch.Tensor:
        """The stored (B, n_kv, n, d_head) values (an empty tensor shaped like `like` before any append)."""
        if self.buf is None:
            return like.new_zeros(like.shape[0], like.shape[1], 0, like.shape[3])
        return self.buf[:, :, : self.n]

    @property
    def nbytes(self) -> int:
        if self.buf is None:
            return 0
        return self.n * _nbytes(self.buf) // self.buf.shape[2]


class FullLayerCache:
    """Every key and value seen so far."""

    def __init__(self):
        self.k, self.v = Growable(), Growable()

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes


class CompressedLayerCache:
    """Complete entries + partials of in-flight windows + a ring buffer of exact tokens."""

    def __init__(self, grid: Grid, tied: bool):
        self.grid, self.tied = grid, tied
        self.entries_k, self.entries_v = Growable(), (None if tied else Growable())
        self.partials: list[Partial] | None = None  # one per branch; windows n_entries, n_entries+1, ...
        self.ring_k = self.ring_v = None  # (B, n_kv, keep, d_head)
        self.ring_pos: torch.Tensor | None = None  # (keep,) positions held by each slot
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

    def write_exact(self, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> None:
        """Put the newest exact tokens k, v (B, n_kv, T, d_head) at positions pos (T,) into the ring."""
        keep = self.grid.exact_keep
        if self.ring_k is None:
            B, n_kv, _, d = k.shape
            self.ring_k = k.new_zeros(B, n_kv, keep, d)
            self.ring_v = None if self.tied else v.new_zeros(B, n_kv, keep, d)
            self.ring_pos = torch.full((keep,), NO_POSITION, dtype=torch.long, device=k.device)
        k, v, pos = k[:, :, -keep:], v[:, :, -keep:], pos[-keep:]
        slot = pos % keep
        self.ring_k[:, :, slot] = k
        if self.ring_v is not None:
            self.ring_v[:, :, slot] = v
        self.ring_pos[slot] = pos

    def ring(self, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Exact keys, values (B, n_kv, keep, d_head) and their positions (keep,); empty before any write."""
        if self.ring_k is None:
            empty = like[:, :, :0]
            return empty, empty, torch.zeros(0, dtype=torch.long, device=like.device)
        return self.ring_k, (self.ring_k if self.ring_v is None else self.ring_v), self.ring_pos

    @property
    def nbytes(self) -> int:
        entries = self.entries_k.nbytes + (0 if self.entries_v is None else self.entries_v.nbytes)
        partials = sum(p.nbytes for p in self.partials) if self.partials else 0
        return entries + partials + _nbytes(self.ring_k, self.ring_v, self.history)


class PhaseCache:
    """Per-layer caches plus the position of the next token. Made by `PhaseLM.new_cache(batch_size)`."""

    def __init__(self, layers: list, batch_size: int):
        self.layers = layers
        self.batch_size = batch_size
        self.pos = 0  # position of the next token fed

    @property
    def nbytes(self) -> int:
        return sum(layer.nbytes for layer in self.layers)
