"""The one place that says which keys a query sees and where compressed entries sit (docs: Model names).

Entry `j` of a layer whose window grid starts at `o` (0 unless staggered; -S for a V4 CSA compressor,
whose first window holds only its current block) is written from tokens `jS+o .. jS+o+W-1` (those at
positions < 0 absent), carries RoPE position `jS+o+rope_at` (its first token; V4: its current block's
first token) and becomes visible to the query at `t` iff `jS+o+W-1 <= t` (DeepSeek-V4's rule). Offset `i`
of a window sits at phase `(o + i) mod S`. Exact tokens: the local window
`t-n_local+1 .. t`, or, for the uncompressed tail, every token after the last visible entry's end.
Tokens before the first complete window are reachable only through the exact tokens.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Grid:
    """A layer's window grid: which tokens make entry j, where it sits, when a query sees it, and which exact
    tokens a query sees beside the entries. Every visibility and geometry rule of the package is here."""

    window: int  # W
    stride: int  # S
    offset: int = 0  # position of entry 0's first token (a phase, or negative: a leading partial window)
    local_window: int | None = 16  # None: uncompressed tail
    rope_at: int = 0  # RoPE position of an entry, counted from its first token

    def entry_start(self, j: torch.Tensor) -> torch.Tensor:
        """Position of entry j's first token."""
        return j * self.stride + self.offset

    def entry_position(self, j: torch.Tensor) -> torch.Tensor:
        """RoPE position of entry j."""
        return self.entry_start(j) + self.rope_at

    def window_tokens(self, j: torch.Tensor) -> torch.Tensor:
        """(n, W) positions of the tokens that make entries j (n,)."""
        return self.entry_start(j)[:, None] + torch.arange(self.window, device=j.device)

    def offset_phase(self, i: torch.Tensor) -> torch.Tensor:
        """Phase (t mod S) of window offset i."""
        return (self.offset + i) % self.stride

    def entry_end(self, j: torch.Tensor) -> torch.Tensor:
        return j * self.stride + self.offset + self.window - 1

    def n_complete(self, length: int) -> int:
        """Entries whose windows lie inside positions 0..length-1."""
        last = length - 1 - self.offset - (self.window - 1)
        return 0 if last < 0 else last // self.stride + 1

    def n_started(self, length: int) -> int:
        """Windows with at least one token inside positions 0..length-1."""
        return max(0, (length - 1 - self.offset) // self.stride + 1)

    def boundary_phase(self) -> int:
        """Phase of a window's last token."""
        return (self.offset + self.window - 1) % self.stride

    def last_visible_end(self, t: torch.Tensor) -> torch.Tensor:
        """End position of the newest entry visible at t, or -1 when none is."""
        n = torch.div(t - self.offset - self.window + 1, self.stride, rounding_mode="floor")  # newest j
        return torch.where(n >= 0, self.entry_end(n), torch.full_like(t, -1))

    def sees_entry(self, t: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """Elementwise (broadcasting) rule: entry j is complete by query position t."""
        return self.entry_end(j) <= t

    def sees_exact(self, t: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """Elementwise (broadcasting) rule: the exact token at p is visible to the query at t."""
        causal = p <= t
        if self.local_window is not None:
            return causal & (p > t - self.local_window)
        return causal & (p > self.last_visible_end(t))

    def entry_visible(self, t: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """(Tq, n_e) bool: entry j is complete by query position t."""
        return self.sees_entry(t[:, None], j[None, :])

    def exact_visible(self, t: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """(Tq, n_x) bool: exact token at p is visible to the query at t."""
        return self.sees_exact(t[:, None], p[None, :])

    def mask(self, t: torch.Tensor, j: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        """(Tq, n_e + n_x) bool over [entries, exact tokens]: one softmax runs over the True keys."""
        return torch.cat([self.entry_visible(t, j), self.exact_visible(t, p)], dim=1)

    @property
    def exact_keep(self) -> int:
        """Exact tokens a decode cache must keep: the local window, or the longest possible tail."""
        if self.local_window is not None:
            return self.local_window
        return max(self.offset + self.window - 1, self.stride)
