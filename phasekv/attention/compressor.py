"""Compressors (docs: Model names, 'How a compressed layer works'): one compressed entry per window of W tokens, every S tokens.

Every variant is the general compressor of the paper, read through its own parameterisation:

    s_{j,i} = Z_i h_{j,i} + b_i,   alpha_{j,i} = softmax_i s_{j,i},   K^_j = sum_i alpha_{j,i} * C_i h_{j,i}

A variant declares its per-offset parameters (`CompressorBranch.offset_params`), which of them are
offset-specific gate parameters (`cycled_params`: what gate cycling rolls) and how its entries become keys
and values (`Compressor.entry_kv`); everything else (softmax partials, decode, gate scores) is shared.

- `OffsetBranch` / `PaperCompressor`: the paper's compressor, own Z_i, b_i, C_i per offset (scalar or vector
  gates, uniform averaging, tied K/V, post-norm).
- `V4Branch` / `V4Compressor`: DeepSeek-V4's (transformers' `DeepseekV4HCACompressor`, W = S, and
  `DeepseekV4CSACompressor`, W = 2S): one payload and one gate projection shared by every offset, a per-slot
  vector bias (`position_bias`, the only offset-specific gate term), per-channel softmax, RMSNorm after
  pooling, one vector as key and value. With W = 2S the window's first S slots read the previous block
  through the first half of the channels, the last S the current block through the second half.

Windows are compressed as streaming softmax partials (running max m, normaliser z, weighted payload acc),
so the same code compresses a whole sequence at once and a window whose tokens arrive one at a time
in a decode cache: partials of disjoint token sets merge exactly.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from phasekv.attention.norm import RMSNorm
from phasekv.attention.positions import Grid
from phasekv.attention.rope import Rope
from phasekv.config import ModelConfig
from phasekv.config.model import COMPRESSORS as COMPRESSOR_NAMES

OffsetParams = tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]
GATE_BIAS_NAMES = ("gate_bias", "position_bias")  # the variants' gate-bias parameters (biases: no weight decay)
OUT_OF_BAND = -1e4  # phase bands: gate logit added outside a head's band (exp underflows to 0; finite, so a window
#                     holding no token of the band averages instead of giving NaN)


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

    def cat(self, other: Partial) -> Partial:
        return Partial(*(torch.cat([a, b], 1) for a, b in ((self.m, other.m), (self.z, other.z), (self.acc, other.acc))))

    @staticmethod
    def cat_heads(parts: list[Partial]) -> Partial:
        """Partials of the same windows for consecutive groups of KV heads, joined along the KV-head dim."""
        if len(parts) == 1:
            return parts[0]
        return Partial(*(torch.cat(t, 2) for t in zip(*((p.m, p.z, p.acc) for p in parts), strict=True)))

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.m, self.z, self.acc))


class CompressorBranch(nn.Module, ABC):
    """One compressed stream (keys or values) of a layer. Subclasses say how offset i's payload C_i (W, n_kv,
    d_head, d), gate Z_i (W, n_kv, G, d) and bias b_i (W, n_kv, G) are made (`offset_params`); no gate
    (uniform averaging) gives zero logits."""

    post_norm: nn.Module | None

    @abstractmethod
    def offset_params(self) -> OffsetParams:
        """Per-offset payload (W, n_kv, d_head, d), gate (W, n_kv, G, d) or None, bias (W, n_kv, G) or None."""

    @abstractmethod
    def cycled_params(self) -> list[nn.Parameter]:
        """Offset-specific gate parameters, offsets along dim 0: what gate cycling rolls."""

    def own_matrices(self) -> list[nn.Parameter]:
        """Weight matrices that are not inside an nn.Linear (initialised like one, by the model)."""
        return []

    def stored_params(self) -> OffsetParams:
        """`offset_params` with a payload that every offset shares as stored: one row (what the fused kernels read)."""
        return self.offset_params()

    @property
    def gated(self) -> bool:
        return self.offset_params()[1] is not None

    def head_params(self, heads: slice | None = None) -> OffsetParams:
        """`offset_params` of the KV heads `heads` (all when None)."""
        params = self.offset_params()
        if heads is None:
            return params
        return tuple(None if p is None else p[:, heads] for p in params)

    def project(self, windows: torch.Tensor, heads: slice | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Payloads C_i h (B, n, W, n_kv, d_head) and gate logits s (B, n, W, n_kv, G) of windows (B, n, W, d) for
        the KV heads `heads` (all when None): `project_windows` of this branch alone; zero logits for uniform
        averaging."""
        c, s = (t[..., 0, :].movedim(0, 2) for t in project_windows([self], windows, None, heads))
        return c, s

    def logits(self, windows: torch.Tensor, heads: slice | None = None) -> torch.Tensor:
        """Gate logits s (B, n, W, n_kv, G) of windows (B, n, W, d) for the KV heads `heads` (all when None); zeros
        for uniform averaging."""
        return self.project(windows, heads)[1]

    def gate_scores(self, windows: torch.Tensor, heads: slice | None = None) -> torch.Tensor:
        """alpha (B, n, W, n_kv, G) of the KV heads `heads` (all when None): softmax over the W offsets of each
        complete window."""
        return self.logits(windows, heads).softmax(dim=2)

    def pool(self, windows: torch.Tensor, present: torch.Tensor | None = None,
             heads: slice | None = None) -> torch.Tensor:
        """Compressed entries (B, n_kv, n, d_head) of complete windows (B, n, W, d): `pool` of this branch alone."""
        return pool([self], windows, present, heads)[0]

    def partial(self, windows: torch.Tensor, present: torch.Tensor | None = None, heads: slice | None = None) -> Partial:
        """Partials of windows (B, n, W, d) for the KV heads `heads` (all when None); `present` (n, W), or
        (1 or B, n, W) per sequence, marks the offsets whose tokens are given."""
        c, s = (t[..., 0, :] for t in project_windows([self], windows, present, heads))  # (W, B, n, n_kv, D or G)
        m = s.amax(dim=0)  # (B, n, n_kv, G)
        m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        e = (s - m_safe).exp()  # (W, B, n, n_kv, G), 0 at absent offsets
        return Partial(m, e.sum(dim=0), (e * c).sum(dim=0))

    def token_partial(self, h: torch.Tensor, offsets: torch.Tensor, heads: slice | None = None) -> Partial:
        """Partials of one token h (B, d) sitting at `offsets` (n_w,) of n_w windows, for the KV heads `heads`
        (all when None): what `partial` gives for windows holding that token alone, computing only its own
        offsets (the decode step)."""
        B, d = h.shape
        payload_w, gate_w, bias = self.head_params(heads)
        n_w, n_kv = offsets.shape[0], payload_w.shape[1]
        payload = F.linear(h, payload_w[offsets].reshape(-1, d)).view(B, n_w, n_kv, -1)  # (B, n_w, n_kv, d_head)
        if gate_w is None:
            s = payload.new_zeros(B, n_w, n_kv, 1)
        else:
            s = F.linear(h, gate_w[offsets].reshape(-1, d)).view(B, n_w, n_kv, -1)  # (B, n_w, n_kv, G)
            s = s if bias is None else s + bias[offsets]
        return Partial(s, torch.ones_like(s), payload)

    def finalize(self, p: Partial) -> torch.Tensor:
        """Compressed entries (B, n_kv, n, d_head) from the partials of complete windows; a window with no present
        token (z = 0, acc = 0) gives an explicit zero entry, not 0/0 (z >= 1 once any token is seen: its max's
        term is exp(0), so the clamp changes nothing else)."""
        return self._entry(p.acc / p.z.clamp(min=1.0))  # (B, n, n_kv, d_head)

    def _entry(self, entry: torch.Tensor) -> torch.Tensor:
        """Pooled windows (B, n, n_kv, d_head) -> entries (B, n_kv, n, d_head), post-normed where the variant is."""
        if self.post_norm is not None:
            entry = self.post_norm(entry)
        return entry.transpose(1, 2)


