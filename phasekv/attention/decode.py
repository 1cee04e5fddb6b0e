"""The one-token decode step: a few fused ops per layer instead of a few hundred small ones.

`StepPlan` holds, once per cache, the weights a step reads in the layout it reads them: the q, k, v
projections as one matrix, the q/k norms as one weight over the stacked heads and, for a compressed layer, the
compressor rows of every phase: for a token at phase phi of its oldest in-flight window, the payload and gate
rows of the offsets it fills in each window it belongs to, of every branch, as one matrix whose bias holds the
gate biases. A step (`step`) then
- projects the token: q, k, v in one matmul, every in-flight window's payloads and gate logits in another;
- merges it into the in-flight windows in place (`cache.InFlight`: log-normaliser and weighted mean, the same
  streaming softmax as `Partial.merge`), completing the oldest window at its last token;
- writes k, v into the ring first, so that the keys the query may see are one contiguous view of the cache
  ([ring | entries]): one score matmul, `Grid`'s mask on the ring slots, one softmax, one value matmul.
The reference is the chunk path (`Attention._extend_entries` over `CompressorBranch.token_partial`,
`blockwise.decode_attention`). It runs under autograd (the plan holds copies of weights), under
`blockwise.use_backend("reference")`, and for a grid's first tokens (fewer windows than their phase's hold them):
tests hold the two equal for every variant and every mix of chunks and single tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from phasekv.attention import blockwise
from phasekv.attention.cache import CompressedLayerCache, FullLayerCache, InFlight
from phasekv.attention.compressor import Compressor
from phasekv.attention.norm import rms_norm
from phasekv.attention.positions import Grid


def enabled() -> bool:
    """Whether one-token steps take the fast path: no autograd, not the reference backend."""
    return not torch.is_grad_enabled() and blockwise.backend() != "reference"


@dataclass
class PhaseRows:
    """A compressed layer's compressor rows by phase phi (the token's offset in its oldest in-flight window, less
    W - S): payloads (n_br, n, n_kv, D) then gate logits (n_br, n, n_kv, G) of the n = slots[phi] windows the token
    belongs to, oldest first, as `F.linear(h, rows[phi], bias[phi])`."""

    rows: list[torch.Tensor]  # per phase (n_br * n * n_kv * (D + G'), d); G' = G, or 0 without gates (uniform)
    bias: list[torch.Tensor]  # per phase (n_br * n * n_kv * (D + G'),): zeros on payload rows, the gate biases
    slots: list[int]  # per phase: n, the windows in flight (all of W/S when S divides W)
    shape: tuple[int, int, int, int, int]  # (n_br, ceil(W/S), n_kv, D, G) of the in-flight partials
    gated: bool

    @classmethod
    def build(cls, compressor: Compressor, heads: slice | None = None) -> PhaseRows:
        """The rows of the KV heads `heads` (all when None)."""
        W, S = compressor.window, compressor.stride
        params = [b.head_params(heads) for b in compressor.branches()]
        payload, gate, _ = params[0]  # (W, n_kv, D, d), (W, n_kv, G, d) or None
        n_kv, D, d = payload.shape[1:]
        G = 1 if gate is None else gate.shape[2]
        rows, bias, slots = [], [], []
        for phi in range(S):
            n = (phi + W - S) // S + 1
            offs = phi + W - S - S * torch.arange(n, device=payload.device)  # slot i's offset, oldest first
            pay = torch.stack([p[0][offs] for p in params])  # (n_br, n, n_kv, D, d)
            r, b = [pay.reshape(-1, d)], [pay.new_zeros(pay.shape[:-1]).flatten()]
            if gate is not None:
                r.append(torch.stack([p[1][offs] for p in params]).reshape(-1, d))  # (n_br * n * n_kv * G, d)
                b.append(torch.stack([p[1].new_zeros(n, n_kv, G) if p[2] is None else p[2][offs]
                                      for p in params]).flatten())
            rows.append(torch.cat(r))
            bias.append(torch.cat(b))
            slots.append(n)
        return cls(rows, bias, slots, (len(params), -(-W // S), n_kv, D, G), gate is not None)


@dataclass
class RingMasks:
    """The ring slots a query at t does not see once t is written: `Grid.exact_visible` over the positions the ring
    then holds (slot i: t - (t - i) mod keep). From t0 on (ring full, an entry visible) it repeats with period
    lcm(keep, S): a position's visibility depends on t - p and, for the uncompressed tail, on t's phase."""

    t0: int
    hidden: list[torch.Tensor | None]  # per (t - t0) mod period: (keep,) bool, None where every slot is seen

    @classmethod
    def build(cls, grid: Grid, device: torch.device) -> RingMasks:
        keep = grid.exact_keep
        t0 = max(keep - 1, grid.offset + grid.window - 1, 0)
        t = torch.arange(t0, t0 + math.lcm(keep, grid.stride), device=device)[:, None]  # (period, 1)
        hidden = ~grid.sees_exact(t, t - (t - torch.arange(keep, device=device)) % keep)  # (period, keep)
        return cls(t0, [h if hides else None for h, hides in zip(hidden, hidden.any(1).tolist(), strict=True)])

    def at(self, grid: Grid, t: int, ring_pos: torch.Tensor) -> torch.Tensor | None:
        """(keep,) bool: the ring slots (positions ring_pos) the query at t does not see, or None."""
        if t < self.t0:
            return ~grid.exact_visible(torch.tensor([t], device=ring_pos.device), ring_pos)[0]
        return self.hidden[(t - self.t0) % len(self.hidden)]


@dataclass
class StepPlan:
    """What a layer's one-token steps read, laid out once per cache (weights do not change during a decode)."""

    qkv: torch.Tensor  # (H D + n_kv D [+ n_kv D], d): q_proj, k_proj [, v_proj] rows
    qk_norm: torch.Tensor | None  # (H + n_kv, D): q_norm's weight per query head, then k_norm's per KV head
    # the attention scale D^-0.5 is in q's rows: of qk_norm's weight, or of qkv without QK-norm (RoPE is linear)
    phases: list[tuple[int, PhaseRows]] | None  # compressed layers: (delay, rows) per group of heads (staggered)
    ring: RingMasks | None  # compressed layers

    @classmethod
    def build(cls, attn) -> StepPlan:
        H, n_kv, D = attn.cfg.n_heads, attn.cfg.n_kv_heads, attn.cfg.head_dim
        q_rows = attn.q_proj.weight if attn.cfg.qk_norm else attn.q_proj.weight * D**-0.5
        qkv = torch.cat([q_rows] + [lin.weight for lin in (attn.k_proj, attn.v_proj) if lin is not None])
        norm = None
        if attn.cfg.qk_norm:
            norm = torch.cat([attn.q_norm.weight.expand(H, D) * D**-0.5, attn.k_norm.weight.expand(n_kv, D)])
        if attn.compressor is None:
            return cls(qkv, norm, None, None)
        groups = [(delay, PhaseRows.build(attn.compressor, heads)) for delay, heads in attn.compressor.head_groups()]
        return cls(qkv, norm, groups, RingMasks.build(attn.grid, qkv.device))


