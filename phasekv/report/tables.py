"""Tidy tables the report's figures and HTML tables are drawn from (one place per stage schema)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from phasekv.config.names import PAPER_GRID
from phasekv.eval.stats import phase_profile, profile_kind
from phasekv.report import published
from phasekv.report.html import fmt, interval
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


def grid_table(study: Study) -> pd.DataFrame:
    """Figure 2 of the paper as a table: every run of its grid (docs: The study and its claims), then any other model of the study, with
    our lookup summary under each padding (NaN where not run) and the published values beside them."""
    names = {m.name: a for a, m in study.models.items()}
    rows = []
    for name in [*PAPER_GRID, *(n for n in names if n not in PAPER_GRID)]:
        alias = names.get(name)
        pub = published.LOOKUP_PREFIX.get(name, (np.nan,) * 3)
        row = {"model": name, "alias": alias, "run": alias is not None,
               "val_loss": val_loss(study.models[alias]) if alias else None,
               "pub_val_loss": published.VAL_LOSS.get(name, np.nan), "pub_mean": pub[0], "pub_worst": pub[1],
               "pub_gap": pub[2]}
        for padding, stages in study.lookup.items():
            s = stages[alias].summary if alias in stages else {}
            lo, hi = s.get("gap_ci") or (np.nan, np.nan)
            tag = "" if padding == published.PROTOCOL[1] else f"{padding}_"
            row.update({f"{tag}{k}": s.get(k, np.nan) for k in ("mean", "worst", "best", "gap", "detected_period")})
            row.update({f"{tag}gap_lo": lo, f"{tag}gap_hi": hi})
        rows.append(row)
    return pd.DataFrame(rows)


def gap_text(row: dict, tag: str = "") -> str:
    """A grid row's gap with its interval, '55.3 [50.7, 59.9]' (`tag`: the padding's column prefix)."""
    if tag + "gap" not in row:
        return "–"
    return interval(row[tag + "gap"], (row[tag + "gap_lo"], row[tag + "gap_hi"]))


def spread_text(spread: pd.DataFrame) -> str:
    """`seed_spread` in words: 'mean 39.5 (SD 7.0, range 32.2–47.6); worst ...; gap ...'."""
    return "; ".join(f"{k} {spread.at['mean', k]:.1f} (SD {fmt(spread.at['std', k])}, range {spread.at['min', k]:.1f}–"
                     f"{spread.at['max', k]:.1f})" for k in ("mean", "worst", "gap"))


def seed_spread(grid: pd.DataFrame, name: str = "W8/S8 · 1 KV") -> pd.DataFrame | None:
    """Seed-to-seed spread (mean, SD, min, max over the seeds run) of `name`'s mean, worst and gap."""
    seeds = grid[(grid.model == name) | grid.model.str.startswith(name + " · seed")]
    seeds = seeds[seeds["mean"].notna()] if "mean" in seeds else seeds.iloc[:0]
    if seeds.empty:
        return None
    stats = seeds[["mean", "worst", "gap"]].astype(float).agg(["mean", "std", "min", "max"])
    return stats.assign(seeds=len(seeds))