class OffsetBranch(CompressorBranch):
    """The paper's branch: its own payload C_i, gate Z_i and bias b_i for every offset i; `band` (W, n_kv) bool
    (phase bands, `key_band`): KV head h's gate logits are OUT_OF_BAND at the offsets outside its band, a fixed mask
    folded into the bias, so the head never reads those phases."""

    def __init__(self, cfg: ModelConfig, band: torch.Tensor | None = None):
        super().__init__()
        W, n_kv, d_head, d = cfg.window, cfg.n_kv_heads, cfg.head_dim, cfg.d_model
        std = d**-0.5
        n_payloads = 1 if cfg.shared_payload else W  # shared payload: one C for every offset
        self.payload = nn.Parameter(torch.randn(n_payloads, n_kv, d_head, d) * std)  # C_i per offset and KV head
        G = d_head if cfg.gate == "vector" else 1
        self.gate_weight = None if cfg.gate == "uniform" else nn.Parameter(torch.randn(W, n_kv, G, d) * std)  # Z_i
        self.gate_bias = nn.Parameter(torch.zeros(W, n_kv, G)) if cfg.gate != "uniform" and cfg.gate_bias else None
        self.post_norm = RMSNorm(d_head, cfg.norm_eps) if cfg.post_norm else None
        self.window = W
        self.register_buffer("band", None if band is None else torch.where(band, 0.0, OUT_OF_BAND)[..., None],
                             persistent=False)  # (W, n_kv, 1) logit mask; rebuilt from the config, not saved

    def offset_params(self) -> OffsetParams:
        payload = self.payload if self.payload.shape[0] == self.window else self.payload.expand(self.window, -1, -1, -1)
        bias = self.gate_bias
        if self.band is not None:
            G = self.gate_weight.shape[2]
            bias = self.band.expand(-1, -1, G) if bias is None else bias + self.band  # (W, n_kv, G)
        return payload, self.gate_weight, bias  # a shared payload: one C viewed at every offset

    def stored_params(self) -> OffsetParams:
        return self.payload, *self.offset_params()[1:]

    def cycled_params(self) -> list[nn.Parameter]:
        return [p for p in (self.gate_weight, self.gate_bias) if p is not None]

    def own_matrices(self) -> list[nn.Parameter]:
        return [p for p in (self.payload, self.gate_weight) if p is not None]


