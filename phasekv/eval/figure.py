"""Figures as data: a backend-neutral spec (panels of traces and guide lines) and its two renderers.

Each figure of phasekv is built once, from a tidy table, as a `Figure`; `to_png` draws it with matplotlib
(the PNG beside every result and in the report's figures/), `to_plotly` turns it into a plotly figure dict
(the report's interactive version). Traces that belong to a model carry its alias: the report's model
selector greys out the others, and a `facet` panel is drawn on paper as one small panel per model (the
`reference` model dashed grey in each), in the browser as one panel with the selector.

    fig = Figure([Panel([Trace("line", x, y, name="W8/S8", color="#d62728")], xlabel="residue")], "title")
    to_png(fig, "accuracy.png"); spec = to_plotly(fig)

This sits in `phasekv.eval`, the lowest layer that draws figures; matplotlib and plotly are imported by
the renderers only, so building a spec costs nothing at start-up.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from phasekv.io import write_figure

DPI = 130  # every PNG figure
GREY = "#9a9a9a"
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#bcbd22"]
SCALES = {  # colour scales as (position, colour) stops, shared by both renderers
    "lost_gained": [(0.0, "#b2182b"), (0.25, "#ef8a62"), (0.5, "#f7f7f7"), (0.75, "#67a9cf"), (1.0, "#2166ac")],
    "greens": [(0.0, "#f7fcf5"), (0.5, "#74c476"), (1.0, "#00441b")],  # light = low, dark = high
    "viridis": [(0.0, "#440154"), (0.25, "#3b528b"), (0.5, "#21918c"), (0.75, "#5ec962"), (1.0, "#fde725")],
}
DASHES = {"solid": "-", "dash": "--", "dot": ":", "dashdot": "-.", "longdash": (0, (8, 3))}
MARKERS = {"circle": "o", "circle-open": "o", "diamond": "D", "triangle-up": "^", None: ""}


@dataclass
class Trace:
    """One drawn element: kind "line" (with optional markers), "band" (between y and y2), "points",
    "heatmap" (z: rows y x columns x) or "hbar" (horizontal bars of length x at categories y)."""

    kind: str
    x: list = field(default_factory=list)
    y: list = field(default_factory=list)
    y2: list | None = None  # band: the upper edge
    z: list | None = None  # heatmap: values, rows x columns
    name: str | None = None  # legend entry (None: none)
    label: str | None = None  # its legend entry on paper, e.g. without the model a small panel shows (None: name)
    color: str = PALETTE[0]
    dash: str = "solid"  # a key of DASHES
    width: float = 1.5  # line width (points)
    marker: str | None = None  # a key of MARKERS
    size: float = 4.0  # marker size (points)
    alpha: float = 1.0  # opacity (bands: of the fill)
    model: str | None = None  # alias of the model it shows (the selector, facets)
    hover: str | None = None  # plotly hovertemplate
    text: list | None = None  # heatmap cell labels (rows x columns; "\n" breaks a line) or point labels (hover)
    annotate: bool = False  # points: also write their labels beside them (PNG)
    scale: str = "viridis"  # heatmap colour scale (a key of SCALES)
    zrange: tuple[float, float] | None = None
    colorbar: str | None = None  # colour bar title (None: no colour bar)


@dataclass
class Guide:
    """A reference line: vertical at x, horizontal at y, or a segment (x, y) -> (x1, y1)."""

    x: float | None = None
    y: float | None = None
    x1: float | None = None
    y1: float | None = None
    color: str = GREY
    dash: str = "dash"
    width: float = 0.8
    name: str | None = None  # legend entry (PNG)


@dataclass
class Panel:
    traces: list[Trace]
    title: str | None = None
    xlabel: str = ""
    ylabel: str = ""
    xlim: tuple[float, float] | None = None
    ylim: tuple[float, float] | None = None
    ylog: bool = False
    xticks: list | None = None  # tick positions (None: automatic; heatmaps: every column)
    guides: list[Guide] = field(default_factory=list)
    width: float = 1.0  # relative width in the row of panels
    legend: bool = False
    facet: bool = False  # on paper: one small panel per model (traces grouped by `model`)
    facet_cols: int | None = 3  # small panels per row (None: all in one row)
    facet_titles: dict[str, str] = field(default_factory=dict)  # alias -> title of its small panel
    reference: str | None = None  # alias drawn dashed grey in every other small panel
    model_guides: dict[str, list[Guide]] = field(default_factory=dict)  # alias -> guides of that model only


@dataclass
class Figure:
    panels: list[Panel]
    title: str = ""
    size: tuple[float, float] = (6.5, 3.8)  # PNG inches (a facet panel: of one small panel)
    height: int = 420  # plotly pixels


def rgba(color: str, alpha: float) -> str:
    h = color.lstrip("#")
    r, g, b = (int(h[i: i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


# ---------------------------------------------------------------- matplotlib


def to_png(fig: Figure, path: str | Path) -> Path:
    """Draw `fig` with matplotlib and write it atomically; returns the path."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    axes_panels = _png_axes(fig, plt)
    for ax, panel, alias in axes_panels:
        _png_panel(ax, panel, alias)
    mfig = axes_panels[0][0].figure
    if fig.title:
        mfig.suptitle(fig.title, fontsize=9.5)
    try:
        return write_figure(path, mfig, dpi=DPI, bbox_inches="tight")
    finally:
        plt.close(mfig)