def step(attn, h: torch.Tensor, pos: torch.Tensor, cache: FullLayerCache | CompressedLayerCache) -> torch.Tensor:
    """One token h (B, 1, d) at pos (1,) through layer `attn` (an `Attention`) and its cache -> the per-head
    outputs z (B, H, 1, D), as the reference chunk path gives them. A cache in its static form (`static.make`)
    steps itself."""
    if not isinstance(cache, (FullLayerCache, CompressedLayerCache)):
        return cache.step(attn, h, pos)
    if cache.plan is None:
        cache.plan = StepPlan.build(attn)
    t, x = int(pos[0]), h.select(1, 0)  # x (B, d)
    q, k, v = project(attn, cache.plan, x, t)  # q (B, H, D) scaled by D^-0.5; k, v (B, n_kv, D)
    if attn.compressor is None:
        cache.k.append(k[:, :, None])
        cache.v.append(v[:, :, None])
        return read(q, cache.k.whole(), cache.v.whole(), None, None)  # full layers have no sink (as `_full`)
    if not extend(attn, cache.plan.phases, cache, x, t, pos):  # a grid's first tokens
        attn._extend_entries(h, pos, cache)
    cache.write_token(k, v, t)
    keys = cache.entries_k.whole()  # (B, n_kv, keep + n, D): the ring, then every entry (all complete by t)
    values = keys if cache.entries_v is None else cache.entries_v.whole()
    return read(q, keys, values, cache.plan.ring.at(attn.grid, t, cache.ring_pos), attn.sinks)