class V4Branch(CompressorBranch):
    """DeepSeek-V4's branch: `kv_proj` and `gate_proj` shared by every offset, a per-slot vector bias, kv_norm.

    Channels are laid out (half, kv_head, d_head): half 0 serves the window's first S slots (the previous
    block, W = 2S only), half 1 its last S; transformers' CSA `[..., :head_dim]` / `[..., head_dim:]`."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        W, S, n_kv, D, d = cfg.window, cfg.stride, cfg.n_kv_heads, cfg.head_dim, cfg.d_model
        self.halves, self.head_dim = W // S, D  # halves 1: HCA (W = S); 2: CSA (W = 2S)
        self.kv_proj = nn.Linear(d, self.halves * n_kv * D, bias=False)
        self.gate_proj = nn.Linear(d, self.halves * n_kv * D, bias=False)
        self.position_bias = nn.Parameter(torch.zeros(S, self.halves * n_kv * D)) if cfg.gate_bias else None
        self.post_norm = RMSNorm(D, cfg.norm_eps)  # transformers' kv_norm
        offset = torch.arange(W)
        self.register_buffer("offset_half", offset // S, persistent=False)  # (W,) channel half each offset reads
        self.register_buffer("offset_slot", offset % S, persistent=False)  # (W,) bias slot of each offset

    def _per_offset(self, w: torch.Tensor) -> torch.Tensor:
        """(halves * n_kv * D, d) shared weight -> (W, n_kv, D, d), one copy per offset."""
        return w.view(self.halves, -1, self.head_dim, w.shape[-1])[self.offset_half]

    def offset_params(self) -> OffsetParams:
        bias = None
        if self.position_bias is not None:
            pb = self.position_bias.view(-1, self.halves, self.position_bias.shape[1] // self.halves // self.head_dim,
                                         self.head_dim)  # (S, halves, n_kv, D)
            bias = pb[self.offset_slot, self.offset_half]  # (W, n_kv, D)
        return self._per_offset(self.kv_proj.weight), self._per_offset(self.gate_proj.weight), bias

    def cycled_params(self) -> list[nn.Parameter]:
        return [] if self.position_bias is None else [self.position_bias]  # slots along dim 0; halves stay


class Compressor(nn.Module, ABC):
    """A layer's compressed streams on its window grid: the windows of a sequence, the branches that pool
    them, and how pooled entries become attention keys and values."""

    rope_layout = "leading"  # RoPE layout of the whole layer (queries, exact keys, entries); see rope.Rope
    applies_k_norm = True  # entries get the layer's key QK-norm before RoPE
    slot_gates = False  # offset-specific gate parameters have one row per slot of S (cyclable at any W), not per offset

    @staticmethod
    def lead(cfg: ModelConfig) -> int:
        """Tokens of a window before its entry's RoPE position; the grid starts that far before its phase."""
        return 0

    @staticmethod
    def learns_gates(cfg: ModelConfig) -> bool:
        """Whether a compressor of `cfg` has learned gate parameters (no: uniform averaging)."""
        return cfg.gate != "uniform"

    @staticmethod
    def has_offset_gates(cfg: ModelConfig) -> bool:
        """Whether it has offset-specific gate parameters: what gate cycling rolls (`cycled_params`)."""
        return cfg.gate != "uniform"

    def __init__(self, grid: Grid, rope: Rope, delays: tuple[int, ...] = (0,)):
        super().__init__()
        self.grid, self.rope = grid, rope  # the layer's window grid and RoPE
        self.window, self.stride = grid.window, grid.stride
        self.delays = delays  # per KV head: tokens by which its windows start before the grid (staggered heads)
        self.register_buffer("delay_table", torch.tensor(delays, dtype=torch.int32), persistent=False)  # on the device

    def head_groups(self, shift: torch.Tensor | None = None) -> list[tuple[int | torch.Tensor, slice | None]]:
        """(delay, KV heads) of each group of heads whose windows start equally early: one group of every head
        (heads None) unless heads are staggered. `shift` (B,) adds a per-sequence delay (grid jitter)."""
        groups: list[list[int]] = []  # [delay, first head, end]
        for h, d in enumerate(self.delays):
            if groups and groups[-1][0] == d:
                groups[-1][2] = h + 1
            else:
                groups.append([d, h, h + 1])
        out = [(self.delays[0], None)] if len(groups) == 1 else [(d, slice(a, b)) for d, a, b in groups]
        return out if shift is None else [(shift + d, heads) for d, heads in out]

    @abstractmethod
    def branches(self) -> list[CompressorBranch]:
        """The key branch, then the value branch when values have their own."""

    def named_branches(self) -> list[tuple[str, CompressorBranch]]:
        return list(zip(("key", "value"), self.branches(), strict=False))

    def cycled_params(self) -> list[nn.Parameter]:
        return [p for b in self.branches() for p in b.cycled_params()]

    @property
    def gated(self) -> bool:
        return self.branches()[0].gated

    def windows(self, h: torch.Tensor, delay: int | torch.Tensor = 0) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Complete windows (B, n, W, d) of hidden states h (B, T, d) on the grid, each starting `delay` tokens
        early (an int, or (B,) per sequence), and `present` ((n, W), (1 or B, n, W) with a delay, or None)
        marks the offsets whose tokens exist (those before position 0 are absent, zero weight)."""
        g = self.grid
        n = g.n_complete(h.shape[1])
        if n == 0:
            return h.new_zeros(h.shape[0], 0, self.window, h.shape[2]), None
        x, valid = delayed(h, delay)  # (B, T, d), (1 or B, T) or None
        first = g.entry_start(0)
        x = x if first == 0 else F.pad(x, (0, 0, max(0, -first), 0))[:, max(0, first):]  # position first + i at i
        windows = tile(x, self.window, self.stride, n).transpose(2, 3)  # (B, n, W, d)
        present = None if first >= 0 else g.window_tokens(torch.arange(n, device=h.device)) >= 0  # (n, W)
        if valid is not None:
            valid = F.pad(valid, (max(0, -first), 0))[:, max(0, first):]
            valid = tile(valid, self.window, self.stride, n)  # (1 or B, n, W)
            present = valid if present is None else valid & present
        return windows, present

    def holds_token(self, n: int, shift: torch.Tensor | None = None) -> torch.Tensor | None:
        """(B, n_kv, n) bool: which of the first n entries' windows hold a token when each sequence's windows start
        `shift` (B,) tokens early (grid jitter), on top of a head's delay; None when all do, as on the fixed grid
        always (a head's delay is under S, and a window reaches at most W - S before its grid's first block). An
        entry without a token is an explicit zero, and attention masks it."""
        if shift is None:
            return None
        ends = self.grid.entry_end(torch.arange(n, device=shift.device))  # (n,) last position of each window
        delays = shift[:, None] + torch.tensor(self.delays, device=shift.device)  # (B, n_kv)
        holds = ends >= delays[:, :, None]  # (B, n_kv, n): its last token read from a position >= 0
        if torch.compiler.is_compiling():
            return holds  # a captured layer reads no value back to the host
        return None if bool(holds.all()) else holds

    def gate_scores(self, h: torch.Tensor, shift: torch.Tensor | None = None) -> list[tuple[str, CompressorBranch,
                                                                                           torch.Tensor]]:
        """(name, branch, alpha (B, n, W, n_kv, G)) of each branch over the complete windows of h (B, T, d)
        that hold W real tokens for every KV head: what gate statistics and the coverage regulariser read."""
        groups = [(self.windows(h, delay), heads) for delay, heads in self.head_groups(shift)]
        skip = max(0 if p is None else int((~p.reshape(-1, *p.shape[-2:]).all(-1).all(0)).sum())
                   for (_, p), _ in groups)  # leading windows with an absent token for some head or sequence
        return [(name, b, torch.cat([b.gate_scores(w[:, skip:], heads) for (w, _), heads in groups], 3))
                for name, b in self.named_branches()]

    def entry_kv(self, raw: list[torch.Tensor], j: torch.Tensor, k_norm: nn.Module | None = None):
        """Keys and values (B, n_kv, n, D) of entries j from their pooled branches raw (B, n_kv, n, D) each:
        the layer's key QK-norm where the variant applies it, then RoPE at the entry's position."""
        k = k_norm(raw[0]) if self.applies_k_norm and k_norm is not None else raw[0]
        k = self.rope(k, self.grid.entry_position(j))
        return k, (k if len(raw) == 1 else raw[1])

    def entries(self, h: torch.Tensor, k_norm: nn.Module | None = None,
                shift: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values (B, n_kv, n, D) of every complete entry of hidden states h (B, T, d); `shift` (B,)
        starts each sequence's windows that many tokens early (grid jitter in training)."""
        raw: list[list[torch.Tensor]] = [[] for _ in self.branches()]
        for delay, heads in self.head_groups(shift):
            windows, present = self.windows(h, delay)  # (B, n, W, d), (n, W), (1 or B, n, W) or None
            for out, entry in zip(raw, pool(self.branches(), windows, present, heads), strict=True):
                out.append(entry)  # (B, n_kv of the group, n, D)
        pooled = [r[0] if len(r) == 1 else torch.cat(r, 1) for r in raw]  # (B, n_kv, n, D) each
        return self.entry_kv(pooled, torch.arange(pooled[0].shape[2], device=h.device), k_norm)


