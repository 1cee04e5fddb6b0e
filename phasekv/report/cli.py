"""`phasekv report DIR`: the study report (HTML + PNG figures) from a study directory's results files."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console

console = Console()


def register(app: typer.Typer) -> None:
    @app.command()
    def report(
        directory: Path = typer.Argument(..., help="Study directory (as written by `phasekv demo --out DIR`)."),
        screenshot: Path = typer.Option(None, help="Also save a PNG screenshot of the report (needs chromium)."),
        select: str = typer.Option(None, help="Model alias to select before the screenshot (e.g. w8s8-1kv)."),
        section: str = typer.Option("lookup", help="Section the screenshot scrolls to (e.g. claims, grid, lookup)."),
        markdown: Path = typer.Option(None, help="Also write the claims and grid tables as Markdown to this file."),
    ) -> None:
        """Render DIR/report/index.html (one self-contained file: plotly inlined, tables readable without
        JavaScript) and DIR/report/figures/*.png from the results files alone; no model is loaded."""
        from phasekv.report.render import render_report

        index = render_report(directory)
        console.print(f"report: [bold]{index}[/] (figures in {index.parent / 'figures'})")
        if markdown is not None:
            from phasekv.io import write_text
            from phasekv.report.markdown import study_markdown

            console.print(f"markdown: {write_text(markdown, study_markdown(directory))}")
        if screenshot is not None:
            from phasekv.report.browser import screenshot_report

            path = screenshot_report(index, screenshot, select=select, anchor=section)
            console.print(f"screenshot: {path}")
