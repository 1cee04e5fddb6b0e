"""The report's figures: the study's tables fed to the one builder of each figure (`phasekv.eval.report`,
`phasekv.analysis.figures`); the training curves and the fold view are the report's own. Every figure is a
`phasekv.eval.figure.Figure`, which the report renders twice: PNG and interactive."""

from __future__ import annotations

import pandas as pd

from phasekv.analysis.figures import (
    alignment_figure,
    cycle_figure,
    gate_plane_figure,
    knockout_figure,
    r2_figure,
)
from phasekv.eval.figure import Figure, Panel, Trace
from phasekv.eval.report import flip_figure, flip_rows, profile_rows, residue_figure
from phasekv.report import tables
from phasekv.report.load import Stage, Study


def profiles(study: Study, stages: dict[str, Stage]) -> pd.DataFrame:
    """Accuracy by residue of every model of one evaluation (`profile_rows`), in display order."""
    return pd.concat([profile_rows(a, study.models[a].name, st.summary, study.models[a].stride)
                      for a, st in stages.items()], ignore_index=True)


def residue(study: Study, stages: dict[str, Stage], padding: str, colors: dict[str, str]) -> Figure:
    """Accuracy by residue; full attention (the first uncompressed model) dashed in every model's panel."""
    base = next((a for a in stages if not study.models[a].compressed), None)
    return residue_figure(profiles(study, stages), padding, colors, reference=base)


def fold(study: Study, stages: dict[str, Stage], padding: str, colors: dict[str, str]) -> Figure | None:
    """Each compressed model's residue profile cut into stride periods and overlaid: first solid, later dashed."""
    comp = {a: st for a, st in stages.items() if study.models[a].compressed}
    if not comp:
        return None
    traces = []
    for alias, p in profiles(study, comp).groupby("model", sort=False):
        name, S = p["name"].iloc[0], int(p["stride"].iloc[0])
        for k in range(len(p) // S):
            traces.append(Trace("line", list(range(S)), p["acc"].iloc[k * S: (k + 1) * S].tolist(),
                                name=name if k == 0 else None, color=colors[alias], dash="solid" if k == 0 else "dash",
                                marker="circle", size=2, model=alias,
                                hover=f"{name}<br>period {k}, phase %{{x}}: %{{y:.1f}}%<extra></extra>"))
    panel = Panel(traces, xlabel="phase (position mod S)", ylabel="accuracy (%)", ylim=(-2, 102), facet=True,
                  facet_cols=None, facet_titles={a: study.models[a].name for a in comp})
    return Figure([panel], f"Fold view ({padding} padding): first period solid, later dashed", size=(3.6, 3.0))


def training(study: Study, colors: dict[str, str]) -> Figure | None:
    """Training loss per model (lines) and validation loss (diamonds)."""
    traces = []
    for alias, m in study.models.items():
        d = m.metrics
        if d is None or "step" not in d or "loss" not in d:
            continue
        t = d.dropna(subset=["loss"])
        traces.append(Trace("line", t["step"].tolist(), t["loss"].tolist(), name=m.name, color=colors[alias],
                            width=1.2, model=alias))
        if "val_loss" in d:
            v = d.dropna(subset=["val_loss"])
            traces.append(Trace("points", v["step"].tolist(), v["val_loss"].tolist(), color=colors[alias],
                                marker="diamond", size=4, model=alias))
    if not traces:
        return None
    panel = Panel(traces, xlabel="step", ylabel="loss (nats/token; diamonds: validation)", ylog=True, legend=True)
    return Figure([panel], "Training loss (lines) and validation loss (diamonds)")


def flip(study: Study, colors: dict[str, str]) -> Figure | None:
    if not study.flip:
        return None
    rows = [flip_rows(a, study.models[a].name, st.summary, st.results, study.models[a].stride)
            for a, st in study.flip.items()]
    return flip_figure(pd.concat(rows, ignore_index=True), colors)


def knockout(stage: Stage, name: str) -> Figure:
    return knockout_figure(stage.results, f"Knockout map · {name} (red: lost, blue: gained, clipped ±100%)")


def gate_plane(study: Study, colors: dict[str, str]) -> Figure | None:
    """The concentration plane of every model with learned gates, with its training paths."""
    points, paths = [], []
    for alias, st in study.analyses.get("gates", {}).items():
        m = study.models[alias]
        if not m.learned_gates or st.results is None or "static" not in st.results:
            continue
        points.append(tables.gate_points(st).assign(model=alias, name=m.name, window=m.window))
        path = tables.gate_path(m)
        if path is not None:
            paths.append(path.assign(model=alias))
    if not points:
        return None
    return gate_plane_figure(pd.concat(points, ignore_index=True), pd.concat(paths) if paths else None,
                             "Gate concentration plane (key gates) with training paths (open: step 1, filled: end)", colors)


def alignment(study: Study, alias: str) -> Figure | None:
    m = study.models[alias]
    gates, ko = study.analyses.get("gates", {}).get(alias), study.analyses.get("knockout", {}).get(alias)
    if gates is None or gates.results is None or not m.learned_gates:
        return None
    return alignment_figure(gates.results, ko.results if ko is not None else None, m.window,
                            f"Gate preferences and knockout losses · {m.name}")


def cycle(study: Study, alias: str) -> Figure | None:
    stage = study.analyses.get("cycle", {}).get(alias)
    if stage is None or stage.results is None:
        return None
    m = study.models[alias]
    return cycle_figure(stage.results, f"Gate cycling · {m.name}", m.stride - 1)


def r2(study: Study) -> Figure | None:
    grid = tables.r2_grid(study)
    if grid is None:
        return None
    names = grid["alias"].map(lambda a: study.models[a].name if a in study.models else a)
    return r2_figure(grid.assign(label=names))
