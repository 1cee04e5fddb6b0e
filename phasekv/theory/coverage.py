"""Coverage and phase sensitivity: retrieval accuracy by query position of trained idealised models.

A position that no head selects receives no target evidence, so its queries fail: retrieval depends on the
query's position within the chunk unless the heads cover all S-1 non-final positions. We train log-linear
gates by gradient flow (`flow.train_flow`), then measure, on held-out contexts, the fraction of queries at each
position whose successor is the arg-max of the logits, next to the positions the heads chose. The Theorem 1
optimum (heads on distinct positions 1..m) is evaluated the same way as a reference.
"""

from __future__ import annotations

import pandas as pd
import torch

from phasekv.theory.flow import LogLinearGates
from phasekv.theory.model import (
    TheoryConfig,
    one_hot_rule,
    query_correct,
    query_positions,
    sample_contexts,
    setting_label,
)


@torch.no_grad()
def accuracy_by_position(cfg: TheoryConfig, G, ctx: torch.Tensor, pK, pV) -> torch.Tensor:
    """ctx (B, L, S); pK, pV (R, B, m, L, S) -> accuracy (R, S-1) for query positions 1..S-1."""
    R, B = pK.shape[:2]
    flat = lambda t: t.reshape(R * B, *t.shape[2:])  # noqa: E731
    correct = query_correct(G, flat(ctx.expand(R, *ctx.shape)), flat(pK), flat(pV), cfg).view(R, B, -1)
    pos = query_positions(cfg)  # (Q,)
    return torch.stack([correct[..., pos == q].double().mean((1, 2)) for q in range(1, cfg.S)], dim=1)


def coverage_rows(cfg: TheoryConfig, gates: LogLinearGates, emb, n_test: int, seed: int, extra: dict) -> pd.DataFrame:
    """Accuracy by position for every trained run plus the distinct one-hot reference (run = -1)."""
    gen = torch.Generator().manual_seed(seed)
    ctx = sample_contexts(cfg, n_test, gen)  # (B, L, S) held out
    X, G = emb.X, emb.gram
    with torch.no_grad():
        R = gates.c.shape[0]
        pK, pV = gates(X, ctx.expand(R, *ctx.shape))  # (R, B, m, L, S)
        chosen = (pK.mean((1, 3)).argmax(-1) + 1).tolist()  # (R, m) 1-based
        acc = accuracy_by_position(cfg, G, ctx, pK, pV)  # (R, S-1)
        ref_pos = list(range(1, cfg.m + 1))
        rK, rV = one_hot_rule(ref_pos, cfg)
        ref = accuracy_by_position(cfg, G, ctx, rK.expand(1, n_test, *rK.shape), rV.expand(1, n_test, *rV.shape))
    rows = []
    for run, positions in [(r, chosen[r]) for r in range(R)] + [(-1, ref_pos)]:
        a = acc[run] if run >= 0 else ref[0]
        for q in range(1, cfg.S):
            rows.append({
                "setting": setting_label(cfg), **cfg.to_dict(), **extra, "run": run,
                "kind": "flow" if run >= 0 else "distinct-optimum", "position": q, "offset": q - 1,
                "accuracy": float(a[q - 1]), "heads_at_position": positions.count(q),
                "covered": q in positions, "chosen_positions": ",".join(map(str, positions)), "n_contexts": n_test,
            })
    return pd.DataFrame(rows)


def summarise_coverage(cfg: TheoryConfig, df: pd.DataFrame) -> dict:
    flow = df[df.kind == "flow"]
    per_run = flow.groupby("run")
    full = per_run.covered.all()
    gap = per_run.accuracy.max() - per_run.accuracy.min()
    ref = df[df.kind == "distinct-optimum"]
    cov, unc = flow[flow.covered], flow[~flow.covered]
    return {
        "setting": setting_label(cfg), "config": cfg.to_dict(), "runs": int(per_run.ngroups),
        "full_coverage_fraction": float(full.mean()),
        "accuracy_covered": float(cov.accuracy.mean()) if len(cov) else None,
        "accuracy_uncovered": float(unc.accuracy.mean()) if len(unc) else None,
        "max_accuracy_uncovered": float(unc.accuracy.max()) if len(unc) else None,
        "mean_phase_gap": float(gap.mean()),  # max - min accuracy over positions, per run
        "distinct_optimum_accuracy": ref.set_index("position").accuracy.round(4).to_dict(),
        # weak phases are exactly the positions no head selected
        "weak_phases_are_uncovered": bool(
            (len(unc) == 0 or unc.accuracy.max() < 0.5) and (len(cov) == 0 or cov.accuracy.min() > 0.5)
        ),
    }
