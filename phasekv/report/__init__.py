"""The study report: `phasekv report DIR` renders DIR/report/index.html from a study directory's results.

- `phasekv.report.layout`: where a study directory keeps each stage's outputs (one layout for demo and report);
- `load`: the directory read into a `Study` (no model is loaded); `tables`: tidy tables of it;
- `figures`: the study's tables fed to the one builder of each figure; `render`: the page, every figure as
  PNG and interactive; `checks`: the verdicts, computed from the numbers; `html`, `browser`, `published`.

Layer: above every layer that writes results (eval, analysis, mitigate, theory): it reads their files and
reuses their figure builders and protocol registry, and nothing below it imports the report. Below `demo`,
which fills a study directory and renders the report at its end.
"""

from phasekv.report.layout import Layout
from phasekv.report.load import Study, load_study
from phasekv.report.render import render_report

__all__ = ["Layout", "Study", "load_study", "render_report"]
