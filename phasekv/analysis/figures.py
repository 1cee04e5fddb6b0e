"""Figures of the mechanism analyses, each built once from its analysis's tidy table (`phasekv.eval.figure`):
the knockout map, the gate concentration plane with training paths, gate preferences beside knockout losses,
gate cycling and its R² grid. `phasekv analyze` writes them as PNG beside its results; the report draws the
same figures from the same tables, as PNG and interactively.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from phasekv.eval.figure import GREY, PALETTE, Figure, Guide, Panel, Trace, to_png

CYCLE_COLORS = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d"]


def head_label(layer: int, kv_head: int, n_kv: int) -> str:
    """kv_head < 0 marks a whole-layer knockout."""
    return f"layer {layer}" if n_kv <= 1 or kv_head < 0 else f"layer {layer} · KV {kv_head}"


def head_matrix(d: pd.DataFrame, column: str, value: str, heads: list[tuple] | None = None,
                n_kv: int | None = None) -> tuple[list[str], list[int], np.ndarray]:
    """Rows KV heads (layer, kv_head) — `heads` when given, knockout units (layer, kv_head, unit) when `d` has
    a unit column (a layer's compressed-branch knockout beside its whole-layer one) — columns the values of
    `column`, cells `value` (NaN where absent)."""
    n_kv = n_kv or int(d["kv_head"].max()) + 1
    keys = list(zip(d["layer"].astype(int), d["kv_head"].astype(int), *([d["unit"]] if "unit" in d else []),
                    strict=True))
    heads = heads or sorted(set(keys))
    cols = sorted(int(c) for c in d[column].unique())
    z = np.full((len(heads), len(cols)), np.nan)
    hi, ci = {h: i for i, h in enumerate(heads)}, {c: i for i, c in enumerate(cols)}
    for key, c, v in zip(keys, d[column], d[value], strict=True):
        if key in hi:
            z[hi[key], ci[int(c)]] = v
    suffix = [" · compressed" if str(h[-1]).endswith("compressed") else "" for h in heads]
    return [head_label(h[0], h[1], n_kv) + x for h, x in zip(heads, suffix, strict=True)], cols, z


def knockout_matrix(table: pd.DataFrame, grouping: str) -> tuple[list[str], list[int], np.ndarray] | None:
    """Relative accuracy change in percent, clipped at ±100, of each knockout (rows) by residue or phase."""
    d = table[(table["unit"] != "clean") & (table["grouping"] == grouping)]
    if d.empty:
        return None
    rows, cols, z = head_matrix(d, "group", "rel_change")
    return rows, cols, np.clip(100 * z, -100, 100)


def knockout_figure(table: pd.DataFrame, title: str) -> Figure:
    """`phasekv analyze knockout`'s effect table: heads (rows) by target position mod M and, when the stride
    is shorter than M, folded mod S (red lost, blue gained, clipped ±100%)."""
    mods = {g: int(table.loc[table["grouping"] == g, "modulus"].iloc[0]) for g in ("residue", "phase")
            if (table["grouping"] == g).any()}
    panels = []
    for grouping, label, width in (("residue", "target-key position mod {}", 3), ("phase", "folded: position mod {}", 1)):
        m = knockout_matrix(table, grouping) if grouping == "residue" or mods.get("phase", 0) < mods["residue"] else None
        if m is None:
            continue
        rows, cols, z = m
        what = "residue" if grouping == "residue" else "phase"
        panels.append(Panel([Trace("heatmap", cols, rows, z=z.tolist(), scale="lost_gained", zrange=(-100, 100),
                                   colorbar="Δ accuracy (%)" if not panels else None,
                                   hover=f"%{{y}}, {what} %{{x}}: %{{z:.0f}}%<extra></extra>")],
                            xlabel=label.format(mods[grouping]), width=width))
    n = len(panels[0].traces[0].y)
    return Figure(panels, title, size=(9, 0.9 + 0.45 * n), height=max(220, 60 + 40 * n))


def gate_plane_figure(points: pd.DataFrame, paths: pd.DataFrame | None, title: str,
                      colors: dict[str, str] | None = None, traced: list[tuple[int, int]] | None = None) -> Figure:
    """Key gates placed by static (x) and per-window (y) effective numbers of offsets, one colour per model
    (points: model, name, layer, kv_head, static, per_window, window); training paths (paths: model, layer,
    kv_head, step, static, per_window) of the `traced` heads (None: all) from the first snapshot (open circle)
    to the end. Dashed: the diagonal (same scores in every window); dotted: x = W (uniform on average)."""
    colors = colors or {}
    traces, widths = [], sorted({int(w) for w in points["window"]})
    for i, (alias, pts) in enumerate(points.groupby("model", sort=False)):
        name, color = pts["name"].iloc[0], colors.get(alias, PALETTE[i % len(PALETTE)])
        mine = paths[paths["model"] == alias] if paths is not None else pd.DataFrame()
        for (layer, kv), g in (mine.groupby(["layer", "kv_head"]) if len(mine) else []):
            if traced is not None and (int(layer), int(kv)) not in traced:
                continue
            g = g.sort_values("step")
            traces += [Trace("line", g["static"].tolist(), g["per_window"].tolist(), color=color, width=0.8,
                             alpha=0.6, model=alias),
                       Trace("points", g["static"].iloc[:1].tolist(), g["per_window"].iloc[:1].tolist(), color=color,
                             marker="circle-open", size=5, model=alias,
                             hover=f"{name} layer {layer} KV {kv}, step {int(g['step'].iloc[0])}<extra></extra>")]
        labels = [f"layer {a} · KV {b}" for a, b in zip(pts["layer"], pts["kv_head"], strict=True)]
        traces.append(Trace("points", pts["static"].tolist(), pts["per_window"].tolist(), name=name, color=color,
                            size=7, model=alias, text=labels, annotate=points["model"].nunique() == 1,
                            hover=f"{name} %{{text}}<br>static %{{x:.2f}}, per-window %{{y:.2f}}<extra></extra>"))
    top = max(widths)
    guides = [Guide(1, 1, top, top, dash="dash")] + [Guide(w, 1, w, w, dash="dot") for w in widths]
    panel = Panel(traces, xlabel="static exp(H(E[α]))", ylabel="per-window E[exp(H(α))]", xlim=(0.8, top + 0.3),
                  ylim=(0.8, top + 0.3), guides=guides, legend=True)
    return Figure([panel], title, size=(5.2, 5))


def alignment_figure(gates: pd.DataFrame, ko: pd.DataFrame | None, window: int, title: str) -> Figure:
    """Per KV head (rows): the key gate's static concentration, the key and value gate scores by phase
    relative to uniform (value shifted back one offset) and the knockout effect by phase (`ko`: an effect
    table), side by side; a DeepSeek-V4 model's indexer gates too (its CSA layers' rows). gates: rows (layer,
    kv_head, branch, phase, score_rel, static)."""
    key = gates[gates["branch"] == "key"].groupby(["layer", "kv_head"], as_index=False)["static"].first()
    heads, n_kv = list(zip(key["layer"].astype(int), key["kv_head"].astype(int), strict=True)), int(key["kv_head"].max()) + 1
    labels = [head_label(a, b, n_kv) for a, b in heads]
    panels = [Panel([Trace("hbar", key["static"].tolist(), labels, color="#555555",
                           hover="%{y}: %{x:.2f} offsets<extra></extra>")],
                    xlabel="static concentration", xlim=(1, max(window, 2)))]
    for branch in ("key", "value", "indexer"):
        d = gates[gates["branch"] == branch]
        if len(d) and "score_rel" in d:
            _, cols, z = head_matrix(d, "phase", "score_rel", heads, n_kv)
            panels.append(_phase_panel(f"{branch} gate score / uniform", cols, labels, z, "viridis", (0.0, 2.0)))
    folded = _folded_knockout(ko, heads, n_kv) if ko is not None else None
    if folded is not None:
        panels.append(_phase_panel("knockout Δ acc (%)", folded[0], labels, folded[1], "lost_gained", (-100, 100)))
    return Figure(panels, title, size=(3 + 2.6 * (len(panels) - 1), 1 + 0.45 * len(labels)),
                  height=max(240, 80 + 45 * len(labels)))


def _folded_knockout(ko: pd.DataFrame, heads: list[tuple], n_kv: int) -> tuple[list[int], np.ndarray] | None:
    """Knockout Δ accuracy (%) by phase on the gate rows `heads`: per-KV-head knockouts (phasekv), or each
    layer's compressed-branch knockout (DeepSeek-V4: the layer's one compressor)."""
    d = ko[(ko["grouping"] == "phase") & (ko["unit"] != "clean")]
    d = d[d["kv_head"] >= 0] if (d["kv_head"] >= 0).any() else d[d["unit"].str.endswith("compressed")].assign(kv_head=0)
    if d.empty:
        return None
    _, cols, z = head_matrix(d.drop(columns="unit"), "group", "rel_change", heads, n_kv)
    return cols, np.clip(100 * z, -100, 100)


def _phase_panel(title: str, cols, rows, z, scale: str, zrange) -> Panel:
    return Panel([Trace("heatmap", cols, rows, z=np.asarray(z, dtype=float).tolist(), scale=scale, zrange=zrange,
                        hover=f"%{{y}}, phase %{{x}}: %{{z:.2f}} ({title})<extra></extra>")],
                 xlabel=f"phase · {title}", width=1.3)


def cycle_figure(profiles: pd.DataFrame, title: str, boundary: int) -> Figure:
    """Accuracy by phase after cycling the gates by δ (solid, 95% band) against the prediction
    A₀((r − δ) mod S) (dashed), the uncycled model in grey; dotted red: the boundary phase.
    profiles: rows (delta, phase, acc, acc0, pred, lo, hi) in fractions."""
    d = profiles.sort_values(["delta", "phase"])
    traces = []
    for i, delta in enumerate(sorted(int(x) for x in d["delta"].unique())):
        g = d[d["delta"] == delta]
        x = g["phase"].tolist()
        if delta == 0:
            traces.append(Trace("line", x, (100 * g["acc"]).tolist(), name="δ = 0 (uncycled)", color=GREY, width=2.5,
                                marker="circle"))
            continue
        c = CYCLE_COLORS[i % len(CYCLE_COLORS)]
        traces += [Trace("band", x, (100 * g["lo"]).tolist(), (100 * g["hi"]).tolist(), color=c, alpha=0.12),
                   Trace("line", x, (100 * g["acc"]).tolist(), name=f"δ = {delta:+d} observed", color=c,
                         marker="circle", size=3),
                   Trace("line", x, (100 * g["pred"]).tolist(), color=c, dash="dash", width=1)]
    panel = Panel(traces, xlabel="phase (position mod S)", ylabel="accuracy (%)", legend=True,
                  guides=[Guide(x=boundary, color="#b2182b", dash="dot", width=1)])
    return Figure([panel], f"{title} (solid observed, dashed predicted; dotted red: boundary phase {boundary})",
                  size=(6, 3.6))


def r2_figure(grid: pd.DataFrame) -> Figure:
    """Gate cycling R² (boundary phase excluded) of every model (rows) and δ (columns) with its 95% interval.
    grid: rows (label, delta, r2, lo, hi)."""
    labels = list(dict.fromkeys(grid["label"]))
    deltas = sorted(int(d) for d in grid["delta"].unique())
    z = np.full((len(labels), len(deltas)), np.nan)
    text = [[""] * len(deltas) for _ in labels]
    for r in grid.itertuples():
        i, j = labels.index(r.label), deltas.index(int(r.delta))
        if r.r2 is not None and r.r2 == r.r2:
            z[i, j] = r.r2
            text[i][j] = f"{r.r2:.2f}\n[{r.lo:.2f}, {r.hi:.2f}]"
    trace = Trace("heatmap", [f"{d:+d}" for d in deltas], labels, z=z.tolist(), scale="greens", zrange=(0, 1),
                  text=text, colorbar="R²", hover="%{y}, δ = %{x}: R² = %{z:.2f}<extra></extra>")
    return Figure([Panel([trace], xlabel="δ")], "Gate cycling R² (observed vs predicted change, boundary phase excluded)",
                  size=(1.5 + 0.9 * len(deltas), 0.9 + 0.5 * len(labels)), height=max(200, 90 + 50 * len(labels)))


# ---------------------------------------------------------------- the PNGs `phasekv analyze` writes


def knockout_map(table: pd.DataFrame, path: Path, title: str) -> None:
    to_png(knockout_figure(table, title), path)


def concentration_plane(heads: pd.DataFrame, paths: pd.DataFrame | None, path: Path, title: str,
                        trace: list[tuple[int, int]] | None = None) -> None:
    points = heads[heads["branch"] == "key"].assign(model="model", name="key gates at the end")
    paths = paths[paths["branch"] == "key"].assign(model="model") if paths is not None else None
    to_png(gate_plane_figure(points, paths, title, traced=trace), path)


def head_panel(heads: pd.DataFrame, phases: pd.DataFrame, ko: pd.DataFrame | None, path: Path, title: str) -> None:
    gates = phases.merge(heads[["layer", "kv_head", "branch", "static"]], on=["layer", "kv_head", "branch"])
    to_png(alignment_figure(gates, ko, int(heads["window"].max()), title), path)


def cycling_figure(profiles: pd.DataFrame, path: Path, title: str, boundary: int) -> None:
    to_png(cycle_figure(profiles, title, boundary), path)


def r2_grid(grid: pd.DataFrame, path: Path) -> None:
    to_png(r2_figure(grid.rename(columns={"model": "label", "r2_lo": "lo", "r2_hi": "hi"})), path)