def _png_axes(fig: Figure, plt) -> list[tuple]:
    """(axes, panel, alias of a small panel or None) for every panel; a facet panel becomes a grid."""
    facet = next((p for p in fig.panels if p.facet), None)
    if facet is not None:
        aliases = list(dict.fromkeys(t.model for t in facet.traces if t.model is not None))
        cols = min(facet.facet_cols or len(aliases), max(len(aliases), 1))
        rows = (len(aliases) + cols - 1) // cols
        w, h = fig.size
        mfig, axes = plt.subplots(rows, cols, figsize=(w * cols, h * rows), squeeze=False, sharey=True,
                                  layout="constrained")
        for ax in list(axes.flat)[len(aliases):]:
            ax.axis("off")
        return [(ax, facet, a) for ax, a in zip(axes.flat, aliases, strict=False)]
    mfig, axes = plt.subplots(1, len(fig.panels), figsize=fig.size, squeeze=False, layout="constrained",
                              gridspec_kw={"width_ratios": [p.width for p in fig.panels]})
    return [(ax, p, None) for ax, p in zip(axes[0], fig.panels, strict=True)]


def _png_panel(ax, panel: Panel, alias: str | None) -> None:
    from matplotlib.ticker import MaxNLocator

    traces = panel.traces if alias is None else [t for t in panel.traces if t.model == alias]
    if alias is not None and panel.reference not in (None, alias):
        traces = [_as_reference(t) for t in panel.traces if t.model == panel.reference and t.kind == "line"] + traces
    for t in traces:
        mappable = _PNG[t.kind](ax, t)
        if t.colorbar is not None and mappable is not None:  # right of the whole row of panels
            row = [a for a in ax.figure.axes if a.get_label() != "<colorbar>"]
            ax.figure.colorbar(mappable, ax=row, label=t.colorbar, shrink=0.8)
    first_col = ax.get_subplotspec().colspan.start == 0
    if not first_col and any(t.kind == "heatmap" for t in traces):
        ax.set_yticks([])  # rows shared with the panel on the left
    guides = panel.guides + (panel.model_guides.get(alias, []) if alias is not None else
                             [g for gs in panel.model_guides.values() for g in gs])
    for g in guides:
        _png_guide(ax, g)
    title = panel.facet_titles.get(alias, panel.title) if alias is not None else panel.title
    if title:
        ax.set_title(title, fontsize=8)
    if panel.xlabel:
        ax.set_xlabel(panel.xlabel, fontsize=8)
    if panel.ylabel and (alias is None or first_col):
        ax.set_ylabel(panel.ylabel, fontsize=8)
    if panel.ylog:
        ax.set_yscale("log")
    if panel.xlim:
        ax.set_xlim(*panel.xlim)
    if panel.ylim:
        ax.set_ylim(*panel.ylim)
    if panel.xticks is not None:
        ax.set_xticks(panel.xticks)
    elif (xs := [v for t in traces if t.kind in ("line", "points") for v in t.x]) and all(
            float(v).is_integer() for v in xs):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # positions, phases, steps
    if panel.legend and (any(t.name for t in traces) or any(g.name for g in guides)):
        ax.legend(fontsize=6.5)


def _as_reference(t: Trace) -> Trace:
    return Trace("line", t.x, t.y, name=t.name, color="grey", dash="dash", width=1.0)


def _png_line(ax, t: Trace):
    ax.plot(t.x, t.y, color=t.color, ls=DASHES[t.dash], lw=t.width, marker=MARKERS[t.marker], ms=t.size,
            alpha=t.alpha, label=t.label or t.name, mfc="none" if t.marker == "circle-open" else t.color)


