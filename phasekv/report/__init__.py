"""The study report: `phasekv report DIR` renders DIR/report/index.html from a study directory's results.

- `phasekv.report.layout`: where a study directory keeps each stage's outputs (one layout for demo and report);
- `load`: the directory read into a `Study` (no model is loaded); `tables`: tidy tables of it;
- `figures`: the study's tables fed to the one builder of each figure; `render`: each section's cells and figures
  (every figure as PNG and interactive) and the page, rendered from the Jinja2 templates in `templates/` (`html`:
  their environment, macros and cell helpers); `checks`: the verdicts, computed from the numbers; `browser`,
  `published`.

Layer: above every layer that writes results (eval, analysis, mitigate, theory): it reads their files and
reuses their figure builders and protocol registry, and nothing below it imports the report. Below `demo`,
which fills a study directory and renders the report at its end.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from phasekv.lazy import exports

if TYPE_CHECKING:
    from phasekv.report.layout import Layout
    from phasekv.report.load import Study, load_study
    from phasekv.report.render import render_report

__all__ = ["Layout", "Study", "load_study", "render_report"]

# Imported on first use (PEP 562): the demo's workers read the layout (`phasekv.report.layout`) and must not pull
# in the renderer and its dependencies (scipy.stats, matplotlib, plotly: ~1.5 s of every worker's start here).
__getattr__ = exports(__name__, {"Layout": "phasekv.report.layout", "Study": "phasekv.report.load",
                                 "load_study": "phasekv.report.load", "render_report": "phasekv.report.render"})
