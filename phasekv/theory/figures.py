"""Figures of the theory checks (matplotlib PNG)."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pandas as pd  # noqa: E402

from phasekv.theory.io import save_figure  # noqa: E402


def minimisers_figure(starts: pd.DataFrame, assignments: pd.DataFrame, path: Path) -> None:
    """Left: one-hotness of every optimum. Right: distinct against colliding one-hot assignments (eps = 0)."""
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for label, d in starts.groupby("setting", sort=False):
        ax1.scatter(d.key_max_min, d.value_succ_min, s=12, alpha=0.6, label=label)
    ax1.set_xlabel("min over heads, chunks of max_r p^K(r)")
    ax1.set_ylabel("min over heads, chunks of p^V(r+1)")
    ax1.set_title("Optima of unconstrained rules (one point per start)")
    ax1.legend(fontsize=6)
    if len(assignments):
        labels, dist, coll = [], [], []
        for label, d in assignments.groupby("setting", sort=False):
            labels.append(label.replace(" kappa", "\nkappa"))
            best_d = d[d.distinct].loss.min()
            dist.append(0.0)
            coll.append(d[~d.distinct].loss.min() - best_d if (~d.distinct).any() else float("nan"))
        x = range(len(labels))
        ax2.bar(x, coll, color="tab:red", label="best colliding - distinct")
        ax2.axhline(0, color="k", lw=0.8)
        ax2.set_xticks(list(x), labels, fontsize=6, rotation=30, ha="right")
        ax2.set_ylabel("loss gap (exact, eps = 0)")
        ax2.set_title("Distinct positions beat collisions")
        ax2.legend(fontsize=7)
    save_figure(fig, path)


def gate_paths_figure(tracked: pd.DataFrame, path: Path, max_panels: int = 6, max_runs: int = 8) -> None:
    """min over contexts and chunks of p^K(r_h) (solid) and p^V(r_h+1) (dashed) over flow time, per head."""
    groups = list(tracked.groupby(["setting", "rho"], sort=False))[:max_panels]
    cols = min(3, len(groups))
    rows = (len(groups) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, ((label, rho), d) in zip(axes.flat, groups, strict=False):
        for (run, head), g in d[d.run < max_runs].groupby(["run", "head"]):
            color = f"C{(run * 3 + head) % 10}"
            ax.plot(g.time, g.key_min, color=color, lw=1)
            ax.plot(g.time, g.value_min, color=color, lw=1, ls="--")
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{label}\nrho={rho:g}", fontsize=7)
        ax.set_xlabel("flow time (eta x steps)")
        ax.set_ylabel("min p^K(r_h) (solid), min p^V(r_h+1) (dashed)", fontsize=7)
    for ax in list(axes.flat)[len(groups):]:
        ax.axis("off")
    save_figure(fig, path)


def collision_figure(summary: list[dict], path: Path) -> None:
    """Fraction of runs in which two heads chose the same position, against independent uniform choice."""
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(summary)), 4.5))
    x = range(len(summary))
    ax.bar(x, [s["collision_rate"] for s in summary], yerr=[s["collision_rate_se"] for s in summary],
           color="tab:blue", capsize=3, label="gradient flow (+- SE)")
    ax.scatter(x, [s["independent_uniform_collision_rate"] for s in summary], color="k", marker="_", s=400,
               zorder=3, label="independent uniform choice")
    ax.set_xticks(list(x), [f"{s['setting'].replace(' kappa', chr(10) + 'kappa')}\nrho={s['rho']:g}" for s in summary],
                  fontsize=6, rotation=30, ha="right")
    ax.set_ylabel("collision rate")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    ax.set_title("Heads choosing the same position")
    save_figure(fig, path)


def coverage_figure(cov: pd.DataFrame, path: Path, max_runs: int = 4) -> None:
    """Accuracy by query position (bars) with each head's chosen position (triangles), per run and setting."""
    settings = list(cov.groupby("setting", sort=False))
    ncols = max_runs + 1
    fig, axes = plt.subplots(len(settings), ncols, figsize=(2.6 * ncols, 2.6 * len(settings)), squeeze=False)
    for row, (label, d) in zip(axes, settings, strict=True):
        runs = sorted(r for r in d.run.unique() if r >= 0)[:max_runs] + [-1]
        for ax, run in zip(row, runs, strict=False):
            g = d[d.run == run].sort_values("position")
            colors = ["tab:green" if c else "tab:red" for c in g.covered]
            ax.bar(g.position, g.accuracy, color=colors)
            weak = g[~g.covered]  # zero-height bars are invisible: mark uncovered positions
            ax.plot(weak.position, weak.accuracy.clip(lower=0.03), "x", color="tab:red", ms=8, mew=2)
            chosen = [int(p) for p in g.chosen_positions.iloc[0].split(",")]
            for h, p in enumerate(chosen):
                ax.plot(p, 1.05 + 0.08 * chosen[:h].count(p), marker="v", color=f"C{h}", ms=6)
            ax.set_ylim(0, 1.3)
            ax.set_xticks(range(1, int(g.S.iloc[0])))
            ax.set_title("distinct optimum" if run < 0 else f"flow run {run}", fontsize=7)
            ax.set_xlabel("query position q", fontsize=7)
        for ax in row[len(runs):]:
            ax.axis("off")
        row[0].set_ylabel(label.replace(" kappa", "\nkappa"), fontsize=6)
    fig.suptitle("Retrieval accuracy by position (green: some head chose it, red x: none did; "
                 "triangles: heads' positions)", fontsize=9)
    fig.tight_layout()
    save_figure(fig, path)