def project(attn, plan: StepPlan, x: torch.Tensor, t: int | torch.Tensor):
    """q (B, H, D), k, v (B, n_kv, D) of tokens x (B, d) at position t: normalised, rotated (q also scaled by
    D^-0.5 for `read`); tied values are the keys."""
    B, H, n_kv, D = x.shape[0], attn.cfg.n_heads, attn.cfg.n_kv_heads, attn.cfg.head_dim
    y = F.linear(x, plan.qkv)  # (B, (H + n_kv [+ n_kv]) D)
    qk = y.narrow(1, 0, (H + n_kv) * D).view(B, H + n_kv, D)
    if plan.qk_norm is not None:
        qk = rms_norm(qk, plan.qk_norm, attn.cfg.norm_eps)  # q_norm and k_norm in one
    qk = attn._rope.at(qk, t)  # (B, H + n_kv, D)
    k = qk.narrow(1, H, n_kv)
    return qk.narrow(1, 0, H), k, (k if attn.v_proj is None else y.narrow(1, (H + n_kv) * D, n_kv * D).view(B, n_kv, D))


def extend(attn, groups: list[tuple[int, PhaseRows]], cache: CompressedLayerCache, x: torch.Tensor, t: int,
           pos: torch.Tensor) -> bool:
    """Feed one token x (B, d) at position t (pos: the same, (1,) on the device) to its in-flight windows in place,
    storing the entry it completes; a group of staggered heads reads the token `delay` positions back (the cache's
    history). False (nothing done) for a grid's first tokens, where fewer windows than the phase's hold t or a
    staggered head has no token yet. On the triton backend the merge and the entry are one fused kernel."""
    g, phases = attn.grid, groups[0][1]
    j = cache.n_entries  # oldest window not yet complete
    phi = t - g.entry_start(j) - g.window + g.stride  # the token's offset in window j, less W - S
    keep = max(d for d, _ in groups)
    if not 0 <= phi < g.stride or g.n_started(t + 1) - j != phases.slots[phi] or t < keep:
        return False
    xs = [x if d == 0 else cache.history[:, keep - d] for d, _ in groups]  # (B, d) each: the token at t - delay
    if keep:
        cache.history = torch.cat([cache.history[:, 1:], x[:, None]], 1)
    n, (n_br, k, _, D, G) = phases.slots[phi], phases.shape
    state = cache.inflight or InFlight.of(cache.partials, (x.shape[0], n_br, k, attn.cfg.n_kv_heads, G, D), x)
    payload, gate = token_windows(xs, [(r.rows[phi], r.bias[phi], r.shape[2]) for _, r in groups], n, phases.shape,
                                  phases.gated)
    cache.inflight, state.live = state, n
    done = phi == g.stride - 1  # the token is window j's last
    if not (blockwise.backend(x) == "triton" and _fused_merge(attn, cache, state, payload, gate, pos, done)):
        merge(state, payload, gate)
        if done:
            _complete(attn, cache, state, j)
    return True