def _png_band(ax, t: Trace):
    ax.fill_between(t.x, t.y, t.y2, color=t.color, alpha=t.alpha, lw=0)


def _png_points(ax, t: Trace):
    ax.plot(t.x, t.y, ls="none", marker=MARKERS[t.marker] or "o", ms=t.size, color=t.color, alpha=t.alpha,
            mfc="none" if t.marker == "circle-open" else t.color, label=t.name, clip_on=False)
    for x, y, s in zip(t.x, t.y, t.text if t.annotate else [], strict=False):
        ax.annotate(s, (x, y), fontsize=6, xytext=(3, -8), textcoords="offset points")


def _png_heatmap(ax, t: Trace):
    import numpy as np
    from matplotlib.colors import LinearSegmentedColormap

    z = np.asarray(t.z, dtype=float)
    lo, hi = t.zrange or (np.nanmin(z), np.nanmax(z))
    cmap = LinearSegmentedColormap.from_list(t.scale, SCALES[t.scale])
    im = ax.imshow(z, cmap=cmap, vmin=lo, vmax=hi, aspect="auto")
    ax.set_xticks(range(len(t.x)), [str(v) for v in t.x], fontsize=6.5)
    ax.set_yticks(range(len(t.y)), [str(v) for v in t.y], fontsize=7)
    for i, row in enumerate(t.text or []):
        for j, s in enumerate(row):
            r, g, b, _ = cmap((z[i, j] - lo) / ((hi - lo) or 1))
            dark = 0.299 * r + 0.587 * g + 0.114 * b < 0.5  # white text on dark cells
            ax.text(j, i, s, ha="center", va="center", fontsize=6.5, color="white" if dark else "black")
    return im


def _png_hbar(ax, t: Trace):
    ax.barh(range(len(t.y)), t.x, color=t.color)
    ax.set_yticks(range(len(t.y)), [str(v) for v in t.y], fontsize=7)
    ax.invert_yaxis()


_PNG = {"line": _png_line, "band": _png_band, "points": _png_points, "heatmap": _png_heatmap, "hbar": _png_hbar}


def _png_guide(ax, g: Guide) -> None:
    kw = {"color": g.color, "ls": DASHES[g.dash], "lw": g.width, "label": g.name}
    if g.x1 is not None:
        ax.plot([g.x, g.x1], [g.y, g.y1], **kw)
    elif g.x is not None:
        ax.axvline(g.x, **kw)
    else:
        ax.axhline(g.y, **kw)


# ---------------------------------------------------------------- plotly

BASE_LAYOUT = {
    "template": "plotly_white", "margin": {"l": 60, "r": 20, "t": 40, "b": 50}, "height": 420,
    "legend": {"orientation": "h", "y": -0.2}, "hovermode": "closest",
}


def to_plotly(fig: Figure) -> dict:
    """The plotly figure dict ({"data": [...], "layout": {...}}) of `fig`: panels side by side on one row."""
    data, layout = [], {**BASE_LAYOUT, "height": fig.height, "title": {"text": fig.title, "font": {"size": 14}}}
    total = sum(p.width for p in fig.panels)
    x0, gap = 0.0, 0.05 if len(fig.panels) > 1 else 0.0
    for i, panel in enumerate(fig.panels):
        ax = "" if i == 0 else str(i + 1)
        span = panel.width / total * (1 - gap * (len(fig.panels) - 1))
        for t in panel.traces:
            data += [{**d, "xaxis": f"x{ax}", "yaxis": f"y{ax}"} if ax else d for d in _PLOTLY[t.kind](t)]
        layout[f"xaxis{ax}"], layout[f"yaxis{ax}"] = _plotly_axes(panel, i, (x0, x0 + span), ax)
        x0 += span + gap
        static = [_plotly_guide(g, ax) for g in panel.guides]
        layout.setdefault("shapes", []).extend(static)
        if panel.model_guides:  # the selector shows the selected model's guides ("all": the static ones)
            layout["meta"] = {"boundaries": {"all": static, **{a: static + [_plotly_guide(g, ax) for g in gs]
                                                               for a, gs in panel.model_guides.items()}}}
    if not layout["shapes"]:
        del layout["shapes"]
    return {"data": data, "layout": layout}


