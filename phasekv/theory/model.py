"""The idealised induction model of the paper's "Why compression concentrates" section.

A context holds L chunks of S tokens; all L*S tokens are distinct (so every query has a unique successor)
and drawn uniformly without replacement from N embeddings. Positions within a chunk are r = 1..S (position r
is offset r - 1). Each of m < S heads compresses chunk l with query-independent probability vectors
p^K_{h,l}, p^V_{h,l} over the S positions:

    k_{h,l} = sum_r p^K_{h,l}(r) x_{l,r},        v_{h,l} = sum_r p^V_{h,l}(r) x_{l,r}.

A query repeats the token x_q = x_{l*,q} at a non-final position q <= S - 1 and asks for x_{l*,q+1}. Each head
attends over the L compressed keys, a_{h,l} = softmax_l(gamma x_q.k_{h,l}); the head outputs are summed,
o = sum_h sum_l a_{h,l} v_{h,l}, and unembedded against all N embeddings, logit_n = beta x_n.o. The loss is the
cross-entropy of the successor, averaged over the L*(S-1) queries of a context (always enumerated exactly) and
over contexts (exact by symmetry, exact enumeration, or Monte Carlo with a standard error; see
`population_loss`).

Everything is a function of inner products, so the forward pass works on the Gram matrix G = X X^T.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from phasekv.errors import ConfigError
from phasekv.theory.embeddings import Embeddings

# a rule maps contexts (B, L, S) to (p^K, p^V), each (B, m, L, S); a static rule is a pair of (m, L, S) tensors
Rule = Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]] | tuple[torch.Tensor, torch.Tensor]


@dataclass
class TheoryConfig:
    N: int = 64  # number of token embeddings (vocabulary)
    S: int = 4  # tokens per chunk (positions 1..S)
    L: int = 4  # chunks per context
    m: int = 2  # heads, m < S
    gamma: float = 4.0  # attention softmax scale
    beta: float = 4.0  # unembedding (output softmax) scale
    kappa: float = 0.5  # shared inner product of distinct embeddings
    eps: float = 0.0  # equiangularity error bound

    def validate(self) -> TheoryConfig:
        if self.S < 2:
            raise ConfigError(f"S (chunk length) must be >= 2, got {self.S}")
        if not 1 <= self.m < self.S:
            raise ConfigError(f"m (heads) must satisfy 1 <= m < S={self.S}, got {self.m}")
        if self.L < 2:
            raise ConfigError(f"L (chunks per context) must be >= 2, got {self.L}")
        if self.N < self.L * self.S:
            raise ConfigError(f"N={self.N} must be >= L*S={self.L * self.S} (context tokens are distinct)")
        if self.gamma <= 0 or self.beta <= 0:
            raise ConfigError(f"gamma and beta must be > 0, got gamma={self.gamma}, beta={self.beta}")
        if not 0.0 <= self.kappa < 1.0:
            raise ConfigError(f"kappa must lie in [0, 1), got {self.kappa}")
        if not 0.0 <= self.eps < 1.0:
            raise ConfigError(f"eps must lie in [0, 1), got {self.eps}")
        return self

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def n_queries(self) -> int:
        return self.L * (self.S - 1)


@dataclass
class LossEstimate:
    mean: float  # population cross-entropy
    se: float  # standard error (0 when exact)
    method: str  # "exact-symmetry" | "exact-enumeration" | "monte-carlo"
    n_contexts: int  # contexts evaluated


def query_slots(cfg: TheoryConfig) -> torch.Tensor:
    """Flat context indices l*S + (q-1) of the L*(S-1) queries, chunk-major."""
    return torch.tensor([c * cfg.S + r for c in range(cfg.L) for r in range(cfg.S - 1)])  # (Q,)


def query_positions(cfg: TheoryConfig) -> torch.Tensor:
    """1-based position q of each query, aligned with `query_slots`."""
    return torch.arange(1, cfg.S).repeat(cfg.L)  # (Q,)


def sample_contexts(cfg: TheoryConfig, n: int, gen: torch.Generator) -> torch.Tensor:
    """n contexts of L*S distinct tokens, uniform without replacement."""
    perm = torch.rand(n, cfg.N, generator=gen).argsort(dim=1)[:, : cfg.L * cfg.S]  # (n, L*S)
    return perm.view(n, cfg.L, cfg.S)


def n_ordered_contexts(cfg: TheoryConfig) -> int:
    return math.perm(cfg.N, cfg.L * cfg.S)


def enumerate_contexts(cfg: TheoryConfig) -> torch.Tensor:
    """Every ordered context (N!/(N-LS)! of them); only for tiny settings."""
    rows = list(itertools.permutations(range(cfg.N), cfg.L * cfg.S))
    return torch.tensor(rows, dtype=torch.long).view(-1, cfg.L, cfg.S)


def forward(
    G: torch.Tensor, ctx: torch.Tensor, pK: torch.Tensor, pV: torch.Tensor, cfg: TheoryConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of every query of every context, and the successor targets.

    G (N, N) Gram matrix; ctx (B, L, S) token ids; pK, pV (B, m, L, S) or (m, L, S).
    Returns logits (B, Q, N) and targets (B, Q) with Q = L*(S-1) queries in `query_slots` order.
    """
    B, L, S = ctx.shape
    flat = ctx.reshape(B, L * S)  # (B, LS)
    Gc = G[flat]  # (B, LS, N): x_{l,r}.x_n
    slots = query_slots(cfg).to(ctx.device)  # (Q,)
    Gq = Gc[:, slots].gather(2, flat[:, None, :].expand(B, len(slots), L * S))  # (B, Q, LS): x_q.x_{l,r}
    Gq = Gq.view(B, -1, L, S)  # (B, Q, L, S)
    pK = pK.expand(B, *pK.shape[-3:]) if pK.dim() == 3 else pK  # (B, m, L, S)
    pV = pV.expand(B, *pV.shape[-3:]) if pV.dim() == 3 else pV
    scores = cfg.gamma * torch.einsum("bqls,bmls->bqml", Gq, pK)  # (B, Q, m, L): gamma x_q.k_{h,l}
    attn = scores.softmax(dim=-1)  # (B, Q, m, L)
    slot_weight = torch.einsum("bqml,bmls->bqls", attn, pV)  # (B, Q, L, S): weight of x_{l,r} in o
    logits = cfg.beta * torch.einsum("bqls,blsn->bqn", slot_weight, Gc.view(B, L, S, -1))  # (B, Q, N)
    targets = flat[:, slots + 1]  # (B, Q)
    return logits, targets


