"""MoBA (Mixture of Block Attention; Lu et al., 2025): each query attends exactly to the tokens of its top-k blocks.

The keys sit in blocks of B tokens from position 0. A query at position t, in block c = t // B, scores every
earlier block b < c by q · mean(keys of b) (fp32, unscaled; the keys normalised and rotated as attention sees
them), takes the top k, its own block always chosen and counted in k, and runs one softmax over every token of
the chosen earlier blocks and, causally, its own block. top-k = 1 is causal block-diagonal attention; top-k >= the
number of blocks is full causal attention.

GQA: selection is per query head, as in the reference (which gates per head): a query head scores the blocks with
the mean keys of the KV head it reads, so heads of one KV group may choose different blocks.

Knockout (evaluation): `oracle_blocks` (B,) forces one block per sequence (the one holding the target record)
into the selection of every query that can see it (an earlier block than its own), in place of its
lowest-ranked non-current choice when it was not chosen already: selection failure apart from use failure.

The reference is dense: a (B, H, T, N) mask over every key, which is also the path at the family's tiny scale.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from phasekv.attention.attention import Attention
from phasekv.attention.cache import Growable
from phasekv.config import ModelConfig
from phasekv.errors import ConfigError


def block_means(k: torch.Tensor, block: int) -> torch.Tensor:
    """Mean keys (B, n_kv, n, D) in fp32 of the n complete blocks of keys k (B, n_kv, N, D) from position 0."""
    n = k.shape[2] // block
    return k[:, :, : n * block].float().unflatten(2, (n, block)).mean(3)


def chosen_blocks(q: torch.Tensor, pos: torch.Tensor, means: torch.Tensor, n_blocks: int, block: int, top_k: int,
                  oracle: torch.Tensor | None = None) -> torch.Tensor:
    """Which of blocks 0..n_blocks-1 each query chooses, (B, H, T, n_blocks) bool. q (B, H, T, D) at positions pos
    (T,); means (B, n_kv, n, D): the complete blocks' mean keys (n >= every query's own block); oracle (B,) or None."""
    B, H, T, D = q.shape
    n_kv = means.shape[1]
    qg = q.float().view(B, n_kv, H // n_kv, T, D)  # query heads grouped by the KV head they read
    scores = (qg @ means[:, :, None].transpose(-1, -2)).flatten(1, 2)  # (B, H, T, n): unscaled q · mean key
    scores = F.pad(scores, (0, n_blocks - scores.shape[-1]), value=float("-inf"))  # (B, H, T, n_blocks)
    j = torch.arange(n_blocks, device=q.device)  # (n_blocks,)
    own = (pos // block)[:, None]  # (T, 1): each query's own block
    scores = scores.masked_fill(j > own, float("-inf")).masked_fill(j == own, float("inf"))
    if oracle is not None:  # an earlier oracle block ranks with the query's own: both always chosen
        forced = (j == oracle.view(B, 1, 1, 1)) & (j < own)  # (B, 1, T, n_blocks)
        scores = scores.masked_fill(forced, float("inf"))
    top = scores.topk(min(top_k, n_blocks), dim=-1).indices  # (B, H, T, k)
    chosen = torch.zeros_like(scores, dtype=torch.bool).scatter_(-1, top, True)
    return chosen & (scores > float("-inf"))  # a query with fewer earlier blocks than k takes only those


def moba_attention(q: torch.Tensor, pos: torch.Tensor, k: torch.Tensor, v: torch.Tensor, means: torch.Tensor,
                   block: int, top_k: int, oracle: torch.Tensor | None = None) -> torch.Tensor:
    """Per-head outputs (B, H, T, D) of queries q (B, H, T, D) at positions pos (T,) over keys and values
    k, v (B, n_kv, N, D) at positions 0..N-1 (N > max(pos)), given the complete blocks' mean keys `means`."""
    N = k.shape[2]
    n_blocks = -(-N // block)
    chosen = chosen_blocks(q, pos, means, n_blocks, block, top_k, oracle)  # (B, H, T, n_blocks)
    key_pos = torch.arange(N, device=q.device)  # (N,)
    mask = chosen[..., key_pos // block] & (key_pos <= pos[:, None])  # (B, H, T, N): chosen blocks, causal
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


class MoBACache:
    """Every key and value seen so far, and the mean keys (fp32) of its complete blocks."""

    def __init__(self, block: int):
        self.block = block
        self.k, self.v, self.means = Growable(), Growable(), Growable()

    def extend(self, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Append a chunk's k, v (B, n_kv, T, D); returns every key, value and complete block's mean key."""
        self.k.append(k)
        self.v.append(v)
        keys = self.k.view(k)  # (B, n_kv, N, D)
        done, n = self.means.n, keys.shape[2] // self.block  # blocks averaged already, blocks complete now
        if n > done:
            self.means.append(block_means(keys[:, :, done * self.block : n * self.block], self.block))
        return keys, self.v.view(v), self.means.view(keys.float())

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes + self.means.nbytes


class MoBAAttention(Attention):
    """One layer's MoBA: the layer's projections, QK-norm, RoPE and GQA (`Attention`'s), each query over the
    tokens of its top-k key blocks. `oracle_blocks` (B,) or None: the oracle-block knockout (module docstring)."""

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__(cfg, layer)
        self.oracle_blocks: torch.Tensor | None = None

    def grids(self) -> dict[str, int]:
        return self.cfg.grids

    def forward(self, h: torch.Tensor, pos: torch.Tensor, cache: MoBACache | None = None,
                shift: torch.Tensor | None = None, last: bool = False) -> torch.Tensor:
        """h (B, T, d) normed hidden states at positions pos (T,) -> (B, T, d); with a cache the chunk continues
        it; with `last` (no cache) the last position alone, (B, 1, d). `shift` (grid jitter) does not apply."""
        block, top_k, oracle = self.cfg.block, self.cfg.top_k, self.oracle_blocks
        if oracle is not None and (top_k < 2 or oracle.shape != (h.shape[0],)):
            raise ConfigError(f"MoBA oracle_blocks: needs top_k >= 2 (got {top_k}) and one block per sequence "
                              f"(shape ({h.shape[0]},), got {tuple(oracle.shape)})")
        k, v = self._exact_kv(h, pos)  # (B, n_kv, T, D)
        q_at = pos[-1:] if last else pos
        q = self._queries(h[:, -1:] if last else h, q_at)  # (B, H, T or 1, D)
        if cache is None:
            means = block_means(k, block)  # (B, n_kv, T // B, D)
        else:
            k, v, means = cache.extend(k, v)  # every key so far
        z = moba_attention(q, q_at, k, v, means, block, top_k, oracle)  # (B, H, T or 1, D)
        z = self.z_hook(z.transpose(1, 2))  # (B, T, H, D)
        return self.o_proj(z.flatten(2))

    def new_cache(self) -> MoBACache:
        return MoBACache(self.cfg.block)
