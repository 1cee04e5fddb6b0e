"""The repair's frontier (DIR/repair/frontier.png): the gap against step cost under each padding, and the cache
frontier, every model of a repair run (`phasekv.mitigate.results.RepairResult`) one point."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from phasekv.eval.figure import DPI
from phasekv.io import write_figure
from phasekv.mitigate.results import PADDINGS, Goals, RepairResult, SeedResult


def plot_frontier(result: RepairResult, path: Path) -> None:
    """Left two panels: gap (95% interval) against step cost (the larger of training and decode, relative to the
    unrepaired model), one per padding; the goals: cost 1.5x (dashed), flat (shaded: below the margin). Right: the
    cache frontier (`cache_panel`), with the designs kept from an earlier record."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g = result.goals
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6), gridspec_kw={"width_ratios": [1, 1, 1.1]})
    axes[1].sharey(axes[0])
    points = [(m.design, m) for m in result.models] + [(d.design, s) for d in result.kept or [] for s in d.per_seed]
    designs = list(dict.fromkeys(design for design, _ in points))
    for ax, padding in zip(axes, PADDINGS, strict=False):
        ax.axhspan(0, g.margin, color="C2", alpha=0.2, lw=0)
        ax.axvline(g.max_cost, ls="--", color="C3", lw=0.8)
        for m in result.models:
            cost_point(ax, m, padding, design_color(designs, m.design))
        ax.set_title(f"lookup, {padding} padding (shaded: flat, below δ = {g.margin:g})", fontsize=9)
        ax.set_xlabel(f"step cost, max(train, decode) / unrepaired (dashed: {g.max_cost:g}x)")
    axes[0].set_ylabel("gap, best - worst phase (points, bias-corrected)")
    cache_panel(axes[2], points, designs, g, result.reference)
    handles = [plt.Line2D([], [], marker="o", ls="", color=design_color(designs, d), label=d) for d in designs]
    fig.legend(handles=handles, loc="lower center", ncol=2, fontsize=7, frameon=False, bbox_to_anchor=(0.5, -0.02 - 0.035 * ((len(designs) + 1) // 2)))
    fig.suptitle("The repair's frontier: weak-phase gap against cost (filled: every goal met at that seed) and against "
                 "cache (filled: every goal but the cache)", fontsize=10)
    write_figure(path, fig, dpi=DPI, bbox_inches="tight")
    plt.close(fig)


def cost_point(ax, m, padding: str, color) -> None:
    """One model's gap (with its interval) under `padding` against its step cost, filled when it meets every goal;
    a seed the name states (not the default one) written beside it."""
    n = m.paddings.get(padding)
    costs = [c for c in (m.train_rel, m.decode_rel) if c is not None]
    if n is None or not costs:
        return
    x = max(costs)
    err = np.array([[n.gap - n.gap_ci[0]], [n.gap_ci[1] - n.gap]]).clip(0)
    ax.errorbar([x], [n.gap], yerr=err, fmt="o", color=color, mfc=color if m.meets else "white", ms=6, capsize=2, lw=0.8)
    if m.label != m.design:  # the design is the label without its seed: the label names one
        ax.annotate(f"seed {m.seed}", (x, n.gap), fontsize=6, xytext=(4, 3), textcoords="offset points")


def cache_panel(ax, points: list[tuple[str, SeedResult]], designs: list[str], goals: Goals, reference: str) -> None:
    """Cache against the model's worst gap: x the cache bytes relative to the reference model (log; a design's
    seeds spread a little apart), y the largest 95% upper bound of the gap under either padding, one point per
    design and seed (filled: every goal but the cache met); shaded: flat by equivalence (below the margin);
    dotted: the frontier's targets 1/8, 1/4, 1/2; dashed: the cache goal."""
    ax.axhspan(0, goals.margin, color="C2", alpha=0.2, lw=0)
    for target in (1 / 2, 1 / 4, 1 / 8):
        ax.axvline(target, ls=":", color="grey", lw=0.8)
    ax.axvline(goals.max_cache, ls="--", color="C3", lw=0.8)
    seen: dict[str, int] = {}
    for design, m in points:
        hi = [n.gap_ci[1] for n in m.paddings.values()]
        if not hi or m.cache_ref is None:
            continue
        i = seen[design] = seen.get(design, -1) + 1
        color = design_color(designs, design)
        ax.plot([m.cache_ref * 1.012 ** i], [max(hi)], "o", color=color, ms=6,
                mfc=color if m.meets_but_cache else "white")
    ax.set_xscale("log", base=2)
    ax.set_xlim(0.1, 1.05)
    ax.set_yscale("symlog", linthresh=5)
    ax.set_ylim(-0.4, 100)  # a gap of 0 stays in view
    ax.set_xlabel(f"cache bytes / {reference}'s (log)")
    ax.set_ylabel("worst gap's 95% upper bound (points)")
    ax.set_title(f"cache frontier: shaded flat (< δ = {goals.margin:g}); dotted 1/8, 1/4, 1/2; dashed the goal",
                 fontsize=9)


def design_color(designs: list[str], design: str):
    """One colour per design, distinct for up to 20 designs (tab20)."""
    import matplotlib

    return matplotlib.colormaps["tab20"](designs.index(design) % 20)