def query_losses(G, ctx, pK, pV, cfg) -> torch.Tensor:
    """Cross-entropy of every query, (B, Q)."""
    logits, targets = forward(G, ctx, pK, pV, cfg)
    return logits.logsumexp(-1) - logits.gather(-1, targets[..., None]).squeeze(-1)


def query_correct(G, ctx, pK, pV, cfg) -> torch.Tensor:
    """Whether the successor is the arg-max of the logits, (B, Q) bool (ties count as wrong)."""
    logits, targets = forward(G, ctx, pK, pV, cfg)
    tgt = logits.gather(-1, targets[..., None])  # (B, Q, 1)
    n_at_least = (logits >= tgt - 1e-12).sum(-1)  # (B, Q): 1 iff the target is the unique maximum
    return n_at_least == 1


def context_losses(G, ctx, pK, pV, cfg) -> torch.Tensor:
    """Per-context loss: exact mean over the L*(S-1) queries, (B,)."""
    return query_losses(G, ctx, pK, pV, cfg).mean(-1)


def apply_rule(rule: Rule, ctx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return rule if isinstance(rule, tuple) else rule(ctx)


def population_loss(
    cfg: TheoryConfig,
    emb: Embeddings,
    rule: Rule,
    n_contexts: int = 4096,
    seed: int = 0,
    exact_cap: int = 50_000,
    batch: int = 1024,
) -> LossEstimate:
    """Population cross-entropy of a coefficient rule, saying how it was computed.

    - exact-symmetry: a static rule (the same p for every context) at eps = 0; G = kappa J + I is invariant
      under token permutations, so every context has the same loss and one context is exact.
    - exact-enumeration: every ordered context, when there are at most `exact_cap` of them.
    - monte-carlo: `n_contexts` uniform contexts; mean with its standard error.
    """
    G = emb.gram
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        if isinstance(rule, tuple) and emb.eps == 0:
            ctx = sample_contexts(cfg, 1, gen)
            return LossEstimate(float(context_losses(G, ctx, *rule, cfg)[0]), 0.0, "exact-symmetry", 1)
        exact = n_ordered_contexts(cfg) <= exact_cap
        ctx = enumerate_contexts(cfg) if exact else sample_contexts(cfg, n_contexts, gen)
        losses = torch.cat(
            [context_losses(G, c, *apply_rule(rule, c), cfg) for c in ctx.split(batch)]
        )  # (n,)
    if exact:
        return LossEstimate(float(losses.mean()), 0.0, "exact-enumeration", len(losses))
    se = float(losses.std() / math.sqrt(len(losses)))
    return LossEstimate(float(losses.mean()), se, "monte-carlo", len(losses))


def one_hot_rule(positions: list[int] | tuple[int, ...], cfg: TheoryConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Static one-hot rule: head h keys on position r_h and reads its value from r_h + 1 (1-based)."""
    if len(positions) != cfg.m or not all(1 <= r <= cfg.S - 1 for r in positions):
        raise ConfigError(f"positions must be {cfg.m} values in 1..{cfg.S - 1}, got {list(positions)}")
    pK = torch.zeros(cfg.m, cfg.L, cfg.S, dtype=torch.float64)
    pV = torch.zeros_like(pK)
    for h, r in enumerate(positions):
        pK[h, :, r - 1] = 1.0
        pV[h, :, r] = 1.0
    return pK, pV


def closed_form_loss(cfg: TheoryConfig, positions: list[int] | tuple[int, ...]) -> float:
    """Population loss of the static one-hot rule p^K_h = e_{r_h}, p^V_h = e_{r_h+1} at eps = 0.

    Derivation. With eps = 0, x.x' = kappa + 1{x = x'} and all L*S context tokens are distinct.
    Take a query at chunk l*, position q, and let c_r = #{h : r_h = r}.

    Attention. Head h's key in chunk l is x_{l,r_h}, so gamma x_q.k_{h,l} = gamma (kappa + 1{l = l*, r_h = q}).
    The kappa cancels in the softmax: a head with r_h = q puts a = e^gamma / (e^gamma + L - 1) on chunk l*
    and (1 - a)/(L - 1) on each other chunk; every other head attends uniformly, 1/L per chunk.

    Output. Values are tokens, so x_n.o = sum_{h,l} a_{h,l} (kappa + 1{x_n = x_{l,r_h+1}}) = m kappa + w_n,
    with w_n the attention mass carried by token n. The m kappa is common to all logits and cancels again.
    Value tokens sit in slots (l, r+1) for the positions r with c_r > 0:
      - slot (l*, q+1), the target: w = c_q a;
      - slots (l, q+1), l != l*: w = c_q (1 - a)/(L - 1) each;
      - slots (l, r+1), r != q, c_r > 0: w = c_r / L each (L slots per position);
      - the other N - L * #{r : c_r > 0} tokens: w = 0.
    Hence the query's loss is  -beta c_q a + log Z_q  with

      Z_q = N - L P + sum_{r != q, c_r > 0} L exp(beta c_r / L)
            + 1{c_q > 0} [exp(beta c_q a) + (L - 1) exp(beta c_q (1 - a)/(L - 1))],   P = #{r : c_r > 0}

    (for c_q = 0 the bracket is absent and its slots are among the w = 0 tokens). The loss does not depend on
    l* or kappa, and the population loss is the mean over q = 1..S-1.

    Distinct positions (every c_r in {0, 1}): a fraction m/(S-1) of queries is hit, giving
      loss = (m/(S-1)) [-beta a + log Z_hit] + (1 - m/(S-1)) log Z_miss,
      Z_hit = N - mL + exp(beta a) + (L-1) exp(beta (1-a)/(L-1)) + (m-1) L exp(beta/L),
      Z_miss = N - mL + mL exp(beta/L).
    The evidence term -beta c_q a is linear in c_q, so colliding heads earn the same total evidence as distinct
    ones; distinct positions win only through the normaliser Z, by an amount of order 1/N.
    """
    one_hot_rule(positions, cfg)  # validates
    N, L, beta = cfg.N, cfg.L, cfg.beta
    a = math.exp(cfg.gamma) / (math.exp(cfg.gamma) + L - 1)
    counts = {r: list(positions).count(r) for r in set(positions)}
    total = 0.0
    for q in range(1, cfg.S):
        Z = N - L * len(counts)
        Z += sum(L * math.exp(beta * c / L) for r, c in counts.items() if r != q)
        cq = counts.get(q, 0)
        if cq:
            Z += math.exp(beta * cq * a) + (L - 1) * math.exp(beta * cq * (1 - a) / (L - 1))
        total += -beta * cq * a + math.log(Z)
    return total / (cfg.S - 1)


def closed_form_distinct_loss(cfg: TheoryConfig) -> float:
    """The distinct-position formula of `closed_form_loss`, written out (any distinct assignment)."""
    N, L, m, S, beta = cfg.N, cfg.L, cfg.m, cfg.S, cfg.beta
    a = math.exp(cfg.gamma) / (math.exp(cfg.gamma) + L - 1)
    z_hit = N - m * L + math.exp(beta * a) + (L - 1) * math.exp(beta * (1 - a) / (L - 1))
    z_hit += (m - 1) * L * math.exp(beta / L)
    z_miss = N - m * L + m * L * math.exp(beta / L)
    hit = m / (S - 1)
    return hit * (-beta * a + math.log(z_hit)) + (1 - hit) * math.log(z_miss)


def config_grid(base: TheoryConfig, **values: list) -> list[TheoryConfig]:
    """Cartesian product of field values over a base config; combinations with m >= S are skipped."""
    for key in values:
        if key not in base.to_dict():
            raise ConfigError(f"unknown theory setting {key!r} (known: {', '.join(base.to_dict())})")
    keys = list(values)
    out = []
    for combo in itertools.product(*(values[k] for k in keys)):
        fields = base.to_dict() | dict(zip(keys, combo, strict=True))
        if fields["m"] >= fields["S"]:
            continue
        out.append(TheoryConfig(**fields).validate())
    if not out:
        raise ConfigError("no valid setting in the grid (every combination has m >= S)")
    return out


def setting_label(cfg: TheoryConfig) -> str:
    return f"N={cfg.N} S={cfg.S} L={cfg.L} m={cfg.m} kappa={cfg.kappa:g} eps={cfg.eps:g}"
