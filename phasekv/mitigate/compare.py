"""`phasekv compare`: mitigations and references side by side, at their cost.

For each evaluated model (a `phasekv eval lookup|needle --out DIR` directory): cache bytes per token relative
to full attention (and the compression ratio), training and decode cost relative to full attention
(measured here, in one process, interleaved, so machine load hits every model alike), mean accuracy, worst
residue, gap with its interval, fold consistency and the detected period; a Pareto plot of the gap against
cache size; and the acceptance check of the mitigations (compression >= R, gap <= F x the full-attention
gap, mean >= the baseline's), on point estimates and with the intervals.

Output (stable schema `phasekv.compare/1`, read by the report): DIR/summary.json, DIR/results.parquet (one
row per model, the same fields), DIR/pareto.png. The parts: `discovery` (which evaluations, which reference
and baseline), `cost` (cache bytes, measured step times), `criteria` (Pareto flags, the acceptance check);
this module builds the table and writes it.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from rich.table import Table

from phasekv.errors import ConfigError, DataError
from phasekv.eval.figure import DPI
from phasekv.eval.run import json_default, versions
from phasekv.io import write_figure, write_json, write_parquet
from phasekv.mitigate.cost import Bench, add_costs
from phasekv.mitigate.criteria import acceptance, mark_pareto
from phasekv.mitigate.discovery import find_summary, mitigations, model_config, pick, run_info, twin_label
from phasekv.mitigate.results import CompareRow

SCHEMA = "phasekv.compare/1"
ROW_FIELDS = [f.name for f in fields(CompareRow)]  # summary.json["models"]'s records, results.parquet's columns


def compare(paths: list[Path], out: Path | None = None, reference: str | None = None, baseline: str | None = None,
            protocol: str | None = "prefix", context: int = 32768, min_compression: float = 4.0,
            max_gap_factor: float = 2.0, bench: Bench | None = None, progress: bool = False,
            baseline_flag: str = "--baseline") -> dict:
    """Build the comparison (and write it under `out`); returns the summary dict (schema SCHEMA).
    `baseline_flag`: the option that named the baseline, for the error when it is not among the models."""
    if not paths:
        raise ConfigError("compare needs at least one evaluation directory")
    if context < 1:
        raise ConfigError(f"--context {context} must be >= 1")
    summaries = _summaries(paths, protocol)
    task, proto, modulus = {(s["task"], s["protocol"], s["modulus"]) for _, s in summaries}.pop()
    cfgs = {s["model"]: model_config(s) for _, s in summaries}
    ref = pick(reference, "--reference", cfgs, lambda c: c is not None and not c.compressed)
    base = pick(baseline, baseline_flag, cfgs, lambda c: False, default_name="W8/S8 · 1 KV")
    rows = [_row(d, s, cfgs, ref, base) for d, s in summaries]
    add_costs(rows, cfgs, cfgs.get(ref) if ref else None, context, bench or Bench(), progress)
    mark_pareto(rows)
    summary = {
        "schema": SCHEMA, "task": task, "protocol": proto, "modulus": modulus, "reference": ref, "baseline": base,
        "context": context, "bench": (bench or Bench()).__dict__, "threads": torch.get_num_threads(),
        "models": [r.to_dict() for r in rows],
        "criteria": acceptance(rows, ref, base, min_compression, max_gap_factor),
        "provenance": {"inputs": [str(d) for d, _ in summaries], "versions": versions()},
    }
    if out is not None:
        write(summary, Path(out))
    return summary


def _summaries(paths: list[Path], protocol: str | None) -> list[tuple[Path, dict]]:
    """(evaluation dir, summary) of each path: one task, padding and modulus, each model once."""
    summaries = []
    for p in paths:
        f = find_summary(Path(p), protocol)
        summaries.append((f.parent, json.loads(f.read_text())))
    tasks = {(s["task"], s["protocol"], s["modulus"]) for _, s in summaries}
    if len(tasks) > 1:
        raise DataError(f"compare needs evaluations of one task, padding and modulus; got {sorted(tasks)}")
    dirs = [d.resolve() for d, _ in summaries]
    dup = sorted({str(d) for d in dirs if dirs.count(d) > 1})
    if dup:
        raise DataError(f"{dup[0]}: the same evaluation twice; compare each model once")
    seen: set[str] = set()
    for d, s in summaries:  # one name trained two ways (say, another data recipe): the later ones by directory
        if s["model"] in seen:
            s["model"] = twin_label(s["model"], d.name)
        seen.add(s["model"])
    return summaries


def _row(d: Path, s: dict, cfgs: dict, ref: str | None, base: str | None) -> CompareRow:
    """One model's record (its costs are added by `cost.add_costs`, its Pareto flag by `criteria`)."""
    cfg = cfgs[s["model"]]
    k = int(s.get("provenance", {}).get("model_info", {}).get("ensemble", {}).get("k", 1))
    run_dir, tps = run_info(s)
    return CompareRow(
        label=s["model"], model=cfg.name if cfg else s["model"], eval_dir=str(d), run_dir=run_dir,
        role="reference" if s["model"] == ref else "baseline" if s["model"] == base else "candidate",
        mitigations=mitigations(cfg, k, cfgs.get(base)),
        window=cfg.window if cfg else None, stride=(cfg.stride or None) if cfg else s.get("stride"),
        n_kv_heads=cfg.n_kv_heads if cfg else None, ensemble_k=k,
        train_tokens_per_s=tps, eval_seconds=s.get("provenance", {}).get("seconds"),
        mean=s["mean"], mean_ci=s["mean_ci"], worst=s["worst"], worst_ci=s["worst_ci"],
        worst_residue=min(s["groups"], key=lambda g: g["acc"])["residue"], best=s["best"], gap=s["gap"],
        gap_ci=s["gap_ci"], gap_raw=s.get("gap_raw"), fold_consistency=s.get("fold_consistency"),
        detected_period=s.get("detected_period"), periodicity_p=s.get("periodicity", {}).get("p_value"))