class PaperCompressor(Compressor):
    """Key branch and (unless K/V are tied) value branch, each with per-offset parameters."""

    def __init__(self, cfg: ModelConfig, grid: Grid, rope: Rope, layer: int = 0):
        super().__init__(grid, rope, head_delays(cfg))
        self.key = OffsetBranch(cfg, key_band(cfg, layer))  # phase bands restrict the key gates: what a query finds
        self.value = None if cfg.tied_kv else OffsetBranch(cfg)

    def branches(self) -> list[CompressorBranch]:
        return [self.key] if self.value is None else [self.key, self.value]


class V4Compressor(Compressor):
    """DeepSeek-V4's compressor: one branch whose entry is both key and value, RMSNorm-ed by its own kv_norm
    (not the layer's QK-norm), rotated by V4's RoPE (interleaved pairs on the trailing dims) at the first
    position of the entry's current block."""

    rope_layout = "trailing"
    applies_k_norm = False
    slot_gates = True  # position_bias: S slots, shared by both halves of a W = 2S window

    @staticmethod
    def lead(cfg: ModelConfig) -> int:
        return cfg.window - cfg.stride  # CSA: the previous block; the first window has only its current block

    @staticmethod
    def learns_gates(cfg: ModelConfig) -> bool:
        return True  # gate_proj, shared by every slot

    @staticmethod
    def has_offset_gates(cfg: ModelConfig) -> bool:
        return cfg.gate_bias  # the slot bias is V4's only offset-specific gate term

    def __init__(self, cfg: ModelConfig, grid: Grid, rope: Rope):
        super().__init__(grid, rope, head_delays(cfg))
        self.key = V4Branch(cfg)

    def branches(self) -> list[CompressorBranch]:
        return [self.key]

    def compressed_entries(self, h: torch.Tensor) -> torch.Tensor:
        """Entries (B, n, D) of hidden states h (B, T, d) of a one-KV-head compressor: what transformers'
        DeepseekV4{CSA,HCA}Compressor returns (stateless, no cache) as compressed KV, squeezed."""
        k, _ = self.entries(h)  # (B, 1, n, D)
        return k.squeeze(1)


