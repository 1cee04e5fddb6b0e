"""Tidy tables the report's figures and HTML tables are drawn from (one place per stage schema)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from phasekv.eval.stats import phase_profile, profile_kind
from phasekv.report.load import Model, Stage, Study


def val_loss(model: Model) -> float | None:
    """Last validation loss of a run (metrics.jsonl), else its final training loss."""
    m = model.metrics
    if m is None:
        return model.run.get("val_loss")
    for col in ("val_loss", "loss"):
        if col in m and m[col].notna().any():
            return float(m[col].dropna().iloc[-1])
    return None


def summary_table(study: Study, stages: dict[str, Stage]) -> pd.DataFrame:
    """One row per evaluated model (stages: alias -> retrieval evaluation): validation loss, mean, worst, best,
    gap with interval, detected period."""
    rows = []
    for alias, stage in stages.items():
        m, s = study.models[alias], stage.summary
        lo, hi = s.get("gap_ci") or (np.nan, np.nan)
        rows.append({
            "alias": alias, "model": m.name, "stride": m.stride or None, "val_loss": val_loss(m),
            "mean": s["mean"], "worst": s["worst"], "best": s["best"], "gap": s["gap"], "gap_lo": lo, "gap_hi": hi,
            "detected_period": s.get("detected_period"), "p_value": (s.get("periodicity") or {}).get("p_value"),
            "fold_consistency": s.get("fold_consistency"), "n": sum(g["n"] for g in s["groups"]),
            "profile": _profile(s, m.stride),
        })
    return pd.DataFrame(rows)


def _profile(summary: dict, stride: int) -> str | None:
    """Graded, flat or all-or-nothing (`profile_kind`) phase profile of a compressed model's evaluation."""
    acc = [g["acc"] for g in summary["groups"]]
    if not stride or len(acc) % stride:
        return None
    return profile_kind(phase_profile(acc, stride))


def run_table(study: Study) -> pd.DataFrame:
    """Each model's training settings and outcome, and its regime (backbone, compressed entries per record)."""
    rows = []
    for alias, m in study.models.items():
        r = m.run
        rows.append({
            "model": m.name, "alias": alias, "backbone": r.get("backbone", r.get("preset")),
            "entries_per_record": r.get("entries_per_record"), "steps": r.get("steps"),
            "tokens": r.get("tokens"), "seed": r.get("seed"), "seconds": r.get("elapsed_s", r.get("seconds")),
            "val_loss": val_loss(m), "status": r.get("status", "–"),
        })
    return pd.DataFrame(rows, dtype=object)


def gate_points(stage: Stage, branch: str = "key") -> pd.DataFrame:
    """Final static / per-window concentration per KV head (one branch)."""
    d = stage.results
    d = d[d.branch == branch] if "branch" in d else d
    return d.groupby(["layer", "kv_head"], as_index=False)[["static", "per_window"]].first()


def gate_path(model: Model, branch: str = "key") -> pd.DataFrame | None:
    """Training paths (step, layer, kv_head, static, per_window) of one branch from gates.jsonl."""
    g = model.gate_paths
    if g is None or not {"static", "per_window", "step"} <= set(g):
        return None
    if "branch" in g:
        g = g[g.branch == branch]
    return g.sort_values("step")


def r2_grid(study: Study) -> pd.DataFrame | None:
    """Gate cycling R² (excluding the boundary phase) per model and delta, with bootstrap intervals."""
    rows = []
    for alias, stage in study.analyses.get("cycle", {}).items():
        for r in stage.summary.get("grid", []):
            rows.append({"alias": alias, "delta": int(r["delta"]), "r2": r.get("r2"), "lo": r.get("r2_lo"),
                         "hi": r.get("r2_hi")})
    return pd.DataFrame(rows) if rows else None
