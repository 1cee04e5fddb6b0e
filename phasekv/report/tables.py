"""Tidy tables the report's figures and HTML tables are drawn from (one place per stage schema)."""

from __future__ import annotations

import numpy as np
import pandas as pd

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
        })
    return pd.DataFrame(rows)


def profile(stage: Stage) -> pd.DataFrame:
    """Accuracy by residue with its interval (percent)."""
    return pd.DataFrame(stage.summary["groups"]).sort_values("residue")


def run_table(study: Study) -> pd.DataFrame:
    """Each model's training settings and outcome."""
    rows = []
    for alias, m in study.models.items():
        r = m.run
        rows.append({
            "model": m.name, "alias": alias, "preset": r.get("preset"), "steps": r.get("steps"),
            "tokens": r.get("tokens"), "seed": r.get("seed"), "seconds": r.get("elapsed_s", r.get("seconds")),
            "val_loss": val_loss(m), "status": r.get("status", "–"),
        })
    return pd.DataFrame(rows, dtype=object)


def head_label(layer: int, kv_head: int, n_kv: int) -> str:
    """kv_head < 0 marks a whole-layer knockout."""
    return f"layer {layer}" if n_kv <= 1 or kv_head < 0 else f"layer {layer} · KV {kv_head}"


def knockout_matrix(stage: Stage, stride: int, folded: bool) -> tuple[list[str], list[int], np.ndarray] | None:
    """Rows KV heads (or layers), columns residues (or phases mod S when folded): relative accuracy change
    in percent, clipped at ±100 (`phasekv analyze knockout`'s effect table)."""
    d = stage.results
    d = d[(d.unit != "clean") & (d.grouping == ("phase" if folded else "residue"))]
    if d.empty:
        return None
    n_kv = int(d.kv_head.max()) + 1
    heads = sorted({(int(a), int(b)) for a, b in zip(d.layer, d.kv_head, strict=True)})
    cols = sorted(int(c) for c in d.group.unique())
    z = np.full((len(heads), len(cols)), np.nan)
    hi, ci = {h: i for i, h in enumerate(heads)}, {c: i for i, c in enumerate(cols)}
    for r in d.itertuples():
        z[hi[(int(r.layer), int(r.kv_head))], ci[int(r.group)]] = 100 * r.rel_change
    return [head_label(a, b, n_kv) for a, b in heads], cols, np.clip(z, -100, 100)


def gate_points(stage: Stage, branch: str = "key") -> pd.DataFrame:
    """Final static / per-window concentration per KV head (one branch)."""
    d = stage.results
    d = d[d.branch == branch] if "branch" in d else d
    return d.groupby(["layer", "kv_head"], as_index=False)[["static", "per_window"]].first()


def gate_scores(stage: Stage, branch: str) -> tuple[list[str], list[int], np.ndarray] | None:
    """Mean gate score by phase relative to uniform (1 = uniform), rows KV heads."""
    d = stage.results
    if "phase" not in d or "score_rel" not in d:
        return None
    d = d[d.branch == branch]
    if d.empty:
        return None
    n_kv = int(d.kv_head.max()) + 1
    heads = sorted({(int(a), int(b)) for a, b in zip(d.layer, d.kv_head, strict=True)})
    phases = sorted(int(p) for p in d.phase.unique())
    z = np.full((len(heads), len(phases)), np.nan)
    for r in d.itertuples():
        z[heads.index((int(r.layer), int(r.kv_head))), phases.index(int(r.phase))] = r.score_rel
    return [head_label(a, b, n_kv) for a, b in heads], phases, z


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


def cycle_profiles(stage: Stage) -> pd.DataFrame:
    """Accuracy by phase per delta in percent: observed (acc, band lo/hi), uncycled (acc0), predicted (pred)."""
    d = stage.results.copy()
    for c in ("acc", "acc0", "pred", "lo", "hi"):
        d[c] = 100 * d[c]
    return d.sort_values(["delta", "phase"])


def flip_table(stage: Stage) -> pd.DataFrame:
    """P(candidate) per (family, length, candidate)."""
    return stage.results.sort_values(["family", "candidate", "length"])


def r2_matrix(study: Study) -> tuple[list[str], list[int], np.ndarray] | None:
    """The R² grid as (model aliases, deltas, z (n_models, n_deltas) with NaN where undefined)."""
    grid = r2_grid(study)
    if grid is None:
        return None
    aliases = list(dict.fromkeys(grid.alias))
    deltas = sorted(grid.delta.unique().tolist())
    z = np.full((len(aliases), len(deltas)), np.nan)
    for r in grid.itertuples():
        z[aliases.index(r.alias), deltas.index(r.delta)] = np.nan if r.r2 is None else r.r2
    return aliases, deltas, z
