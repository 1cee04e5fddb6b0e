"""The report's HTML: Jinja2 templates (`phasekv/report/templates/`, autoescaped) and the values they show.

The page is one file: CSS and plotly's JavaScript are inlined, figure data sits in JSON script tags, and
every table is plain HTML so the numbers read without JavaScript (the PNG figures show in <noscript>).
`templates/macros.html` holds the blocks the sections share (a table, a figure, a verdict, the claims' and the
checks' tables); `templates/<section>.html` one section each, `templates/page.html` the page around them. The
sections' Python builds the cells as text (`fmt`, `interval`); the templates escape it.
"""

from __future__ import annotations

import base64
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup

from phasekv.io import jsonable

ENV = Environment(loader=PackageLoader("phasekv.report"), autoescape=True, trim_blocks=True, lstrip_blocks=True,
                  undefined=StrictUndefined)


def render(template: str, **context) -> Markup:
    """A template of templates/ rendered with `context` (text escaped, `Markup` and macros' output kept)."""
    return Markup(ENV.get_template(template).render(**context))


def macro(name: str):
    """A macro of templates/macros.html as a function (it returns `Markup`)."""
    return getattr(ENV.get_template("macros.html").module, name)


def static(name: str) -> Markup:
    """A file of templates/ as it is: the page's style sheet and script."""
    return Markup(ENV.loader.get_source(ENV, name)[0])


def fmt(v, digits: int = 1) -> str:
    """A value as the report's cells show it: '–' for none, 'yes'/'no', thousands separated, `digits` decimals."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)) or v is pd.NA:
        return "–"
    if isinstance(v, bool | np.bool_):
        return "yes" if v else "no"
    if isinstance(v, int | np.integer):
        return f"{int(v):,}"
    if isinstance(v, float | np.floating):
        return f"{float(v):.{digits}f}"
    return str(v)


def interval(value, ci=None, digits: int = 1) -> str:
    """An estimate with its 95% interval, '55.3 [50.7, 59.9]' ('–' for a missing bound or a missing interval)."""
    lo, hi = ci or (None, None)
    return f"{fmt(value, digits)} [{fmt(lo, digits)}, {fmt(hi, digits)}]"


@dataclass(frozen=True)
class Styled:
    """A cell's or a heading's text in one element: a verdict's colour (class pass, fail or na), a published
    number (class published), `code`, `b`."""

    text: str
    cls: str = ""
    tag: str = "span"


def published(text: str) -> Styled:
    return Styled(text, "published")


ENV.globals["published"] = published  # the templates' headers of published columns


@dataclass(frozen=True)
class Plot:
    """An interactive figure slot: plotly's spec as JSON, its caption and its PNG beside the page."""

    id: str
    spec: Markup  # JSON safe inside a script element
    caption: str
    png: str


def plot(fig_id: str, spec: dict, caption: str, png: str) -> Plot:
    data = json.dumps(jsonable(spec), separators=(",", ":")).replace("</", "<\\/")  # no "</script>" inside
    return Plot(fig_id, Markup(data), caption, png)


@dataclass(frozen=True)
class Image:
    """A PNG embedded as a data URI (the page stays one self-contained file), its caption and its copy beside."""

    src: str
    caption: str
    png: str


def image(path: Path, caption: str, png: str) -> Image:
    return Image("data:image/png;base64," + base64.b64encode(path.read_bytes()).decode(), caption, png)