def project_windows(branches: list[CompressorBranch], windows: torch.Tensor, present: torch.Tensor | None = None,
                    heads: slice | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Payloads c (W, B, n, n_kv, nb, d_head) and gate logits s (W, B, n, n_kv, nb, G) of complete windows
    (B, n, W, d), offsets first, for the KV heads `heads` (all when None) of every branch (a layer's branches share
    their shapes), from ONE batched matmul over the W offsets; logits 0 for uniform averaging (G = 1) and -inf at
    the offsets `present` ((n, W), or (1 or B, n, W) per sequence) marks absent."""
    params = [b.head_params(heads) for b in branches]  # once each: a variant may build them from shared weights
    W, n_kv, D, d = params[0][0].shape
    G = 0 if params[0][1] is None else params[0][1].shape[2]  # gate logits per KV head (0: uniform averaging)
    weight = torch.stack([p[0] if G == 0 else torch.cat(p[:2], 2) for p in params], 2)  # (W, n_kv, nb, D + G, d)
    B, n = windows.shape[:2]
    x = windows.permute(2, 0, 1, 3).reshape(W, B * n, d)  # offset-major (a view when the windows tile h)
    y = torch.bmm(x, weight.flatten(1, 3).transpose(1, 2)).view(W, B, n, n_kv, len(branches), D + G)
    c, s = y.split([D, G], -1)  # (W, B, n, n_kv, nb, D), (W, B, n, n_kv, nb, G)
    if G == 0:
        s = y.new_zeros(()).expand(W, B, n, n_kv, len(branches), 1)  # uniform averaging: equal logits
    elif any(p[2] is not None for p in params):  # a banded key branch has a bias beside a value branch without
        s = s + torch.stack([p[1].new_zeros(p[1].shape[:3]) if p[2] is None else p[2] for p in params],
                            2)[:, None, None]  # bias (W, n_kv, nb, G)
    if present is not None:
        mask = (present if present.dim() == 3 else present[None]).permute(2, 0, 1)  # (W, 1 or B, n)
        s = s.masked_fill(~mask[..., None, None, None], float("-inf"))
    return c, s


def pool(branches: list[CompressorBranch], windows: torch.Tensor, present: torch.Tensor | None = None,
         heads: slice | None = None) -> list[torch.Tensor]:
    """Per branch, the compressed entries (B, n_kv, n, d_head) of complete windows (B, n, W, d) for the KV heads
    `heads` (all when None); `present` as in `project_windows`. The training forward: each window's softmax over
    its offsets in one pass over every branch's `project_windows`; per branch equal to `finalize(partial(...))`,
    the streaming form that a decode cache fills token by token. A window with no present token (wholly before
    position 0: grid jitter with staggered heads) has no weights and an explicit zero entry."""
    c, s = project_windows(branches, windows, present, heads)
    alpha = s.softmax(dim=0)  # (W, B, n, n_kv, nb, G); NaN (softmax over -inf alone) where no token is present
    if present is not None:
        empty = ~(present if present.dim() == 3 else present[None]).any(-1)  # (1 or B, n)
        alpha = alpha.masked_fill(empty[None, :, :, None, None, None], 0.0)
    pooled = (alpha * c).sum(dim=0)  # (B, n, n_kv, nb, D)
    return [b._entry(pooled[:, :, :, i]) for i, b in enumerate(branches)]


# the class of each name in config's COMPRESSORS, in its order: a name there without a class here (or the
# reverse) fails at import
COMPRESSORS: dict[str, type[Compressor]] = dict(zip(COMPRESSOR_NAMES, (PaperCompressor, V4Compressor), strict=True))


def phase_band(window: int, stride: int, n_kv: int, slots: int | None = None, first: int = 0) -> torch.Tensor:
    """(W, n_kv) bool: offset i is in the band of KV head h, slot first + h of `slots` (default n_kv), when
    (i mod S) slots // S = first + h: each slot owns a run of about S / slots phases, every phase one slot."""
    owner = (torch.arange(window) % stride) * (slots or n_kv) // stride  # (W,)
    return owner[:, None] == first + torch.arange(n_kv)[None]


def key_band(cfg: ModelConfig, layer: int) -> torch.Tensor | None:
    """The key gates' band of `layer` (W, n_kv) bool: `phase bands` split the phases among the layer's KV heads;
    `layer bands` among every (layer, KV head) of the model, slot layer n_kv + h; None without bands."""
    if cfg.layer_bands:
        return phase_band(cfg.window, cfg.stride, cfg.n_kv_heads, cfg.n_layers * cfg.n_kv_heads, layer * cfg.n_kv_heads)
    return phase_band(cfg.window, cfg.stride, cfg.n_kv_heads) if cfg.phase_bands else None


def head_delays(cfg: ModelConfig) -> tuple[int, ...]:
    """Per KV head, the tokens by which its windows start before the layer's grid (all 0 unless staggered heads)."""
    return tuple(cfg.head_delay(h) for h in range(cfg.n_kv_heads))


def delayed(h: torch.Tensor, delay: int | torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """h (B, T, d) read `delay` tokens late (position t holds h[t - delay]; an int, or (B,) per sequence) and
    `valid` (1 or B, T): where t - delay >= 0 (None when nothing is delayed)."""
    if isinstance(delay, int) and delay == 0:
        return h, None
    t = torch.arange(h.shape[1], device=h.device)
    if isinstance(delay, int):
        return F.pad(h, (0, 0, delay, 0))[:, : h.shape[1]], (t >= delay)[None]
    src = t[None] - delay.to(h.device)[:, None]  # (B, T) source position of each slot
    x = h.gather(1, src.clamp(min=0)[..., None].expand(-1, -1, h.shape[2]))  # (B, T, d)
    return x, src >= 0


def tile(x: torch.Tensor, window: int, stride: int, n: int) -> torch.Tensor:
    """The first n windows of `window` positions every `stride` along dim 1 of x (B, T, ...): (B, n, ..., window),
    as `unfold`. Non-overlapping windows (W = S) are a reshape, whose backward is a copy (unfold's scatters)."""
    if window != stride:
        return x.unfold(1, window, stride)[:, :n]
    y = x[:, : n * window].unflatten(1, (n, window))  # (B, n, W, ...)
    return y.movedim(2, -1)


def layer_grid(cfg: ModelConfig, layer: int) -> Grid:
    """The window grid of `layer`: staggered phase (cfg.grid_offset) and the variant's placement (a V4 CSA
    window, W = 2S, ends with its current block: the grid starts at -S and entry j is positioned at jS)."""
    lead = COMPRESSORS[cfg.compressor].lead(cfg)
    return Grid(cfg.window, cfg.stride, cfg.grid_offset(layer) - lead, cfg.local_window, rope_at=lead)


def learned_gates(cfg: ModelConfig) -> bool:
    """Whether `cfg` is compressed with learned gates (what gate statistics read), asked of its variant."""
    return cfg.compressed and COMPRESSORS[cfg.compressor].learns_gates(cfg)


def cyclable(cfg: ModelConfig) -> bool:
    """Whether gate cycling applies to `cfg`: offset-specific gate parameters, one row per phase (W = S, or
    per-slot gates such as V4's slot bias at any W), asked of its variant."""
    variant = COMPRESSORS[cfg.compressor]
    return cfg.compressed and (cfg.window == cfg.stride or variant.slot_gates) and variant.has_offset_gates(cfg)


def layer_rope(cfg: ModelConfig) -> Rope:
    """The RoPE of every compressed and full layer of `cfg`: its dims and theta, in its compressor's layout."""
    return Rope(cfg.rope_rotary_dims, cfg.rope_theta, COMPRESSORS[cfg.compressor].rope_layout)


def make_compressor(cfg: ModelConfig, grid: Grid, rope: Rope, layer: int = 0) -> Compressor:
    if cfg.compressor == "paper":
        return PaperCompressor(cfg, grid, rope, layer)  # its key band may depend on the layer (layer bands)
    return COMPRESSORS[cfg.compressor](cfg, grid, rope)
