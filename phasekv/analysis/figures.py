"""Figures of the mechanism analyses (matplotlib PNG): knockout maps, the concentration plane with training
paths, the per-head panel (gates beside knockouts) and gate cycling."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import matplotlib.ticker  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from phasekv.io import write_figure  # noqa: E402

KO_CMAP = "RdBu"  # red = accuracy lost, blue = gained
SCORE_CMAP = "PuOr_r"


def save(fig, path: Path) -> None:
    """Write atomically (`phasekv.io`) and close."""
    try:
        write_figure(path, fig, dpi=130, bbox_inches="tight")
    finally:
        plt.close(fig)


def _matrix(table: pd.DataFrame, grouping: str, value: str = "rel_change") -> tuple[np.ndarray, list[str], list[int]]:
    t = table[(table["grouping"] == grouping) & (table["unit"] != "clean")]
    units = list(dict.fromkeys(t["unit"]))
    groups = sorted(t["group"].unique())
    mat = t.pivot_table(index="unit", columns="group", values=value, aggfunc="first", dropna=False)
    return mat.reindex(index=units, columns=groups).to_numpy(dtype=float), units, groups


def knockout_map(table: pd.DataFrame, path: Path, title: str) -> None:
    """Rows: knockout units; columns: positions mod M and (if present) folded mod S; clipped at +-100%."""
    mods = {g: int(table.loc[table["grouping"] == g, "modulus"].iloc[0]) for g in ("residue", "phase")
            if (table["grouping"] == g).any()}
    panels = [g for g in mods if g == "residue" or mods[g] < mods["residue"]]  # no fold when M = S
    mats = [_matrix(table, g) for g in panels]
    n_rows = len(mats[0][1])
    widths = [len(m[2]) for m in mats]
    fig, axes = plt.subplots(1, len(panels), figsize=(1.2 + 0.32 * sum(widths) + 1.5 * len(panels),
                                                      1.2 + 0.3 * max(n_rows, 3)),
                             gridspec_kw={"width_ratios": widths}, squeeze=False)
    im = None
    for ax, (mat, units, groups), name in zip(axes[0], mats, panels, strict=True):
        mod = mods[name]
        im = ax.imshow(np.clip(100 * mat, -100, 100), cmap=KO_CMAP, vmin=-100, vmax=100, aspect="auto")
        ax.set_xticks(range(len(groups)), [str(g) for g in groups], fontsize=7)
        ax.set_yticks(range(len(units)), units, fontsize=7)
        ax.set_xlabel(f"target position mod {mod}" + (" (folded to one stride)" if name == "phase" else ""))
        for (i, j) in zip(*np.nonzero(np.isnan(mat)), strict=True):
            ax.text(j, i, "·", ha="center", va="center", color="gray")
    fig.colorbar(im, ax=axes[0].tolist(), label="accuracy change relative to clean (%)", shrink=0.8)
    if any(np.isnan(m[0]).any() for m in mats):
        title += "  (·: clean accuracy 0, change undefined)"
    fig.suptitle(title, fontsize=9, y=1.0 + 0.2 / fig.get_figheight())
    save(fig, path)


def concentration_plane(heads: pd.DataFrame, paths: pd.DataFrame | None, path: Path, title: str,
                        trace: list[tuple[int, int]] | None = None) -> None:
    """Key gates placed by static (x) and per-window (y) effective offsets (large points, black edge);
    training paths of `trace` heads (None: all) from the first snapshot (open circle) to the last (small
    filled circle). Layers with different windows (DeepSeek-V4's CSA and HCA) share the axes up to the
    largest window, each window marked."""
    key = heads[heads["branch"] == "key"]
    W = int(key["window"].max())
    n_layers = int(max(key["layer"].max(), paths["layer"].max() if paths is not None else 0)) + 1
    cmap = plt.get_cmap("viridis")
    fig, ax = plt.subplots(figsize=(5.2, 4.6))
    ax.plot([1, W], [1, W], "--", color="gray", lw=1, label="same scores in every window")
    for w in sorted(set(key["window"].astype(int))):
        ax.axvline(w, color="black", lw=1.5, ls=":", label="uniform on average (right edge)" if w == W else None)
    if paths is not None:
        pk = paths[paths["branch"] == "key"]
        for (layer, kv), g in pk.groupby(["layer", "kv_head"]):
            if trace is not None and (layer, kv) not in trace:
                continue
            g = g.sort_values("step")
            c = cmap(layer / max(n_layers - 1, 1))
            ax.plot(g["static"], g["per_window"], "-", color=c, lw=1, alpha=0.8)
            ax.plot(g["static"].iloc[0], g["per_window"].iloc[0], "o", mfc="white", mec=c, ms=6)
            ax.plot(g["static"].iloc[-1], g["per_window"].iloc[-1], "o", color=c, ms=4)
            ax.annotate(f"L{layer}·KV{kv}", (g["static"].iloc[-1], g["per_window"].iloc[-1]), fontsize=6,
                        xytext=(3, -8), textcoords="offset points")
    sc = ax.scatter(key["static"], key["per_window"], c=key["layer"], cmap=cmap, vmin=0, vmax=max(n_layers - 1, 1),
                    s=28, edgecolors="black", linewidths=0.4, zorder=3)
    cb = fig.colorbar(sc, ax=ax, label="layer")
    cb.locator = matplotlib.ticker.MaxNLocator(integer=True)
    cb.update_ticks()
    ax.set_xlim(0.9, W + 0.3)
    ax.set_ylim(0.9, W + 0.3)
    ax.set_xlabel("static  exp(H(E[α]))")
    ax.set_ylabel("per window  E[exp(H(α))]")
    ax.legend(fontsize=7, loc="upper left")
    ax.set_title(title, fontsize=9)
    save(fig, path)


def head_panel(heads: pd.DataFrame, phases: pd.DataFrame, ko: pd.DataFrame | None, path: Path, title: str) -> None:
    """Per KV head (rows): static concentration of its key gate | key and value (shifted back one offset)
    gate scores by phase relative to uniform | knockout effect by phase. DeepSeek-V4: an indexer column
    (its CSA layers only); layers of different strides share the phase axis up to the largest."""
    key = heads[heads["branch"] == "key"].sort_values(["layer", "kv_head"])
    rows = list(zip(key["layer"], key["kv_head"], strict=True))
    W, S = int(key["window"].max()), int(key["stride"].max())
    overlap = bool((key["window"] > key["stride"]).any())  # static_phase = static where W = S
    conc_col, conc_max = ("static_phase", S) if overlap else ("static", W)
    branches = [b for b in ("key", "value", "indexer") if (phases["branch"] == b).any()]
    ncol = 1 + len(branches) + (ko is not None)
    fig, axes = plt.subplots(1, ncol, figsize=(1.4 + 0.35 * S * (ncol - 1) + 1.0, 1.0 + 0.3 * max(len(rows), 3)),
                             gridspec_kw={"width_ratios": [1.2] + [S] * (ncol - 1)}, squeeze=False)
    axes = axes[0]
    labels = [f"L{layer}·KV{kv}" for layer, kv in rows]
    conc = key[conc_col].to_numpy()[:, None]
    axes[0].imshow(conc, cmap="magma", vmin=1, vmax=conc_max, aspect="auto")
    for i, v in enumerate(conc[:, 0]):
        axes[0].text(0, i, f"{v:.1f}", ha="center", va="center", fontsize=7, color="white" if v < conc_max / 2 else "black")
    axes[0].set_yticks(range(len(rows)), labels, fontsize=7)
    axes[0].set_xticks([])
    axes[0].set_title(f"static\n(1..{conc_max}{' phases' if overlap else ''})", fontsize=8)
    lim = np.log2(W)
    for ax, b in zip(axes[1:], branches, strict=False):
        p = phases[phases["branch"] == b].pivot_table(index=["layer", "kv_head"], columns="phase", values="score_rel")
        mat = np.log2(np.maximum(p.reindex(index=rows, columns=range(S)).to_numpy(dtype=float), 1e-9))
        im = ax.imshow(np.clip(mat, -lim, lim), cmap=SCORE_CMAP, vmin=-lim, vmax=lim, aspect="auto")
        ax.set_yticks([])
        ax.set_xticks(range(S), [str(s) for s in range(S)], fontsize=7)
        ax.set_xlabel("phase")
        ax.set_title(f"{b} gate{' (shifted −1)' if b == 'value' else ''}", fontsize=8)
    cb = fig.colorbar(im, ax=list(axes[1:1 + len(branches)]), shrink=0.8, location="bottom", aspect=30)
    cb.set_label("gate score / uniform (log2; 0 = uniform)", fontsize=7)
    if ko is not None:
        t = ko[(ko["grouping"] == "phase") & (ko["kv_head"] >= 0)]
        mat = t.pivot_table(index=["layer", "kv_head"], columns="group", values="rel_change", dropna=False)
        mat = mat.reindex(index=rows, columns=range(S)).to_numpy(dtype=float)
        im2 = axes[-1].imshow(np.clip(100 * mat, -100, 100), cmap=KO_CMAP, vmin=-100, vmax=100, aspect="auto")
        axes[-1].set_yticks([])
        axes[-1].set_xticks(range(S), [str(s) for s in range(S)], fontsize=7)
        axes[-1].set_xlabel("phase")
        axes[-1].set_title("knockout", fontsize=8)
        cb2 = fig.colorbar(im2, ax=axes[-1], shrink=0.8, location="bottom", aspect=15)
        cb2.set_label("rel. change (%)", fontsize=7)
    fig.suptitle(title, fontsize=9, y=1.0 + 0.35 / fig.get_figheight())
    save(fig, path)


def cycling_figure(profiles: pd.DataFrame, path: Path, title: str, boundary: int) -> None:
    """Per delta: observed accuracy by phase after the cycle (solid, 95% band), predicted (dashed), uncycled
    (gray); last panel: predicted vs observed change, boundary phase hollow."""
    deltas = sorted(d for d in profiles["delta"].unique() if d != 0)
    n = len(deltas) + 1
    fig, axes = plt.subplots(1, n, figsize=(2.3 * n, 2.6), squeeze=False)
    axes = axes[0]
    cmap = plt.get_cmap("coolwarm")
    span = max(max(abs(d) for d in deltas), 1) if deltas else 1
    for ax, d in zip(axes[:-1], deltas, strict=True):
        p = profiles[profiles["delta"] == d].sort_values("phase")
        x = p["phase"].to_numpy()
        ax.plot(x, 100 * p["acc0"], color="gray", lw=1, label="uncycled")
        ax.plot(x, 100 * p["pred"], "--", color="black", lw=1, label="predicted")
        ax.plot(x, 100 * p["acc"], "-o", color=cmap(0.5 + 0.5 * d / span), ms=3, label="observed")
        ax.fill_between(x, 100 * p["lo"], 100 * p["hi"], color=cmap(0.5 + 0.5 * d / span), alpha=0.25)
        ax.set_title(f"δ = {d:+d}  R² = {p['r2'].iloc[0]:.2f}", fontsize=8)
        ax.set_xlabel("phase")
        top = 100 * float(np.nanmax(profiles[["acc0", "acc", "hi"]].to_numpy())) if len(profiles) else 100
        ax.set_ylim(0, min(102, max(10.0, 1.15 * top)))  # shared scale, zoomed in for weak models
    axes[0].set_ylabel("accuracy (%)")
    if deltas:
        axes[0].legend(fontsize=6)
    ax = axes[-1]
    for d in deltas:
        p = profiles[profiles["delta"] == d]
        pred, obs = 100 * (p["pred"] - p["acc0"]), 100 * (p["acc"] - p["acc0"])
        inner = p["phase"] != boundary
        c = cmap(0.5 + 0.5 * d / span)
        ax.scatter(pred[inner], obs[inner], color=c, s=14, label=f"{d:+d}")
        ax.scatter(pred[~inner], obs[~inner], facecolors="none", edgecolors=c, s=14)
    lim = max(5.0, float(np.nanmax(np.abs(100 * (profiles["acc"] - profiles["acc0"]))))) if len(profiles) else 5
    ax.plot([-lim, lim], [-lim, lim], ":", color="gray")
    ax.set_xlabel("predicted change (pp)")
    ax.set_ylabel("observed change (pp)")
    ax.legend(fontsize=6, title="δ", title_fontsize=6)
    fig.suptitle(title + f"  (hollow: boundary phase {boundary})", fontsize=9)
    fig.tight_layout()
    save(fig, path)


def r2_grid(grid: pd.DataFrame, path: Path) -> None:
    """R^2 excluding the boundary phase for every model (rows) and delta (columns), with 95% intervals."""
    models = list(dict.fromkeys(grid["model"]))
    deltas = sorted(grid["delta"].unique())
    mat = grid.pivot_table(index="model", columns="delta", values="r2", dropna=False).reindex(index=models, columns=deltas)
    fig, ax = plt.subplots(figsize=(1.5 + 0.9 * len(deltas), 0.9 + 0.45 * len(models)))
    im = ax.imshow(mat.to_numpy(dtype=float), cmap="viridis", vmin=0, vmax=1, aspect="auto")
    for i, m in enumerate(models):
        for j, d in enumerate(deltas):
            r = grid[(grid["model"] == m) & (grid["delta"] == d)]
            if len(r):
                r = r.iloc[0]
                ax.text(j, i, f"{r['r2']:.2f}\n[{r['r2_lo']:.2f}, {r['r2_hi']:.2f}]", ha="center", va="center",
                        fontsize=6, color="white" if not r["r2"] > 0.5 else "black")
    ax.set_xticks(range(len(deltas)), [f"{d:+d}" for d in deltas])
    ax.set_yticks(range(len(models)), models, fontsize=7)
    ax.set_xlabel("δ")
    fig.colorbar(im, ax=ax, label="R² excluding the boundary phase")
    save(fig, path)
