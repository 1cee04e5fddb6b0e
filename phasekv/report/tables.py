"""Tidy tables the report's figures and HTML tables are drawn from (one place per stage schema)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from phasekv.config.names import PAPER_GRID, seed_of, unseeded
from phasekv.errors import ModelNameError
from phasekv.eval.stats import phase_profile, profile_kind, retrieves
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


LEARNED_MEAN = 90.0  # full attention's lookup mean that counts as learned: the control every claim compares with


def learned(s: dict) -> bool:
    """Retrieves well above chance: the mean's interval above twice chance (1 of `records` names); without
    the record count there is no chance level to compare with, and the run counts as learned. Full attention (a
    phasekv model without a stride) also needs a mean of LEARNED_MEAN: a control that half-solves the lookup is
    no reference (the study's 1-KV model at one seed: 99.7% held-out recall, a lookup mean of 59.5)."""
    if not s.get("records"):
        return True
    control = s.get("model_kind") == "phasekv" and s.get("stride") is None
    return retrieves(s.get("mean_ci") or [s["mean"]], 100.0 / s["records"]) and (not control or s["mean"] >= LEARNED_MEAN)


SPREAD_KEYS = ("mean", "worst", "best", "gap")  # with a range over seeds (`_min`, `_max`)


def grid_table(study: Study) -> pd.DataFrame:
    """Figure 2 of the paper as a table: every design of its grid (docs: The study and its claims), then any other
    model of the study, with our lookup summary under each padding (NaN where not run) and the published values
    beside them. A design run at several seeds is one row: the mean over its seeds, their range (`KEY_min`,
    `KEY_max`), its seeds, how many learned the lookup, and each seed's detected period."""
    designs: dict[str, list[str]] = {unseeded(n): [] for n in PAPER_GRID}
    for alias, m in study.models.items():
        designs.setdefault(unseeded(m.name), []).append(alias)
    rows = []
    for design, aliases in designs.items():
        pub = published.LOOKUP_PREFIX.get(design, (np.nan,) * 3)
        losses = [val_loss(study.models[a]) for a in aliases]
        row = {"model": design, "alias": aliases[0] if aliases else None, "run": bool(aliases),
               "seeds": ", ".join(_seed(study.models[a]) for a in aliases), "n_seeds": len(aliases),
               "val_loss": _mean([x for x in losses if x is not None]),
               "pub_val_loss": published.VAL_LOSS.get(design, np.nan), "pub_mean": pub[0], "pub_worst": pub[1],
               "pub_gap": pub[2]}
        for padding, stages in study.lookup.items():
            row |= _padding_columns([stages[a].summary for a in aliases if a in stages],
                                    "" if padding == published.PROTOCOL[1] else f"{padding}_")
        rows.append(row)
    return pd.DataFrame(rows)


def _seed(m: Model) -> str:
    """The seed a model's paper name states (a model without one, e.g. a Hugging Face model: its run's, if any)."""
    try:
        return str(seed_of(m.name))
    except ModelNameError:
        return str(m.run.get("seed", "?"))


def _mean(xs: list) -> float:
    return float(np.mean(xs)) if xs else np.nan


def _padding_columns(summaries: list[dict], tag: str) -> dict:
    """A design's columns under one padding (`tag`: its prefix) from its seeds' lookup summaries."""
    values = {k: [s.get(k, np.nan) for s in summaries] for k in ("mean", "worst", "best", "gap", "detected_period")}
    values["gap_lo"] = [(s.get("gap_ci") or (np.nan,) * 2)[0] for s in summaries]
    values["gap_hi"] = [(s.get("gap_ci") or (np.nan,) * 2)[1] for s in summaries]
    periods = values.pop("detected_period")
    out = {f"{tag}{k}": _mean(v) for k, v in values.items()}
    out |= {f"{tag}{k}_{f.__name__}": f(values[k]) if summaries else np.nan for k in SPREAD_KEYS for f in (min, max)}
    common = max(set(periods), key=periods.count) if periods else np.nan
    out |= {f"{tag}detected_period": common, f"{tag}periods": ", ".join(str(p) for p in periods),
            f"{tag}learned": sum(learned(s) for s in summaries)}
    return out


def seed_cell(row: dict, key: str, tag: str = "") -> str:
    """A grid row's `key` as the table shows it: the value (the gap with its interval) at one seed; at several
    the mean over the seeds and their range, '55.3 (40.1–70.2)'."""
    if row.get("n_seeds", 1) > 1:
        return f"{fmt(row[tag + key])} ({fmt(row[f'{tag}{key}_min'])}–{fmt(row[f'{tag}{key}_max'])})"
    return gap_text(row, tag) if key == "gap" else fmt(row.get(tag + key))


def gap_text(row: dict, tag: str = "") -> str:
    """A grid row's gap with its interval, '55.3 [50.7, 59.9]' (`tag`: the padding's column prefix)."""
    if tag + "gap" not in row:
        return "–"
    return interval(row[tag + "gap"], (row[tag + "gap_lo"], row[tag + "gap_hi"]))
