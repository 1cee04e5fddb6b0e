"""Theorem 2 check: gradient flow on log-linear gates concentrates each head on one position.

Gates p^B_{h,l}(r) ~ exp<c^B_{h,r}, x_{l,r}> for B in {K, V}, shared across contexts. Each c^B_{h,r} starts
uniformly in a ball of radius rho. Gradient flow is approximated by small-step gradient descent,
c <- c - eta * grad, on a Monte Carlo estimate of the population loss with a fresh batch of contexts every step
(an unbiased estimate of the population gradient; queries are enumerated exactly). R independent runs are
vectorised. Every `track_every` steps, on held-out contexts, each head's position r_h is the arg-max of its
mean key gate, and we record min over contexts and chunks of p^K_{h,l}(r_h) and p^V_{h,l}(r_h + 1).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import pandas as pd
import torch

from phasekv.theory.embeddings import make_embeddings
from phasekv.theory.io import progress_bar
from phasekv.theory.model import TheoryConfig, context_losses, sample_contexts, setting_label


@dataclass
class FlowOptions:
    runs: int = 32  # independent initialisations per setting
    rho: float = 0.1  # radius of the initial ball for every c^B_{h,r}
    eta: float = 8.0  # gradient-descent step size (time step of the discretised flow)
    steps: int = 300  # gradient steps (flow time = eta * steps)
    batch: int = 16  # contexts per step and run (Monte Carlo population gradient)
    eval_contexts: int = 128  # held-out contexts for the uniform (min over contexts) tracking
    track_every: int = 25  # steps between tracked points
    tol: float = 0.05  # converged when min p^K(r_h) and min p^V(r_h + 1) are >= 1 - tol and still rising
    seed: int = 0


class LogLinearGates(torch.nn.Module):
    """R independent sets of gates: c (R, 2, m, S, d); index 0 = key gates, 1 = value gates."""

    def __init__(self, runs: int, cfg: TheoryConfig, dim: int, rho: float, gen: torch.Generator):
        super().__init__()
        shape = (runs, 2, cfg.m, cfg.S, dim)
        direction = torch.randn(shape, generator=gen, dtype=torch.float64)
        direction = direction / direction.norm(dim=-1, keepdim=True)
        radius = rho * torch.rand(shape[:-1] + (1,), generator=gen, dtype=torch.float64) ** (1.0 / dim)
        self.c = torch.nn.Parameter(direction * radius)  # uniform in the ball of radius rho

    def forward(self, X: torch.Tensor, ctx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return gate_probs(self.c, X, ctx)


def gate_probs(c: torch.Tensor, X: torch.Tensor, ctx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """p^B_{h,l}(r) ~ exp<c^B_{h,r}, x_{l,r}>. c (R, 2, m, S, d); X (N, d); ctx (R, B, L, S) -> p^K, p^V (R, B, m, L, S)."""
    R, B, L, S = ctx.shape
    N, m = X.shape[0], c.shape[2]
    scores = torch.einsum("rkmsd,nd->rsnkm", c, X).reshape(R, S * N, 2 * m)  # <c_{h,s}, x_n>
    flat = (torch.arange(S) * N + ctx).reshape(R, B * L * S)  # (R, BLS): index s*N + token
    picked = scores.gather(1, flat[..., None].expand(-1, -1, 2 * m))  # (R, BLS, 2m)
    picked = picked.view(R, B, L, S, 2, m).permute(4, 0, 1, 5, 2, 3)  # (2, R, B, m, L, S)
    p = picked.softmax(-1)
    return p[0], p[1]


def run_losses(gates: LogLinearGates, X, G, ctx, cfg) -> torch.Tensor:
    """Per-run Monte Carlo loss over the contexts ctx (R, B, L, S), (R,)."""
    R, B = ctx.shape[:2]
    pK, pV = gates(X, ctx)  # (R, B, m, L, S)
    flat = lambda t: t.reshape(R * B, *t.shape[2:])  # noqa: E731
    return context_losses(G, flat(ctx), flat(pK), flat(pV), cfg).view(R, B).mean(1)


@torch.no_grad()
def track(gates: LogLinearGates, X, ctx_eval, S: int) -> dict[str, torch.Tensor]:
    """Chosen positions and uniform (min over contexts and chunks) concentration, per run and head."""
    R = gates.c.shape[0]
    pK, pV = gates(X, ctx_eval.expand(R, *ctx_eval.shape))  # (R, E, m, L, S)
    r_h = pK.mean((1, 3)).argmax(-1)  # (R, m) 0-based
    idx = r_h[:, None, :, None, None].expand(*pK.shape[:-1], 1)
    key = pK.gather(-1, idx).squeeze(-1)  # (R, E, m, L)
    val = pV.gather(-1, (idx + 1).clamp(max=S - 1)).squeeze(-1) * (idx.squeeze(-1) < S - 1)
    return {
        "r_h": r_h,
        "key_min": key.amin((1, 3)), "key_mean": key.mean((1, 3)),
        "value_min": val.amin((1, 3)), "value_mean": val.mean((1, 3)),
    }


def independent_collision_rate(m: int, S: int) -> float:
    """P(two of m heads share a position) if each picks one of the S-1 non-final positions uniformly."""
    k = S - 1
    return 1.0 - math.perm(k, m) / k**m if m <= k else 1.0


def train_flow(cfg: TheoryConfig, opts: FlowOptions, seed: int, on_step=None):
    """Run `opts.runs` gradient flows for one setting; returns (gates, embeddings, tracked rows, eval contexts)."""
    gen = torch.Generator().manual_seed(seed)
    emb = make_embeddings(cfg.N, cfg.kappa, cfg.eps, seed=seed)
    X, G = emb.X, emb.gram
    gates = LogLinearGates(opts.runs, cfg, X.shape[1], opts.rho, gen)
    ctx_eval = sample_contexts(cfg, opts.eval_contexts, gen)  # (E, L, S), shared by every run
    rows = []

    def record(step: int, loss: torch.Tensor):
        t = track(gates, X, ctx_eval, cfg.S)
        for r in range(opts.runs):
            for h in range(cfg.m):
                rows.append({
                    "run": r, "step": step, "time": step * opts.eta, "head": h, "position": int(t["r_h"][r, h]) + 1,
                    "key_min": float(t["key_min"][r, h]), "key_mean": float(t["key_mean"][r, h]),
                    "value_min": float(t["value_min"][r, h]), "value_mean": float(t["value_mean"][r, h]),
                    "train_loss": float(loss[r]),
                })

    for step in range(opts.steps + 1):
        ctx = sample_contexts(cfg, opts.runs * opts.batch, gen).view(opts.runs, opts.batch, cfg.L, cfg.S)
        loss = run_losses(gates, X, G, ctx, cfg)  # (R,)
        if step % opts.track_every == 0 or step == opts.steps:
            record(step, loss.detach())
        if step == opts.steps:
            break
        gates.zero_grad()
        loss.sum().backward()  # runs are independent
        with torch.no_grad():
            gates.c -= opts.eta * gates.c.grad
        if on_step is not None:
            on_step()
    return gates, emb, pd.DataFrame(rows), ctx_eval


def summarise_runs(cfg: TheoryConfig, opts: FlowOptions, tracked: pd.DataFrame) -> dict:
    """Per-setting summary from the tracked rows of one setting (last step: one row per run and head)."""
    final = tracked[tracked.step == tracked.step.max()]
    runs = final.groupby("run")
    converged = runs.apply(lambda d: bool((d.key_min >= 1 - opts.tol).all() and (d.value_min >= 1 - opts.tol).all()))
    # the deficit 1 - min p must still be shrinking: compare the last tracked step with the midpoint
    mid = tracked[tracked.step == tracked.step.unique()[len(tracked.step.unique()) // 2]].set_index(["run", "head"])
    last = final.set_index(["run", "head"])
    rising = (last.key_min >= mid.key_min) & (last.value_min >= mid.value_min)
    collided = runs.apply(lambda d: d.position.nunique() < len(d))
    nonfinal = runs.apply(lambda d: bool((d.position < cfg.S).all()))
    n = len(converged)
    rate = float(collided.mean())
    return {
        "setting": setting_label(cfg), "config": cfg.to_dict(), "rho": opts.rho, "runs": n,
        "converged_fraction": float(converged.mean()),
        "nonfinal_key_fraction": float(nonfinal.mean()),
        "collision_rate": rate,
        "collision_rate_se": math.sqrt(max(rate * (1 - rate), 1e-12) / n),
        "independent_uniform_collision_rate": independent_collision_rate(cfg.m, cfg.S),
        "position_counts": {int(k): int(v) for k, v in final.position.value_counts().sort_index().items()},
        "min_key_min": float(final.key_min.min()), "min_value_min": float(final.value_min.min()),
        "still_rising_fraction": float(rising.mean()),
        "reproduced": bool(converged.mean() >= 0.9 and rising.mean() >= 0.9),
    }


def run_flow(configs: list[TheoryConfig], opts: FlowOptions, rhos: list[float] | None = None, progress: bool = True):
    """Theorem 2 check over settings (and radii rho); returns (tracked rows, per-setting summaries, trained runs)."""
    rhos = rhos or [opts.rho]
    frames, summaries, trained = [], [], []
    jobs = [(cfg, rho) for cfg in configs for rho in rhos]
    with progress_bar(progress) as prog:
        task = prog.add_task("theory flow", total=len(jobs) * opts.steps)
        for i, (cfg, rho) in enumerate(jobs):
            o = FlowOptions(**(asdict(opts) | {"rho": rho}))
            prog.update(task, description=f"theory flow {setting_label(cfg)} rho={rho:g}")
            gates, emb, df, ctx_eval = train_flow(cfg, o, seed=opts.seed + 1000 * i, on_step=lambda: prog.advance(task))
            df.insert(0, "setting", setting_label(cfg))
            for k, v in cfg.to_dict().items():
                df[k] = v
            df["rho"], df["eta"] = rho, o.eta
            frames.append(df)
            summaries.append(summarise_runs(cfg, o, df))
            trained.append((cfg, o, gates, emb))
    return pd.concat(frames, ignore_index=True), summaries, trained
