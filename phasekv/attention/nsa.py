"""Native Sparse Attention (Yuan et al. 2025, arXiv 2502.11089): three branches over one query, mixed by gates.

- compressed (`cmp`): blocks of l tokens every d tokens (the block grid: stride d), block j holding tokens
  (j+1)d - l .. (j+1)d - 1 (positions before 0 are zeros: the sequence is left-padded by l - d). Each block's
  un-rotated keys (values), plus a learned intra-block position embedding per KV head, pass a small MLP
  (Linear-ReLU-Linear over the flattened block; one for keys, one for values) to one key (value). Block j is
  visible to the query at i iff (j+1)d - 1 < i; one learned memory key/value per KV head is always visible.
  This branch carries no RoPE: the un-rotated queries read the compressed keys. (With QK-norm, phasekv's default,
  every branch reads normalised queries and keys.)
- selected (`sel`): the exact, rotated tokens of the top-n selection blocks of l' tokens (blocks at multiples of
  l' from 0), ranked per KV group by the compressed branch's attention (`importance`); only blocks complete
  before the query are selectable, and the query's own block is always attended causally.
- sliding window (`win`): the w most recent exact tokens, the query's own included.

Each branch's output is weighted by a per-head sigmoid gate of the hidden state and the three summed.

Scale: the paper's l = 32, d = 16, l' = 64, n = 16, w = 512 cannot be used on the demo's 96-token sequences (the
window alone would cover every token and one selection block would hold two thirds of them: nothing would reach
a distant record through the compressed or selected branch). The family's tiny model, `NSA l8/d4 · select 8 top 2
· window 16`, scales them down (l, d by 4; l', n by 8; w by 32) and keeps their shape: l = 2d (overlapping
blocks), l' = l, 12 selection blocks in 96 tokens of which a query takes 2 plus its own (sparse), a window of 16
that leaves most of the context to the other two branches, and grids d = 4 and l' = 8 that divide the residue
modulus 24.

Conventions that phasekv's other designs do not share (`Conventions`; `PEER` reproduces the PyPI package
`native-sparse-attention-pytorch` 0.2.3's `SparseAttention(causal=True)` with weights copied across):
- rope_layout: None (the model's RoPE, Qwen3's rotate-half) or "trailing", which over all head dims is the
  peer's interleaved rotary (rotary-embedding-torch, theta = cfg.rope_theta);
- importance: "probs" (the paper: the compressed branch's softmax probabilities summed over the heads of a KV
  group and over the compressed blocks whose last d tokens lie in a selection block) or "logits" (the peer:
  the same blocks' scaled logits averaged over the group's heads and blocks, then a softmax with one extra
  logit of -1e3; a block whose share is <= 1e-10 is not attended);
- forced_blocks (a model field): the paper's initial block and two local blocks (the query's own and the one
  before it) among the n; default False, the peer's rule (top n ranked blocks plus the own block).
Wrapped rather than optional: the peer's input RMSNorm is the block's pre-attention norm (apply the peer's
`norm` to the input), its fused `to_qkv` is q_proj/k_proj/v_proj stacked, `combine_heads` is o_proj; its
`sliding_window_size` is w - 1 (it sees that many tokens besides the query's own). qk_norm=False matches it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from phasekv.attention.attention import Attention
from phasekv.attention.cache import Growable
from phasekv.attention.rope import LAYOUTS
from phasekv.config import ModelConfig
from phasekv.errors import ConfigError

BRANCHES = ("cmp", "sel", "win")  # gate order per head, as the peer's combine (Linear(d, 3 H) read as (h s))
IMPORTANCE = ("probs", "logits")
PHANTOM_LOGIT = -1e3  # the peer's extra selection logit: a block is attended only if its share beats 1e-10
MIN_SHARE = 1e-10
GATE_BIAS = (-2.0, -2.0, 2.0)  # the peer's init: gates start mostly on the window (local patterns come first);
#                                PhaseLM redraws the gate's weight like every Linear's, the bias stays


@dataclass(frozen=True)
class Conventions:
    rope_layout: str | None = None  # None: the model's (Qwen3 rotate-half) | "trailing": over all dims, the peer's
    importance: str = "probs"  # "probs": the paper's summed probabilities | "logits": the peer's mean logits


PHASEKV = Conventions()
PEER = Conventions(rope_layout="trailing", importance="logits")


class NSACache:
    """One layer's decode state: every exact key (rotated) and value, the compressed blocks written so far, and the
    un-rotated keys/values from the first token of the next block on (the left padding at the start)."""

    def __init__(self):
        self.k, self.v = Growable(), Growable()  # (B, n_kv, N, D): rotated keys, values of positions 0..N-1
        self.ck, self.cv = Growable(), Growable()  # (B, n_kv, n_blocks, D): compressed keys, values of complete blocks
        self.raw_k = self.raw_v = None  # (B, n_kv, m, D): un-rotated keys, values from position n_blocks d - (l - d)

    @property
    def n(self) -> int:
        return self.k.n

    @property
    def nbytes(self) -> int:
        raw = sum(t.numel() * t.element_size() for t in (self.raw_k, self.raw_v) if t is not None)
        return self.k.nbytes + self.v.nbytes + self.ck.nbytes + self.cv.nbytes + raw


def _mlp(inp: int, out: int) -> nn.Sequential:
    return nn.Sequential(nn.Linear(inp, inp), nn.ReLU(), nn.Linear(inp, out))


class NSAAttention(Attention):
    """One layer's NSA (module docstring); `Attention` builds its projections, QK-norm and RoPE. `branch_gates`
    None: the learned gates; else e.g. "cmp", "sel+win": those branches' gates fixed to 1, the others to 0 (the
    branch knockout). z (B, T, H, D) passes `z_hook` before `o_proj`."""

    def __init__(self, cfg: ModelConfig, layer: int, conventions: Conventions = PHASEKV):
        super().__init__(cfg, layer)  # ModelConfig has checked the NSA fields (one-line errors)
        if conventions.rope_layout not in (None, *LAYOUTS) or conventions.importance not in IMPORTANCE:
            raise ConfigError(f"NSA conventions {conventions} unknown (rope_layout in {LAYOUTS}, importance in "
                              f"{IMPORTANCE})")
        self.conventions = conventions
        if conventions.rope_layout is not None:
            self._rope = dataclasses.replace(self._rope, layout=conventions.rope_layout)
        H, n_kv, D, block = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, cfg.block
        self.k_positions = nn.Parameter(torch.zeros(n_kv, block, D))  # intra-block position embedding of the keys
        self.v_positions = nn.Parameter(torch.zeros(n_kv, block, D))
        self.k_compress = _mlp(block * D, D)  # a block's (l D) flattened keys -> one key
        self.v_compress = _mlp(block * D, D)
        self.memory = nn.Parameter(torch.zeros(2, n_kv, 1, D))  # one learned key (0) and value (1) per KV head
        self.gate = nn.Linear(cfg.d_model, len(BRANCHES) * H)  # per head, one logit per branch: (h s)
        nn.init.zeros_(self.gate.weight)
        with torch.no_grad():
            self.gate.bias.copy_(torch.tensor(GATE_BIAS).repeat(H))
        self._branch_gates: str | None = None

    # ---- the grids and the branch knockout ----
    def grids(self) -> dict[str, int]:
        """The block grids this layer's memory sits on: the compression stride d and the selection block l'."""
        return self.cfg.grids

    @property
    def branch_gates(self) -> str | None:
        return self._branch_gates

    @branch_gates.setter
    def branch_gates(self, value: str | None) -> None:
        if value is not None and (not value or any(b not in BRANCHES for b in value.split("+"))):
            raise ConfigError(f"branch_gates={value!r}: expected None or branches from {BRANCHES} joined by '+'")
        self._branch_gates = value

    def _gates(self, h: torch.Tensor) -> torch.Tensor:
        """Branch weights (B, T, H, 3) of hidden states h (B, T, d): learned sigmoid gates or the knockout's 0/1."""
        B, T, _ = h.shape
        if self._branch_gates is None:
            return torch.sigmoid(self.gate(h)).view(B, T, self.cfg.n_heads, len(BRANCHES))
        on = torch.tensor([b in self._branch_gates.split("+") for b in BRANCHES], dtype=h.dtype, device=h.device)
        return on.expand(B, T, self.cfg.n_heads, len(BRANCHES))

    # ---- projections ----
    def project(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries (B, H, T, D), keys and values (B, n_kv, T, D) of h (B, T, d): normalised, not rotated."""
        cfg = self.cfg
        q = self.q_norm(self._heads(self.q_proj(h), cfg.n_heads))  # (B, H, T, D)
        k = self.k_norm(self._heads(self.k_proj(h), cfg.n_kv_heads))  # (B, n_kv, T, D)
        return q, k, self._heads(self.v_proj(h), cfg.n_kv_heads)

    def compress(self, raw_k: torch.Tensor, raw_v: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The first n blocks of un-rotated keys/values raw (B, n_kv, m, D) whose first block starts at raw's first
        slot (blocks of l every d slots) -> compressed keys, values (B, n_kv, n, D)."""
        block, d = self.cfg.block, self.cfg.block_stride
        B, n_kv, _, D = raw_k.shape
        out = []
        for raw, positions, mlp in ((raw_k, self.k_positions, self.k_compress), (raw_v, self.v_positions, self.v_compress)):
            blocks = raw[:, :, : (n - 1) * d + block].unfold(2, block, d).transpose(-1, -2)  # (B, n_kv, n, l, D)
            out.append(mlp((blocks + positions[:, None]).reshape(B, n_kv, n, block * D)))  # (B, n_kv, n, D)
        return out[0], out[1]

    # ---- forward ----
    def forward(self, h: torch.Tensor, pos: torch.Tensor, cache: NSACache | None = None,
                shift: torch.Tensor | None = None, last: bool = False) -> torch.Tensor:
        """h (B, T, d) normed hidden states at positions pos (T,) -> (B, T, d); with `last` (no cache) the last
        position's output alone (B, 1, d). A cache continues a sequence chunk by chunk with the parallel result.
        `shift` (the study's grid jitter) is ignored: a family model never gets one."""
        if last and cache is not None:
            raise ConfigError("last=True runs a whole prompt: give no cache")
        if cache is None:
            cache = self.new_cache()  # the parallel forward is a first chunk on an empty cache
        elif int(pos[0]) != cache.n:
            raise ConfigError(f"NSA cache holds {cache.n} tokens but the chunk starts at position {int(pos[0])}")
        q, k, v = self.project(h)  # (B, H, T, D), (B, n_kv, T, D) x2
        self._extend(cache, k, v, pos)
        if last:
            q, pos, h = q[:, :, -1:], pos[-1:], h[:, -1:]
        gates = self._gates(h).transpose(1, 2)  # (B, H, Tq, 3)
        z = sum(o * gates[..., s, None] for s, o in enumerate(self._branches(q, pos, cache)))  # (B, H, Tq, D)
        z = self.z_hook(z.transpose(1, 2))  # (B, Tq, H, D)
        return self.o_proj(z.flatten(2))

    def _extend(self, cache: NSACache, k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> None:
        """Append a chunk's keys k (un-rotated), values v (B, n_kv, T, D) at pos to the cache; write the blocks
        they complete."""
        block, d = self.cfg.block, self.cfg.block_stride
        if cache.raw_k is None:  # the left padding: block 0 starts l - d slots before position 0
            cache.raw_k = cache.raw_v = k.new_zeros(*k.shape[:2], block - d, k.shape[3])  # (B, n_kv, l - d, D)
        cache.k.append(self._rope(k, pos))
        cache.v.append(v)
        cache.raw_k, cache.raw_v = torch.cat([cache.raw_k, k], 2), torch.cat([cache.raw_v, v], 2)
        n_new = cache.n // d - cache.ck.n  # blocks completed by this chunk
        if n_new > 0:
            ck, cv = self.compress(cache.raw_k, cache.raw_v, n_new)
            cache.ck.append(ck)
            cache.cv.append(cv)
            cache.raw_k, cache.raw_v = cache.raw_k[:, :, n_new * d :], cache.raw_v[:, :, n_new * d :]

    def _branches(self, q: torch.Tensor, pos: torch.Tensor, cache: NSACache) -> tuple[torch.Tensor, ...]:
        """The branches' outputs (B, H, Tq, D) each, in `BRANCHES` order, for un-rotated queries q (B, H, Tq, D) at
        pos over the cache."""
        cfg = self.cfg
        d, sel_l, w = cfg.block_stride, cfg.select_block, cfg.sliding_window
        B, H, Tq, D = q.shape
        n_kv, N = cfg.n_kv_heads, cache.n
        g = H // n_kv
        # compressed: memory + the blocks complete strictly before the query, un-rotated
        mk, mv = (m.expand(B, -1, -1, -1) for m in self.memory)  # (B, n_kv, 1, D)
        ck, cv = torch.cat([mk, cache.ck.view(mk)], 2), torch.cat([mv, cache.cv.view(mv)], 2)  # (B, n_kv, 1 + n_blocks, D)
        block_end = torch.arange(cache.ck.n, device=q.device) * d + d - 1  # last token of each block
        visible = F.pad(block_end[None, :] < pos[:, None], (1, 0), value=True)  # (Tq, 1 + n_blocks)
        qg = q.view(B, n_kv, g, Tq, D)  # query heads grouped by the KV head they read
        logits = (qg @ ck[:, :, None].transpose(-1, -2) * D**-0.5).masked_fill(~visible, float("-inf"))
        probs = logits.softmax(-1)  # (B, n_kv, g, Tq, 1 + n_blocks)
        cmp = (probs @ cv[:, :, None]).view(B, H, Tq, D)
        # selected: the top blocks by importance, plus the query's own block causally
        chosen = self._select(logits[..., 1:], probs[..., 1:], pos, N // sel_l)  # (B, n_kv, Tq, n_sel)
        key_pos = torch.arange(N, device=q.device)
        key_block = key_pos // sel_l  # (N,)
        causal = key_pos[None, :] <= pos[:, None]  # (Tq, N)
        own = causal & (key_block[None, :] == (pos // sel_l)[:, None])  # (Tq, N)
        chosen = F.pad(chosen, (0, int(key_block[-1]) + 1 - chosen.shape[-1]))  # incomplete blocks: never chosen
        sel_mask = own | chosen[..., key_block]  # (B, n_kv, Tq, N)
        sel_mask = sel_mask if n_kv == 1 else sel_mask.repeat_interleave(g, 1)  # (B, 1 or H, Tq, N): per query head
        qr = self._rope(q, pos)  # (B, H, Tq, D)
        k, v = cache.k.view(mk), cache.v.view(mv)  # (B, n_kv, N, D)
        sel = F.scaled_dot_product_attention(qr, k, v, sel_mask, enable_gqa=True)
        win_mask = causal & (key_pos[None, :] > pos[:, None] - w)  # (Tq, N)
        win = F.scaled_dot_product_attention(qr, k, v, win_mask, enable_gqa=True)
        return cmp, sel, win

    def _select(self, logits: torch.Tensor, probs: torch.Tensor, pos: torch.Tensor, n_sel: int) -> torch.Tensor:
        """Which complete selection blocks (B, n_kv, Tq, n_sel) each query's KV group attends, from its compressed
        blocks' logits and probabilities (B, n_kv, g, Tq, n_blocks)."""
        cfg = self.cfg
        r = cfg.select_block // cfg.block_stride  # compressed blocks ending in one selection block
        B, n_kv, g, Tq, _ = logits.shape
        own = (pos // cfg.select_block)[:, None]  # (Tq, 1): each query's own selection block
        j = torch.arange(n_sel, device=pos.device)[None, :]  # (1, n_sel)
        per_block = (logits if self.conventions.importance == "logits" else probs)[..., : n_sel * r]
        per_block = per_block.reshape(B, n_kv, g, Tq, n_sel, r)
        if self.conventions.importance == "logits":  # the peer: mean logit, a softmax with a phantom block
            score = per_block.mean((2, 5))  # (B, n_kv, Tq, n_sel)
            score = F.pad(score, (1, 0), value=PHANTOM_LOGIT).softmax(-1)[..., 1:]
            selectable = score > MIN_SHARE
        else:  # the paper: summed probabilities; blocks complete before the query
            score = per_block.sum((2, 5))  # (B, n_kv, Tq, n_sel)
            selectable = (j < own).expand_as(score)
        n_top = cfg.top_k
        if cfg.forced_blocks:  # the initial block and the one before the query's own always; the own block counts
            score = score.masked_fill((j == 0) | (j == own - 1), float("inf"))
            n_top -= 1
        n_top = min(n_top, n_sel)
        chosen = torch.zeros_like(selectable)
        if n_top > 0:
            top = score.masked_fill(~selectable, float("-inf")).topk(n_top, -1).indices  # (B, n_kv, Tq, n_top)
            chosen.scatter_(-1, top, selectable.gather(-1, top))
        return chosen

    def new_cache(self) -> NSACache:
        return NSACache()


@torch.no_grad()
def reference(attn: NSAAttention, h: torch.Tensor) -> torch.Tensor:
    """The plain definition, one query and one KV group at a time with explicit lists of keys: the output
    (B, T, d) of `attn` on h (B, T, d) at positions 0..T-1 (the fast path and the decode cache are tested
    against it). Gates as `attn.branch_gates` says."""
    cfg = attn.cfg
    block, d, sel_l, w = cfg.block, cfg.block_stride, cfg.select_block, cfg.sliding_window
    B, T, _ = h.shape
    H, n_kv, D = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
    g = H // n_kv
    pos = torch.arange(T)
    q, k, v = attn.project(h)  # (B, H, T, D), (B, n_kv, T, D) x2: un-rotated
    qr, kr = attn._rope(q, pos), attn._rope(k, pos)
    gates = attn._gates(h)  # (B, T, H, 3)

    def compressed(x, positions, mlp, b, kv, j):  # compressed block j of tokens (j+1)d - l .. (j+1)d - 1 (zeros before 0)
        toks = torch.stack([x[b, kv, t] if t >= 0 else x.new_zeros(D) for t in range((j + 1) * d - block, (j + 1) * d)])
        return mlp((toks + positions[kv]).flatten())  # (D,)

    def softmax_attend(qv, keys, values):  # one query (D,) over keys, values (n, D)
        p = (keys @ qv * D**-0.5).softmax(0)
        return p @ values, p

    out = torch.zeros(B, T, H, D)
    for b in range(B):
        for kv in range(n_kv):
            ck = [compressed(k, attn.k_positions, attn.k_compress, b, kv, j) for j in range(T // d)]
            cv = [compressed(v, attn.v_positions, attn.v_compress, b, kv, j) for j in range(T // d)]
            for i in range(T):
                vis = [j for j in range(len(ck)) if (j + 1) * d - 1 < i]  # blocks complete before i
                keys = torch.stack([attn.memory[0, kv, 0]] + [ck[j] for j in vis])
                values = torch.stack([attn.memory[1, kv, 0]] + [cv[j] for j in vis])
                heads = range(kv * g, (kv + 1) * g)
                cmp_out, score = {}, {}
                for hd in heads:
                    cmp_out[hd], p = softmax_attend(q[b, hd, i], keys, values)
                    logit = keys @ q[b, hd, i] * D**-0.5
                    for jj, j in enumerate(vis):  # each compressed block's share, to its selection block
                        m = ((j + 1) * d - 1) // sel_l
                        val = logit[1 + jj] if attn.conventions.importance == "logits" else p[1 + jj]
                        score.setdefault(m, []).append(val)
                own = i // sel_l
                complete = [m for m in sorted(score) if m < own]  # selection blocks complete before i
                if attn.conventions.importance == "logits":
                    mean = torch.stack([torch.stack(score[m]).mean() for m in complete] + [torch.tensor(PHANTOM_LOGIT)])
                    share = dict(zip(complete, mean.softmax(0)[:-1].tolist(), strict=False))
                    candidates = [m for m in complete if share[m] > MIN_SHARE]
                else:
                    share = {m: float(torch.stack(score[m]).sum()) for m in complete}
                    candidates = complete
                ranked = sorted(candidates, key=lambda m: -share[m])
                n_top = cfg.top_k
                if cfg.forced_blocks:
                    forced = [m for m in ranked if m in (0, own - 1)]
                    ranked = forced + [m for m in ranked if m not in forced]
                    n_top -= 1
                sel_pos = [t for m in sorted(ranked[: max(n_top, 0)]) for t in range(m * sel_l, (m + 1) * sel_l)]
                sel_pos += list(range(own * sel_l, i + 1))
                win_pos = list(range(max(0, i - w + 1), i + 1))
                for hd in heads:
                    sel_out, _ = softmax_attend(qr[b, hd, i], kr[b, kv, sel_pos], v[b, kv, sel_pos])
                    win_out, _ = softmax_attend(qr[b, hd, i], kr[b, kv, win_pos], v[b, kv, win_pos])
                    out[b, i, hd] = sum(gates[b, i, hd, s] * o for s, o in enumerate((cmp_out[hd], sel_out, win_out)))
    return attn.o_proj(attn.z_hook(out).flatten(2))
