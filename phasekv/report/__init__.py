"""The study report: `phasekv report DIR` renders DIR/report/index.html from a study directory's results."""

from phasekv.report.layout import Layout
from phasekv.report.load import Study, load_study
from phasekv.report.render import render_report

__all__ = ["Layout", "Study", "load_study", "render_report"]
