"""Interactive figures of the report as plain plotly figure dicts ({"data": [...], "layout": {...}}).

Every trace that belongs to a model carries `meta = {"model": alias, "color": ..., "fill": ...}`; the report's
model selector uses it to grey out the other models. Figures whose dashed period boundaries depend on the
selected model keep them per model in `layout.meta.boundaries`.
"""

from __future__ import annotations

import numpy as np

from phasekv.report import tables
from phasekv.report.load import Stage, Study

GREY = "#9a9a9a"
GREENS = [[0.0, "#f7fcf5"], [0.5, "#74c476"], [1.0, "#00441b"]]  # light = low R², dark = high
RDBU = [[0.0, "#b2182b"], [0.25, "#ef8a62"], [0.5, "#f7f7f7"], [0.75, "#67a9cf"], [1.0, "#2166ac"]]  # red = lost
BASE_LAYOUT = {
    "template": "plotly_white", "margin": {"l": 60, "r": 20, "t": 40, "b": 50}, "height": 420,
    "legend": {"orientation": "h", "y": -0.2}, "hovermode": "closest",
}


def rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i: i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


def _meta(alias: str, color: str) -> dict:
    return {"model": alias, "color": color, "fill": rgba(color, 0.15)}


def _layout(title: str, x: str, y: str, **kw) -> dict:
    out = {**BASE_LAYOUT, "title": {"text": title, "font": {"size": 14}}, "xaxis": {"title": {"text": x}},
           "yaxis": {"title": {"text": y}}, **kw}
    out["yaxis"] = {"automargin": True, **out["yaxis"]}
    return out


def _vline(x: float, color: str = GREY, dash: str = "dash", yref: str = "paper") -> dict:
    return {"type": "line", "x0": x, "x1": x, "y0": 0, "y1": 1, "yref": yref, "xref": "x",
            "line": {"color": color, "dash": dash, "width": 1}}


