"""The study's claims and grid as Markdown (`phasekv report DIR --markdown FILE`): the tables a README or a paper
quotes, read from the report's own `claims.json` and `grid.csv`, so they say exactly what the report says."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from phasekv.errors import DataError
from phasekv.report.html import fmt
from phasekv.report.layout import Layout
from phasekv.report.tables import seed_cell


def _period(x) -> str:
    return "–" if pd.isna(x) else str(int(x))


def _read(path: Path) -> Path:
    if not path.is_file():
        raise DataError(f"{path} not found: render the report first (`phasekv report {path.parent.parent}`)")
    return path


def claims_markdown(root: str | Path) -> str:
    """One row per claim C1-C11: verdict and the measured evidence in words."""
    rows = json.loads(_read(Layout(root).claims).read_text())
    lines = ["| claim | verdict | measured here |", "|---|---|---|"]
    return "\n".join(lines + [f"| {c['claim']} | {c['verdict']} | {c['reason']} |" for c in rows])


def grid_markdown(root: str | Path) -> str:
    """Every design of the grid that was run: mean, worst, best, gap [95%] and period under each padding (at several
    seeds: the mean over them with their range, each seed's period), the published values."""
    df = pd.read_csv(_read(Layout(root).grid))
    tags = [""] + [c[: -len("mean")] for c in df.columns if c.endswith("_mean") and not c.startswith("pub_")]
    several = "n_seeds" in df and bool((df.n_seeds > 1).any())
    head = ["model", *(["seeds"] if several else [])]
    for tag in tags:
        head += [f"{tag.rstrip('_') or 'prefix'}: mean", "worst", "best", "gap [95%]", "period"]
    lines = ["| " + " | ".join(head + ["published: mean / worst / gap"]) + " |", "|" + "---|" * (len(head) + 1)]
    for r in df[df.run].to_dict("records"):
        cells = [r["model"], *([str(r["seeds"])] if several else [])]
        for tag in tags:
            cells += [seed_cell(r, k, tag) for k in ("mean", "worst", "best", "gap")]
            cells.append(str(r[tag + "periods"]) if several else _period(r[tag + "detected_period"]))
        pub = "–" if pd.isna(r["pub_mean"]) else f"{fmt(r['pub_mean'])} / {fmt(r['pub_worst'])} / {fmt(r['pub_gap'])}"
        lines.append("| " + " | ".join(cells + [pub]) + " |")
    return "\n".join(lines)


def needle_markdown(root: str | Path) -> str | None:
    """The long-context controls' table (`phasekv study --needle`'s needle.md), or None without one."""
    path = Path(root) / "needle.md"
    return path.read_text(encoding="utf-8") if path.is_file() else None


def study_markdown(root: str | Path) -> str:
    """The claims and the grid, and the long-context controls when DIR has them (a needle-only directory: those
    alone)."""
    needle = needle_markdown(root)
    long = f"\n## Long context\n\n{needle}" if needle else ""
    if needle and not Layout(root).claims.is_file():
        return long.lstrip("\n")
    return f"## The study's claims\n\n{claims_markdown(root)}\n\n## The grid\n\n{grid_markdown(root)}\n" + long
