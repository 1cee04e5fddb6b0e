"""Static (matplotlib PNG) versions of the report's figures, for papers. Same tables as `plots`."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
from matplotlib.colors import LinearSegmentedColormap  # noqa: E402

from phasekv.io import write_figure  # noqa: E402
from phasekv.report import tables  # noqa: E402
from phasekv.report.load import Study  # noqa: E402

RDBU = LinearSegmentedColormap.from_list("lost_gained", ["#b2182b", "#ef8a62", "#f7f7f7", "#67a9cf", "#2166ac"])


def save(fig, path: Path) -> Path:
    """Write atomically so an interrupted render never leaves a truncated PNG."""
    try:
        return write_figure(path, fig, dpi=110, bbox_inches="tight")
    finally:
        plt.close(fig)


def residue_png(study: Study, stages: dict, padding: str, colors: dict, path: Path) -> Path:
    """One panel per model: accuracy by residue with its band, its own period boundaries dashed,
    full attention dashed grey in every panel."""
    base = next((a for a in stages if not study.models[a].compressed), None)
    n = len(stages)
    cols = min(3, n)
    rows = (n + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.6 * cols, 3.2 * rows), squeeze=False, sharey=True)
    for ax, (alias, stage) in zip(axes.flat, stages.items(), strict=False):
        m, p = study.models[alias], tables.profile(stage)
        if base is not None and alias != base:
            b = tables.profile(stages[base])
            ax.plot(b.residue, b.acc, color="grey", ls="--", lw=1, label=study.models[base].name)
        ax.fill_between(p.residue, p.lo, p.hi, color=colors[alias], alpha=0.2, lw=0)
        ax.plot(p.residue, p.acc, color=colors[alias], marker="o", ms=3, lw=1.5)
        for k in range(1, len(p) // m.stride if m.stride else 0):
            ax.axvline(k * m.stride - 0.5, color="grey", ls="--", lw=0.8)
        if m.stride:  # small triangles under the axis: the boundary phase S-1 of every period
            xs = [r for r in p.residue if r % m.stride == m.stride - 1]
            ax.plot(xs, [-1] * len(xs), "^", color=colors[alias], ms=4, clip_on=False)
        s = stage.summary
        ax.set_title(f"{m.name}\ngap {s['gap']:.1f} [{s['gap_ci'][0]:.1f}, {s['gap_ci'][1]:.1f}], "
                     f"period {s.get('detected_period')}", fontsize=8)
        ax.set_ylim(-2, 102)
        ax.set_xlabel(f"position mod {s.get('modulus', len(p))}", fontsize=8)
    for ax in axes[:, 0]:
        ax.set_ylabel("accuracy (%)")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.suptitle(f"Lookup accuracy by residue ({padding} padding); bands 95%", fontsize=10)
    return save(fig, path)


def fold_png(study: Study, stages: dict, padding: str, colors: dict, path: Path) -> Path | None:
    comp = [(a, s) for a, s in stages.items() if study.models[a].compressed]
    if not comp:
        return None
    fig, axes = plt.subplots(1, len(comp), figsize=(3.6 * len(comp), 3.0), squeeze=False, sharey=True)
    for ax, (alias, stage) in zip(axes.flat, comp, strict=True):
        m, p = study.models[alias], tables.profile(stage)
        for k in range(len(p) // m.stride):
            seg = p.iloc[k * m.stride: (k + 1) * m.stride]
            ax.plot(range(m.stride), seg.acc, color=colors[alias], ls="-" if k == 0 else "--", marker="o", ms=2)
        ax.set_title(m.name, fontsize=8)
        ax.set_xlabel("phase (position mod S)", fontsize=8)
        ax.set_ylim(-2, 102)
    axes[0, 0].set_ylabel("accuracy (%)")
    fig.suptitle(f"Fold view ({padding} padding): first period solid, later dashed", fontsize=10)
    return save(fig, path)


def training_png(study: Study, colors: dict, path: Path) -> Path | None:
    ms = [(a, m) for a, m in study.models.items() if m.metrics is not None and "loss" in m.metrics]
    if not ms:
        return None
    fig, ax = plt.subplots(figsize=(6.5, 3.8))
    for alias, m in ms:
        d = m.metrics.dropna(subset=["loss"])
        ax.plot(d.step, d.loss, color=colors[alias], lw=1.2, label=m.name)
        if "val_loss" in m.metrics:
            v = m.metrics.dropna(subset=["val_loss"])
            ax.plot(v.step, v.val_loss, "D", color=colors[alias], ms=4)
    ax.set_yscale("log")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (diamonds: validation)")
    ax.legend(fontsize=7)
    return save(fig, path)


def flip_png(study: Study, colors: dict, path: Path) -> Path | None:
    if not study.flip:
        return None
    fig, axes = plt.subplots(1, len(study.flip), figsize=(4.5 * len(study.flip), 3.2), squeeze=False, sharey=True)
    for ax, (alias, stage) in zip(axes.flat, study.flip.items(), strict=True):
        m, d = study.models[alias], tables.flip_table(stage)
        first = stage.summary.get("candidates", [d.candidate.iloc[0]])[0]
        for (fam, g), ls in zip(d[d.candidate == first].groupby("family", sort=False), ["-", ":", "--", "-."] * 4,
                                strict=False):
            ax.plot(g.length, g.prob, ls=ls, marker="o", ms=2, color=colors[alias], label=str(fam))
        if m.stride:
            for x in range(int(d.length.min()) + 1, int(d.length.max()) + 1):
                if x % m.stride == 0:
                    ax.axvline(x - 0.5, color="grey", ls="--", lw=0.6)
        s = stage.summary
        follow = (f"{s['follow_pattern']}/{s['rankings']} rankings follow length mod S"
                  if s.get("follow_pattern") is not None else "")
        ax.set_title(f"{m.name}\n{follow}", fontsize=8)
        ax.set_xlabel("filler length")
        ax.legend(fontsize=6)
    axes[0, 0].set_ylabel(f"P({first})")
    return save(fig, path)


def knockout_png(stage, name: str, stride: int, path: Path) -> Path:
    rows, cols, z = tables.knockout_matrix(stage, stride, folded=False)
    panels = [(rows, cols, z, "position mod M")]
    folded = tables.knockout_matrix(stage, stride, folded=True) if stride else None
    if folded is not None:
        panels.append((*folded, f"folded mod {stride}"))
    fig, axes = plt.subplots(1, len(panels), figsize=(9, 0.9 + 0.45 * len(rows)), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 1][: len(panels)]})
    for ax, (r, c, zz, xl) in zip(axes.flat, panels, strict=True):
        im = ax.imshow(zz, cmap=RDBU, vmin=-100, vmax=100, aspect="auto")
        ax.set_yticks(range(len(r)), r, fontsize=7)
        ax.set_xticks(range(len(c)), c, fontsize=6)
        ax.set_xlabel(xl, fontsize=8)
    fig.colorbar(im, ax=axes.ravel().tolist(), label="Δ accuracy (%)", shrink=0.8)
    fig.suptitle(f"Knockout map · {name} (red: lost, blue: gained, clipped ±100%)", fontsize=9)
    return save(fig, path)


def gate_plane_png(study: Study, colors: dict, path: Path) -> Path | None:
    items = [(a, s) for a, s in study.analyses.get("gates", {}).items()
             if study.models[a].gate != "uniform" and s.results is not None and "static" in s.results]
    if not items:
        return None
    fig, ax = plt.subplots(figsize=(5.2, 5))
    top = 1
    for alias, stage in items:
        m = study.models[alias]
        top = max(top, m.window)
        path_df = tables.gate_path(m)
        if path_df is not None:
            for _, g in path_df.groupby(["layer", "kv_head"]):
                ax.plot(g.static, g.per_window, color=colors[alias], lw=0.8, alpha=0.6)
                ax.plot(g.static.iloc[0], g.per_window.iloc[0], "o", mfc="none", color=colors[alias], ms=5)
        pts = tables.gate_points(stage)
        ax.plot(pts.static, pts.per_window, "o", color=colors[alias], ms=7, label=m.name)
        ax.axvline(m.window, color="grey", ls=":", lw=0.8)
    ax.plot([1, top], [1, top], color="grey", ls="--", lw=0.8)
    ax.set_xlim(0.8, top + 0.3)
    ax.set_ylim(0.8, top + 0.3)
    ax.set_xlabel("static exp(H(E[α]))")
    ax.set_ylabel("per-window E[exp(H(α))]")
    ax.legend(fontsize=7)
    ax.set_title("Key-gate concentration (open: step 1, filled: end)", fontsize=9)
    return save(fig, path)


def alignment_png(study: Study, alias: str, path: Path) -> Path | None:
    m = study.models[alias]
    gates, ko = study.analyses.get("gates", {}).get(alias), study.analyses.get("knockout", {}).get(alias)
    if gates is None or gates.results is None or m.gate == "uniform":
        return None
    pts = tables.gate_points(gates)
    panels = [(f"{b} score / uniform", sc, (0, 2), "viridis") for b in ("key", "value")
              if (sc := tables.gate_scores(gates, b)) is not None]
    folded = tables.knockout_matrix(ko, m.stride, folded=True) if ko is not None and ko.results is not None else None
    if folded is not None:
        panels.append(("knockout Δ acc (%)", folded, (-100, 100), RDBU))
    fig, axes = plt.subplots(1, 1 + len(panels), figsize=(3 + 2.6 * len(panels), 1 + 0.45 * len(pts)), squeeze=False)
    labels = [tables.head_label(a, b, int(pts.kv_head.max()) + 1) for a, b in zip(pts.layer, pts.kv_head, strict=True)]
    ax = axes[0, 0]
    ax.barh(range(len(pts)), pts.static, color="#555")
    ax.set_yticks(range(len(pts)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(1, max(m.window, 2))
    ax.set_xlabel("static concentration", fontsize=8)
    for ax, (title, (_rows, cols, z), (lo, hi), cmap) in zip(axes[0, 1:], panels, strict=True):
        ax.imshow(np.asarray(z, dtype=float), cmap=cmap, vmin=lo, vmax=hi, aspect="auto")
        ax.set_yticks([])
        ax.set_xticks(range(len(cols)), cols, fontsize=7)
        ax.set_xlabel(f"phase · {title}", fontsize=8)
    fig.suptitle(f"Gate preferences vs knockout losses · {m.name}", fontsize=9)
    return save(fig, path)


def cycle_png(study: Study, alias: str, path: Path) -> Path | None:
    stage = study.analyses.get("cycle", {}).get(alias)
    if stage is None or stage.results is None:
        return None
    m, d = study.models[alias], tables.cycle_profiles(stage)
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for i, delta in enumerate(sorted(int(x) for x in d.delta.unique())):
        g = d[d.delta == delta].sort_values("phase")
        if delta == 0:
            ax.plot(g.phase, g.acc, color="grey", lw=3, label="δ = 0")
            continue
        ax.fill_between(g.phase, g.lo, g.hi, color=f"C{i}", alpha=0.12, lw=0)
        ax.plot(g.phase, g.acc, color=f"C{i}", marker="o", ms=3, label=f"δ = {delta:+d}")
        ax.plot(g.phase, g.pred, color=f"C{i}", ls="--", lw=1)
    ax.axvline(m.stride - 1, color="#b2182b", ls=":")
    ax.set_xlabel("phase")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(f"Gate cycling · {m.name} (solid observed, dashed predicted)", fontsize=9)
    ax.legend(fontsize=6, ncol=2)
    return save(fig, path)


def r2_png(study: Study, path: Path) -> Path | None:
    matrix = tables.r2_matrix(study)
    if matrix is None:
        return None
    aliases, deltas, z = matrix
    fig, ax = plt.subplots(figsize=(1.2 + 0.8 * len(deltas), 0.8 + 0.5 * len(aliases)))
    ax.imshow(z, cmap="Greens", vmin=0, vmax=1, aspect="auto")
    for i in range(len(aliases)):
        for j in range(len(deltas)):
            if not np.isnan(z[i, j]):
                ax.text(j, i, f"{z[i, j]:.2f}", ha="center", va="center", fontsize=8)
    ax.set_xticks(range(len(deltas)), [f"{d:+d}" for d in deltas])
    ax.set_yticks(range(len(aliases)), [study.models[a].name if a in study.models else a for a in aliases], fontsize=7)
    ax.set_xlabel("δ")
    ax.set_title("Gate cycling R² (boundary phase excluded)", fontsize=9)
    return save(fig, path)