# ---------------------------------------------------------------- outputs


def write(summary: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows = pd.DataFrame(summary["models"], columns=ROW_FIELDS)
    for col in ("mean_ci", "worst_ci", "gap_ci"):
        rows[col] = rows[col].map(lambda v: None if v is None else [float(x) for x in v])
    write_parquet(out / "results.parquet", rows)
    write_json(out / "summary.json", summary, default=json_default)
    plot_pareto(summary, out / "pareto.png")


def plot_pareto(summary: dict, path: Path) -> None:
    """Gap (with its interval) against cache bytes relative to full attention; the Pareto front joined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in map(CompareRow.from_dict, summary["models"]) if r.cache_rel is not None]
    fig, ax = plt.subplots(figsize=(7, 4.2))
    if rows:
        x = np.array([r.cache_rel for r in rows])
        y = np.array([r.gap for r in rows])
        err = np.array([[r.gap - r.gap_ci[0], r.gap_ci[1] - r.gap] for r in rows]).T.clip(0)
        mean = np.array([r.mean for r in rows])
        ax.errorbar(x, y, yerr=err, fmt="none", ecolor="gray", lw=0.8, capsize=2, zorder=1)
        sc = ax.scatter(x, y, c=mean, cmap="viridis", vmin=0, vmax=100, s=46, zorder=2, edgecolors="k", lw=0.5)
        fig.colorbar(sc, ax=ax, label="mean accuracy (%)")
        front = sorted((r for r in rows if r.pareto), key=lambda r: r.cache_rel)
        ax.step([r.cache_rel for r in front], [r.gap for r in front], where="post", color="C3", lw=1,
                label="Pareto front", zorder=0)
        seen: dict[float, int] = {}  # models at the same cache size (ensembles of one model): stack their labels
        for r in sorted(rows, key=lambda r: -r.gap):
            key = round(float(np.log2(r.cache_rel)), 1)  # same place on the log axis
            n = seen[key] = seen.get(key, -1) + 1
            ax.annotate(r.label, (r.cache_rel, r.gap), fontsize=6.5, xytext=(5, 3 - 9 * n),
                        textcoords="offset points")
        crit = summary.get("criteria", {})
        if crit.get("reference_gap") is not None:
            ax.axhline(crit["max_gap_factor"] * crit["reference_gap"], ls="--", color="C3", lw=0.8,
                       label=f"{crit['max_gap_factor']:g} x full-attention gap")
            ax.axvline(1 / crit["min_compression"], ls=":", color="gray", lw=0.8,
                       label=f"compression {crit['min_compression']:g}x")
        ax.set_xscale("log")
        ticks = [2.0**e for e in range(int(np.floor(np.log2(x.min()))), 1)]
        ax.set_xticks(ticks, [f"1/{round(1 / t)}" if t < 1 else "1" for t in ticks])
        ax.minorticks_off()
        ax.set_xlim(min(ticks) / 1.3, 1.6)
        ax.legend(fontsize=7, loc="best")
    ax.set_xlabel(f"cache bytes per token relative to full attention (context {summary['context']:,})")
    ax.set_ylabel("gap, best - worst residue (points)")
    ax.set_title(f"{summary['task']} · {summary['protocol']} padding · gap against cache size", fontsize=9)
    write_figure(path, fig, dpi=DPI, bbox_inches="tight")
    plt.close(fig)


def table(summary: dict):
    """A rich table of the comparison."""
    t = Table(title=f"{summary['task']} · {summary['protocol']} padding · M={summary['modulus']} · cache at "
                    f"{summary['context']:,} tokens · cache and costs relative to the reference "
                    f"{summary['reference']} (same KV: to full attention with the model's KV heads)")
    cols = ["model", "cache", "same KV", "compr.", "train", "decode", "mean [95%]", "worst (res.)", "gap [95%]", "fold", "period",
            "pareto"]
    for c in cols:
        t.add_column(c, justify="left" if c == "model" else "right")

    def f(v, fmt="{:.2f}"):
        return "-" if v is None else fmt.format(v)

    for r in map(CompareRow.from_dict, summary["models"]):
        role = {"reference": " (ref)", "baseline": " (base)"}.get(r.role, "")
        t.add_row(r.label + role, f(r.cache_rel, "{:.3f}"), f(r.cache_same_kv, "{:.3f}"), f(r.compression, "{:.1f}x"),
                  f(r.train_cost_rel), f(r.decode_cost_rel), f"{r.mean:.1f} [{r.mean_ci[0]:.1f}, {r.mean_ci[1]:.1f}]",
                  f"{r.worst:.1f} ({r.worst_residue})", f"{r.gap:.1f} [{r.gap_ci[0]:.1f}, {r.gap_ci[1]:.1f}]",
                  f(r.fold_consistency, "{:.1f}"), str(r.detected_period), "yes" if r.pareto else "")
    return t