def boundaries(stride: int, modulus: int) -> list[dict]:
    """Dashed lines between consecutive stride periods of a residue axis 0..M-1."""
    return [_vline(k * stride - 0.5) for k in range(1, modulus // stride)] if stride else []


def _band(x, lo, hi, alias: str, color: str, name: str) -> list[dict]:
    meta = _meta(alias, color)
    return [
        {"type": "scatter", "x": x, "y": hi, "mode": "lines", "line": {"width": 0}, "hoverinfo": "skip",
         "showlegend": False, "legendgroup": alias, "meta": meta | {"role": "band-edge"}},
        {"type": "scatter", "x": x, "y": lo, "mode": "lines", "line": {"width": 0}, "fill": "tonexty",
         "fillcolor": meta["fill"], "hoverinfo": "skip", "showlegend": False, "legendgroup": alias,
         "meta": meta | {"role": "band"}, "name": f"{name} 95% interval"},
    ]


def residue_figure(study: Study, stages: dict[str, Stage], padding: str, colors: dict[str, str]) -> dict:
    """Accuracy by residue per model with 95% bands; the selected model's period boundaries dashed."""
    data, bounds, modulus = [], {}, 24
    for alias, stage in stages.items():
        m, p = study.models[alias], tables.profile(stage)
        modulus = int(stage.summary.get("modulus", len(p)))
        x = p.residue.tolist()
        data += _band(x, p.lo.tolist(), p.hi.tolist(), alias, colors[alias], m.name)
        data.append({"type": "scatter", "x": x, "y": p.acc.tolist(), "mode": "lines+markers", "name": m.name,
                     "legendgroup": alias, "line": {"color": colors[alias], "width": 2}, "marker": {"size": 5},
                     "meta": _meta(alias, colors[alias]),
                     "hovertemplate": f"{m.name}<br>residue %{{x}}: %{{y:.1f}}%<extra></extra>"})
        bounds[alias] = boundaries(m.stride, modulus)
    layout = _layout(f"Accuracy by target-key position mod {modulus} ({padding} padding)",
                     f"target-key position mod {modulus}", "accuracy (%)",
                     yaxis={"title": {"text": "accuracy (%)"}, "range": [-2, 102]}, meta={"boundaries": bounds})
    layout["xaxis"]["dtick"] = 1 if modulus <= 24 else None
    return {"data": data, "layout": layout}


def fold_figure(study: Study, stages: dict[str, Stage], padding: str, colors: dict[str, str]) -> dict:
    """Each compressed model's residue profile folded to one stride: the first period solid, later dashed."""
    data = []
    for alias, stage in stages.items():
        m = study.models[alias]
        if not m.compressed:
            continue
        p = tables.profile(stage)
        S = m.stride
        for k in range(len(p) // S):
            seg = p.iloc[k * S: (k + 1) * S]
            data.append({"type": "scatter", "x": list(range(S)), "y": seg.acc.tolist(), "mode": "lines+markers",
                         "name": m.name, "legendgroup": alias, "showlegend": k == 0,
                         "line": {"color": colors[alias], "dash": "solid" if k == 0 else "dash", "width": 1.5},
                         "marker": {"size": 4}, "meta": _meta(alias, colors[alias]),
                         "hovertemplate": f"{m.name}<br>period {k}, phase %{{x}}: %{{y:.1f}}%<extra></extra>"})
    return {"data": data, "layout": _layout(f"Fold view: periods overlaid ({padding} padding)",
                                            "phase (position mod S)", "accuracy (%)")}


def training_figure(study: Study, colors: dict[str, str]) -> dict | None:
    data = []
    for alias, m in study.models.items():
        d = m.metrics
        if d is None or "step" not in d:
            continue
        if "loss" in d:
            t = d.dropna(subset=["loss"])
            data.append({"type": "scatter", "x": t.step.tolist(), "y": t.loss.tolist(), "mode": "lines",
                         "name": m.name, "legendgroup": alias, "line": {"color": colors[alias], "width": 1.5},
                         "meta": _meta(alias, colors[alias])})
        if "val_loss" in d:
            v = d.dropna(subset=["val_loss"])
            data.append({"type": "scatter", "x": v.step.tolist(), "y": v.val_loss.tolist(), "mode": "markers",
                         "name": f"{m.name} (validation)", "legendgroup": alias, "showlegend": False,
                         "marker": {"color": colors[alias], "symbol": "diamond", "size": 8},
                         "meta": _meta(alias, colors[alias])})
    if not data:
        return None
    return {"data": data, "layout": _layout("Training loss (lines) and validation loss (diamonds)", "step",
                                            "loss (nats/token)", yaxis={"type": "log", "title": {"text": "loss"}})}


def flip_figure(study: Study, colors: dict[str, str]) -> dict | None:
    """P(first candidate) against filler length, one line per (model, family); dashed lines every S tokens
    of the selected model."""
    data, bounds = [], {}
    dashes = ["solid", "dot", "dash", "longdash", "dashdot"]
    for alias, stage in study.flip.items():
        m = study.models[alias]
        d = tables.flip_table(stage)
        first = stage.summary.get("candidates", [d.candidate.iloc[0]])[0]
        for i, (fam, g) in enumerate(d[d.candidate == first].groupby("family", sort=False)):
            data.append({"type": "scatter", "x": g.length.tolist(), "y": g.prob.tolist(), "mode": "lines+markers",
                         "name": f"{m.name} · {fam}", "legendgroup": alias,
                         "line": {"color": colors[alias], "dash": dashes[i % len(dashes)], "width": 1.5},
                         "marker": {"size": 4}, "meta": _meta(alias, colors[alias]),
                         "hovertemplate": f"{m.name} · {fam}<br>length %{{x}}: P({first}) = %{{y:.3f}}<extra></extra>"})
        lengths = d.length.unique()
        if m.stride:
            bounds[alias] = [_vline(x - 0.5) for x in range(int(lengths.min()), int(lengths.max()) + 1)
                             if x % m.stride == 0 and x > lengths.min()]
    if not data:
        return None
    return {"data": data, "layout": _layout("Filler sweep: probability of the first candidate by filler length",
                                            "filler length (tokens)", "probability", meta={"boundaries": bounds})}


def knockout_figure(stage: Stage, name: str, stride: int) -> dict:
    """Heatmaps of relative accuracy change: all residues (left) and folded mod S (right)."""
    rows, cols, z = tables.knockout_matrix(stage, stride, folded=False)
    folded = tables.knockout_matrix(stage, stride, folded=True) if stride else None
    data = [{"type": "heatmap", "z": z.tolist(), "x": cols, "y": rows, "zmin": -100, "zmax": 100,
             "colorscale": RDBU, "colorbar": {"title": {"text": "Δ acc (%)"}, "len": 0.9},
             "hovertemplate": "%{y}, residue %{x}: %{z:.0f}%<extra></extra>"}]
    layout = _layout(f"Knockout map · {name}", "target-key position mod M", "KV head knocked out",
                     height=max(220, 60 + 40 * len(rows)))
    if folded is not None:
        rows_f, cols_f, zf = folded
        data.append({"type": "heatmap", "z": zf.tolist(), "x": cols_f, "y": rows_f, "zmin": -100, "zmax": 100,
                     "colorscale": RDBU, "showscale": False, "xaxis": "x2", "yaxis": "y2",
                     "hovertemplate": "%{y}, phase %{x}: %{z:.0f}%<extra></extra>"})
        layout["xaxis"] = {"domain": [0, 0.68], "title": {"text": "target-key position mod M"}}
        layout["xaxis2"] = {"domain": [0.75, 1.0], "title": {"text": f"folded: position mod {stride}"}}
        layout["yaxis2"] = {"anchor": "x2", "showticklabels": False, "matches": "y"}
    return {"data": data, "layout": layout}


def gate_plane_figure(study: Study, colors: dict[str, str]) -> dict | None:
    """Static vs per-window effective number of offsets per key gate, with training paths from step 1
    (open circle) to the end (filled); the diagonal and the right edge x = W dashed."""
    data, widths = [], set()
    for alias, stage in study.analyses.get("gates", {}).items():
        m = study.models[alias]
        if m.gate == "uniform" or stage.results is None or "static" not in stage.results:
            continue
        widths.add(m.window)  # offset-level effective numbers lie in [1, W]
        meta = _meta(alias, colors[alias])
        path = tables.gate_path(m)
        if path is not None:
            for (layer, kv), g in path.groupby(["layer", "kv_head"]):
                data.append({"type": "scatter", "x": g.static.tolist(), "y": g.per_window.tolist(), "mode": "lines",
                             "line": {"color": colors[alias], "width": 1}, "opacity": 0.6, "legendgroup": alias,
                             "showlegend": False, "meta": meta, "hoverinfo": "skip"})
                data.append({"type": "scatter", "x": g.static.iloc[:1].tolist(), "y": g.per_window.iloc[:1].tolist(),
                             "mode": "markers", "marker": {"symbol": "circle-open", "size": 8, "color": colors[alias]},
                             "legendgroup": alias, "showlegend": False, "meta": meta,
                             "hovertemplate": f"{m.name} layer {layer} KV {kv}, step {int(g.step.iloc[0])}<extra></extra>"})
        pts = tables.gate_points(stage)
        data.append({"type": "scatter", "x": pts.static.tolist(), "y": pts.per_window.tolist(), "mode": "markers",
                     "name": m.name, "legendgroup": alias, "marker": {"size": 10, "color": colors[alias]},
                     "meta": meta, "text": [f"layer {a} · KV {b}" for a, b in zip(pts.layer, pts.kv_head, strict=True)],
                     "hovertemplate": f"{m.name} %{{text}}<br>static %{{x:.2f}}, per-window %{{y:.2f}}<extra></extra>"})
    if not data:
        return None
    top = max(widths)
    shapes = [{"type": "line", "x0": 1, "y0": 1, "x1": top, "y1": top, "line": {"color": GREY, "dash": "dash"}}]
    shapes += [{"type": "line", "x0": w, "x1": w, "y0": 1, "y1": w, "line": {"color": GREY, "dash": "dot"}} for w in widths]
    return {"data": data, "layout": _layout(
        "Gate concentration plane (key gates) with training paths", "static exp(H(E[α]))",
        "per-window E[exp(H(α))]", shapes=shapes, xaxis={"title": {"text": "static exp(H(E[α]))"}, "range": [0.8, top + 0.3]},
        yaxis={"title": {"text": "per-window E[exp(H(α))]"}, "range": [0.8, top + 0.3]})}


def alignment_figure(study: Study, alias: str) -> dict | None:
    """Per KV head: key gate static concentration, key and value gate scores by phase (value shifted back
    one offset), and the knockout effect by phase, side by side."""
    m = study.models[alias]
    gates, ko = study.analyses.get("gates", {}).get(alias), study.analyses.get("knockout", {}).get(alias)
    if gates is None or gates.results is None or m.gate == "uniform":
        return None
    pts = tables.gate_points(gates)
    labels = [tables.head_label(a, b, int(pts.kv_head.max()) + 1) for a, b in zip(pts.layer, pts.kv_head, strict=True)]
    data = [{"type": "bar", "orientation": "h", "x": pts.static.tolist(), "y": labels, "marker": {"color": "#555"},
             "name": "static concentration", "showlegend": False, "xaxis": "x", "yaxis": "y",
             "hovertemplate": "%{y}: %{x:.2f} offsets<extra></extra>"}]
    layout = _layout(f"Gate preferences and knockout losses · {m.name}", "", "",
                     height=max(240, 80 + 45 * len(labels)), yaxis={"autorange": "reversed"})
    layout["xaxis"] = {"domain": [0, 0.2], "title": {"text": "static conc."}, "range": [1, max(m.window, 1)]}
    panels = []
    for branch in ("key", "value"):
        sc = tables.gate_scores(gates, branch)
        if sc is not None:
            panels.append((f"{branch} gate score / uniform", sc, [0.0, 2.0], "Viridis"))
    folded = tables.knockout_matrix(ko, m.stride, folded=True) if ko is not None and ko.results is not None else None
    if folded is not None:
        panels.append(("knockout Δ acc (%)", folded, [-100, 100], RDBU))
    width = 0.78 / max(len(panels), 1)
    for i, (title, (rows, cols, z), (lo, hi), scale) in enumerate(panels):
        ax = i + 2
        x0 = 0.22 + i * width
        layout[f"xaxis{ax}"] = {"domain": [x0, x0 + width - 0.02], "title": {"text": title}, "dtick": 1}
        layout[f"yaxis{ax}"] = {"anchor": f"x{ax}", "matches": "y", "showticklabels": False}
        data.append({"type": "heatmap", "z": np.asarray(z).tolist(), "x": cols, "y": rows, "zmin": lo, "zmax": hi,
                     "colorscale": scale, "showscale": False, "xaxis": f"x{ax}", "yaxis": f"y{ax}",
                     "hovertemplate": f"%{{y}}, phase %{{x}}: %{{z:.2f}} ({title})<extra></extra>"})
    return {"data": data, "layout": layout}


def cycle_figure(study: Study, alias: str, colors: dict[str, str]) -> dict | None:
    """Observed accuracy by phase after cycling the gates by delta (solid) and the prediction A_0((r-δ) mod S)
    (dashed); the uncycled model in grey."""
    stage = study.analyses.get("cycle", {}).get(alias)
    if stage is None or stage.results is None:
        return None
    m, d = study.models[alias], tables.cycle_profiles(stage)
    data = []
    deltas = sorted(int(x) for x in d.delta.unique())
    palette = ["#1b9e77", "#d95f02", "#7570b3", "#e7298a", "#66a61e", "#e6ab02", "#a6761d"]
    for i, delta in enumerate(deltas):
        g = d[d.delta == delta].sort_values("phase")
        if delta == 0:
            data.append({"type": "scatter", "x": g.phase.tolist(), "y": g.acc.tolist(), "mode": "lines+markers",
                         "name": "δ = 0 (uncycled)", "line": {"color": GREY, "width": 3}})
            continue
        c = palette[i % len(palette)]
        data.append({"type": "scatter", "x": g.phase.tolist(), "y": g.hi.tolist(), "mode": "lines",
                     "line": {"width": 0}, "hoverinfo": "skip", "showlegend": False, "legendgroup": str(delta)})
        data.append({"type": "scatter", "x": g.phase.tolist(), "y": g.lo.tolist(), "mode": "lines",
                     "line": {"width": 0}, "fill": "tonexty", "fillcolor": rgba(c, 0.12), "hoverinfo": "skip",
                     "showlegend": False, "legendgroup": str(delta)})
        data.append({"type": "scatter", "x": g.phase.tolist(), "y": g.acc.tolist(), "mode": "lines+markers",
                     "name": f"δ = {delta:+d} observed", "line": {"color": c}, "legendgroup": str(delta)})
        data.append({"type": "scatter", "x": g.phase.tolist(), "y": g.pred.tolist(), "mode": "lines",
                     "name": f"δ = {delta:+d} predicted", "line": {"color": c, "dash": "dash"},
                     "legendgroup": str(delta), "showlegend": False})
    shapes = [_vline(m.stride - 1, color="#b2182b", dash="dot")]
    return {"data": data, "layout": _layout(f"Gate cycling · {m.name} (dotted red: boundary phase S-1)",
                                            "phase (position mod S)", "accuracy (%)", shapes=shapes)}


def r2_figure(study: Study) -> dict | None:
    matrix = tables.r2_matrix(study)
    if matrix is None:
        return None
    aliases, deltas, z = matrix
    names = [study.models[a].name if a in study.models else a for a in aliases]
    text = [["" if np.isnan(v) else f"{v:.2f}" for v in row] for row in z]
    return {"data": [{"type": "heatmap", "z": z.tolist(), "x": [f"{d:+d}" for d in deltas], "y": names, "zmin": 0,
                      "zmax": 1, "colorscale": GREENS, "text": text, "texttemplate": "%{text}",
                      "hovertemplate": "%{y}, δ = %{x}: R² = %{z:.2f}<extra></extra>"}],
            "layout": _layout("Gate cycling R² (observed vs predicted change, boundary phase excluded)", "δ",
                              "", height=max(200, 90 + 50 * len(aliases)),
                              xaxis={"title": {"text": "δ"}, "type": "category"})}