def token_windows(xs: list[torch.Tensor], rows: list[tuple[torch.Tensor, torch.Tensor, int]], n: int,
                  shape: tuple[int, ...], gated: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A token's payloads (B, n_br, n, n_kv, D) and gate logits (.., G) (None: uniform averaging) in its n windows:
    per group of KV heads (staggered heads), the token xs (B, d) as the group reads it through the phase's rows
    (R, d), biases (R,) and its head count, one matmul each."""
    n_br, _, _, D, G = shape
    pay, gate = [], []
    for x, (w, bias, heads) in zip(xs, rows, strict=True):
        y = torch.addmm(bias, x, w.T)  # (B, n_br n heads (D + G')), G' = 0 without gates
        P = n_br * n * heads * D
        pay.append(y.narrow(1, 0, P).view(-1, n_br, n, heads, D))
        gate.append(y.narrow(1, P, y.shape[1] - P).view(-1, n_br, n, heads, G))
    payload = pay[0] if len(pay) == 1 else torch.cat(pay, 3)
    return payload, ((gate[0] if len(gate) == 1 else torch.cat(gate, 3)) if gated else None)


def merge(state: InFlight, payload: torch.Tensor, gate: torch.Tensor | None) -> None:
    """A token's payloads (B, n_br, n, n_kv, D) and gate logits (.., G) or None into the first n in-flight slots
    of `state`, in place: log-normaliser and weighted mean, the streaming softmax of `Partial.merge`."""
    n = payload.shape[2]
    lse_old, mean = state.lse.narrow(2, 0, n), state.mean.narrow(2, 0, n)  # the token's windows
    s = payload.new_zeros(()) if gate is None else gate
    lse = torch.logaddexp(lse_old, s)  # (B, n_br, n, n_kv, G)
    mean.lerp_(payload, (s - lse).exp_())  # the token's share of each window's softmax so far (1 in a new one)
    lse_old.copy_(lse)


def _fused_merge(attn, cache: CompressedLayerCache, state: InFlight, payload: torch.Tensor, gate: torch.Tensor | None,
                 pos: torch.Tensor, done: bool) -> bool:
    """`merge`, and where `done` `_complete`, as one fused kernel writing the entry in place; False (nothing done)
    where the kernel cannot run here."""
    stores = [s for s in (cache.entries_k, cache.entries_v) if s is not None]
    if done:
        for store in stores:
            store.make_room(1, payload[:, 0].transpose(1, 2))  # like (B, n_kv, n, D)
    if not blockwise.triton_decode_update(attn.compressor, attn.k_norm, state.lse, state.mean, payload, gate,
                                          payload.shape[2], pos, cache.entries_k.buf,
                                          getattr(cache.entries_v, "buf", None), cache.entries_k.lead):
        return False
    if done:
        for store in stores:
            store.n += 1
        state.live -= 1
    return True


def _complete(attn, cache: CompressedLayerCache, state: InFlight, j: int) -> None:
    """Store entry j from the oldest slot, move the other windows one slot older and empty the newest."""
    raw = [b.finalize(p) for b, p in zip(attn.compressor.branches(), state.partials(slice(0, 1)), strict=True)]
    ek, ev = attn.compressor.entry_kv(raw, torch.full((1,), j, device=state.lse.device), attn.k_norm)
    cache.entries_k.append(ek)
    if cache.entries_v is not None:
        cache.entries_v.append(ev)
    for x, empty in ((state.lse, float("-inf")), (state.mean, 0.0)):
        if x.shape[2] > 1:
            x[:, :, :-1] = x[:, :, 1:].clone()
        x[:, :, -1] = empty
    state.live -= 1


def read(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, hidden: torch.Tensor | None,
         sinks: torch.Tensor | None) -> torch.Tensor:
    """One query per head q (B, H, D), scaled by D^-0.5, over keys, values (B, n_kv, N, D) read in place; `hidden` (R,) bool marks
    the first R keys the query does not see (it sees all the others), or None; sinks (H,) attention-sink logits
    or None -> z (B, H, 1, D): `blockwise.attend_parts` for one query over one key set."""
    B, H, D = q.shape
    n_kv, N = keys.shape[1:3]
    qg = q.reshape(B * n_kv, H // n_kv, D)  # query heads grouped by the KV head they read
    s = torch.bmm(qg, keys.reshape(B * n_kv, N, D).transpose(1, 2))  # (B n_kv, g, N); views, no copy
    if hidden is not None:
        s[..., : hidden.shape[0]].masked_fill_(hidden, float("-inf"))
    if sinks is None:
        p = s.softmax(-1)
    else:  # the sink joins the softmax; its share is dropped: it adds no value
        sink = sinks.to(s.dtype).view(1, n_kv, H // n_kv, 1).expand(B, -1, -1, -1).reshape(B * n_kv, -1, 1)
        p = torch.cat([s, sink], -1).softmax(-1).narrow(2, 0, N)
    return torch.bmm(p, values.reshape(B * n_kv, N, D)).view(B, H, 1, D)
