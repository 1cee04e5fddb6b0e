"""The chunked compressor of SPEC §2: per-offset gates Z_i, b_i and payloads C_i for every KV head.

    s_{j,i} = Z_i h_{j,i} + b_i,   alpha_{j,i} = softmax_i s_{j,i},   K^_j = sum_i alpha_{j,i} * C_i h_{j,i}

Windows are compressed as streaming softmax partials (running max m, normaliser z, weighted payload acc),
so the same code compresses a whole sequence at once and a window whose tokens arrive one at a time
in a decode cache: partials of disjoint token sets merge exactly.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from phasekv.attention.norm import RMSNorm
from phasekv.config import ModelConfig


@dataclass
class Partial:
    """Softmax partials of a batch of windows, per KV head (G = 1 for scalar gates, d_head for vector)."""

    m: torch.Tensor  # (B, n, n_kv, G) running max of gate logits (-inf: no token seen yet)
    z: torch.Tensor  # (B, n, n_kv, G) sum_i exp(s_i - m)
    acc: torch.Tensor  # (B, n, n_kv, d_head) sum_i exp(s_i - m) * C_i h_i

    def merge(self, other: Partial) -> Partial:
        m = torch.maximum(self.m, other.m)
        m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        a, b = (self.m - m_safe).exp(), (other.m - m_safe).exp()  # 0 where a side saw no token
        return Partial(m, self.z * a + other.z * b, self.acc * a + other.acc * b)

    def slice(self, start: int, stop: int | None = None) -> Partial:
        return Partial(self.m[:, start:stop], self.z[:, start:stop], self.acc[:, start:stop])

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.m, self.z, self.acc))


class CompressorBranch(nn.Module):
    """One compressed stream (keys or values) of a layer."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        W, n_kv, d_head, d = cfg.window, cfg.n_kv_heads, cfg.head_dim, cfg.d_model
        std = d**-0.5
        self.payload = nn.Parameter(torch.randn(W, n_kv, d_head, d) * std)  # C_i per offset and KV head
        G = d_head if cfg.gate == "vector" else 1
        self.gate_weight = None if cfg.gate == "uniform" else nn.Parameter(torch.randn(W, n_kv, G, d) * std)  # Z_i
        self.gate_bias = nn.Parameter(torch.zeros(W, n_kv, G)) if cfg.gate != "uniform" and cfg.gate_bias else None
        self.post_norm = RMSNorm(d_head, cfg.norm_eps) if cfg.post_norm else None

    def logits(self, windows: torch.Tensor) -> torch.Tensor:
        """Gate logits s (B, n, W, n_kv, G) of windows (B, n, W, d); zeros for uniform averaging."""
        if self.gate_weight is None:
            B, n, W, _ = windows.shape
            return windows.new_zeros(B, n, W, self.payload.shape[1], 1)
        s = torch.einsum("bnwd,wkgd->bnwkg", windows, self.gate_weight)  # (B, n, W, n_kv, G)
        return s if self.gate_bias is None else s + self.gate_bias

    def gate_scores(self, windows: torch.Tensor) -> torch.Tensor:
        """alpha (B, n, W, n_kv, G): softmax over the W offsets of each complete window."""
        return self.logits(windows).softmax(dim=2)

    def partial(self, windows: torch.Tensor, present: torch.Tensor | None = None) -> Partial:
        """Partials of windows (B, n, W, d); `present` (n, W) marks the offsets whose tokens are given."""
        s = self.logits(windows)  # (B, n, W, n_kv, G)
        if present is not None:
            s = s.masked_fill(~present[None, :, :, None, None], float("-inf"))
        m = s.amax(dim=2)  # (B, n, n_kv, G)
        m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        e = (s - m_safe[:, :, None]).exp()  # (B, n, W, n_kv, G), 0 at absent offsets
        payload = torch.einsum("bnwd,wkcd->bnwkc", windows, self.payload)  # (B, n, W, n_kv, d_head)
        return Partial(m, e.sum(dim=2), (e * payload).sum(dim=2))

    def token_partial(self, h: torch.Tensor, offsets: torch.Tensor) -> Partial:
        """Partials of one token h (B, d) sitting at `offsets` (n_w,) of n_w windows: what `partial` gives for
        windows holding that token alone, computing only its own offsets (the decode step)."""
        B, d = h.shape
        n_w, n_kv = offsets.shape[0], self.payload.shape[1]
        payload = F.linear(h, self.payload[offsets].reshape(-1, d)).view(B, n_w, n_kv, -1)  # (B, n_w, n_kv, d_head)
        if self.gate_weight is None:
            s = payload.new_zeros(B, n_w, n_kv, 1)
        else:
            s = F.linear(h, self.gate_weight[offsets].reshape(-1, d)).view(B, n_w, n_kv, -1)  # (B, n_w, n_kv, G)
            s = s if self.gate_bias is None else s + self.gate_bias[offsets]
        return Partial(s, torch.ones_like(s), payload)

    def finalize(self, p: Partial) -> torch.Tensor:
        """Compressed entries (B, n_kv, n, d_head) from the partials of complete windows."""
        entry = p.acc / p.z  # (B, n, n_kv, d_head)
        if self.post_norm is not None:
            entry = self.post_norm(entry)
        return entry.transpose(1, 2)


class Compressor(nn.Module):
    """Key branch and (unless K/V are tied) value branch of one layer."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.window, self.stride = cfg.window, cfg.stride
        self.key = CompressorBranch(cfg)
        self.value = None if cfg.tied_kv else CompressorBranch(cfg)

    def branches(self) -> list[CompressorBranch]:
        return [self.key] if self.value is None else [self.key, self.value]

    def windows(self, h: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """Complete windows (B, n, W, d) of hidden states h (B, T, d) on a grid starting at `offset`."""
        h = h[:, offset:]
        if h.shape[1] < self.window:
            return h.new_zeros(h.shape[0], 0, self.window, h.shape[2])
        return h.unfold(1, self.window, self.stride).transpose(2, 3)  # (B, n, W, d)