def _plotly_axes(panel: Panel, i: int, domain: tuple[float, float], ax: str) -> tuple[dict, dict]:
    kinds = {t.kind for t in panel.traces}
    xaxis = {"title": {"text": panel.xlabel}, "domain": list(domain)}
    yaxis = {"title": {"text": panel.ylabel}, "automargin": True}
    if ax:
        xaxis["anchor"], yaxis["anchor"] = f"y{ax}", f"x{ax}"
    if panel.xlim:
        xaxis["range"] = list(panel.xlim)
    if panel.ylim:
        yaxis["range"] = list(panel.ylim)
    if panel.xticks is not None:
        xaxis["tickvals"] = list(panel.xticks)
    if panel.ylog:
        yaxis["type"] = "log"
    if kinds & {"heatmap", "hbar"}:  # rows of categories: the first on top, as on paper, shared along the row
        yaxis["autorange"] = "reversed"
        if i > 0:
            yaxis.update(matches="y", showticklabels=False)
    if "heatmap" in kinds:
        xaxis["type"] = "category"
    return xaxis, yaxis


def _meta(t: Trace, **extra) -> dict:
    return {"meta": {"model": t.model, "color": t.color, "fill": rgba(t.color, 0.15), **extra},
            "legendgroup": t.model} if t.model else {}


def _plotly_line(t: Trace) -> list[dict]:
    mode = "lines+markers" if t.marker else "lines"
    d = {"type": "scatter", "x": list(t.x), "y": list(t.y), "mode": mode, "name": t.name,
         "showlegend": t.name is not None, "opacity": t.alpha,
         "line": {"color": t.color, "dash": t.dash, "width": round(t.width * 4 / 3, 2)}, **_meta(t)}
    if t.marker:
        d["marker"] = {"size": round(1.6 * t.size), "symbol": t.marker, "color": t.color}
    if t.hover:
        d["hovertemplate"] = t.hover
    return [d]


def _plotly_band(t: Trace) -> list[dict]:
    edge = {"type": "scatter", "x": list(t.x), "mode": "lines", "line": {"width": 0, "color": t.color},
            "hoverinfo": "skip", "showlegend": False}
    return [{**edge, "y": list(t.y2), **_meta(t, role="band-edge")},
            {**edge, "y": list(t.y), "fill": "tonexty", "fillcolor": rgba(t.color, t.alpha), **_meta(t, role="band")}]


def _plotly_points(t: Trace) -> list[dict]:
    d = {"type": "scatter", "x": list(t.x), "y": list(t.y), "mode": "markers", "name": t.name,
         "showlegend": t.name is not None, "opacity": t.alpha,
         "marker": {"size": round(1.6 * t.size), "symbol": t.marker or "circle", "color": t.color}, **_meta(t)}
    if t.text:
        d["text"] = list(t.text)
    if t.hover:
        d["hovertemplate"] = t.hover
    return [d]


def _plotly_heatmap(t: Trace) -> list[dict]:
    d = {"type": "heatmap", "z": t.z, "x": [str(v) for v in t.x], "y": [str(v) for v in t.y],
         "colorscale": [[p, c] for p, c in SCALES[t.scale]], "showscale": t.colorbar is not None}
    if t.zrange:
        d["zmin"], d["zmax"] = t.zrange
    if t.colorbar is not None:
        d["colorbar"] = {"title": {"text": t.colorbar}, "len": 0.9}
    if t.text:
        d["text"] = [[s.replace("\n", "<br>") for s in row] for row in t.text]
        d["texttemplate"] = "%{text}"
    if t.hover:
        d["hovertemplate"] = t.hover
    return [d]


def _plotly_hbar(t: Trace) -> list[dict]:
    return [{"type": "bar", "orientation": "h", "x": list(t.x), "y": [str(v) for v in t.y],
             "marker": {"color": t.color}, "showlegend": False, "hovertemplate": t.hover or "%{y}: %{x:.2f}"}]


_PLOTLY = {"line": _plotly_line, "band": _plotly_band, "points": _plotly_points, "heatmap": _plotly_heatmap,
           "hbar": _plotly_hbar}


def _plotly_guide(g: Guide, ax: str) -> dict:
    line = {"color": g.color, "dash": g.dash, "width": g.width}
    xref, yref = f"x{ax}", f"y{ax}"
    if g.x1 is not None:
        return {"type": "line", "x0": g.x, "y0": g.y, "x1": g.x1, "y1": g.y1, "xref": xref, "yref": yref, "line": line}
    if g.x is not None:
        return {"type": "line", "x0": g.x, "x1": g.x, "y0": 0, "y1": 1, "xref": xref, "yref": "paper", "line": line}
    return {"type": "line", "y0": g.y, "y1": g.y, "x0": 0, "x1": 1, "yref": yref, "xref": "paper", "line": line}
