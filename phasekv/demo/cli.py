"""`phasekv demo [--quick] [--out DIR]`."""

from __future__ import annotations

from pathlib import Path

import typer


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(
        out: Path = typer.Option(Path("demo_out"), "--out", "-o", help="Study directory (runs, results, report)."),
        quick: bool = typer.Option(False, "--quick", help="~2-minute smoke version: every stage, tiny budgets "
                                   "(too short for the effects to show)."),
        jobs: int = typer.Option(None, help="Worker processes (default: 2, or 1 on a 1-core machine)."),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress bars."),
    ) -> None:
        """Reproduce the study end to end on this CPU: train the tiny models (full attention, W8/S8, W8/S4,
        W8/S8 uniform averaging, W6/S6), run the lookup evaluation under both paddings, the flip sweep,
        knockouts, gate statistics with training paths, gate cycling and the theory checks, then write
        OUT/report/index.html. Resumable: re-running skips finished work."""
        from phasekv.demo.runner import run_demo

        run_demo(out, quick=quick, jobs=jobs, progress=progress)
