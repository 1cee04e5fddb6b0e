"""`phasekv demo [--quick] [--out DIR]` and `phasekv study [--quick] [--out DIR] [--preset P]`."""

from __future__ import annotations

from pathlib import Path

import typer

from phasekv.demo.plan import STUDY_PRESET

JOBS_HELP = "Worker processes (default: 2, or 1 on a 1-core machine)."
RERUN_HELP = ("Run this model again (paper name or alias; repeatable): its training and everything computed from "
              "it (its evaluations and analyses, the comparison, the repair's goals, the example prompts, the report) "
              "are discarded, every other result is kept; recorded in OUT/demo.json.")


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(
        out: Path = typer.Option(Path("demo_out"), "--out", "-o", help="Study directory (runs, results, report)."),
        quick: bool = typer.Option(False, "--quick", help="~2-minute smoke version: every stage, tiny budgets "
                                   "(too short for the effects to show)."),
        jobs: int = typer.Option(None, help=JOBS_HELP),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress bars."),
        rerun: list[str] = typer.Option(None, "--rerun", metavar="MODEL", help=RERUN_HELP),
    ) -> None:
        """Reproduce the study end to end on this CPU: train four tiny models (full attention, W8/S8, W8/S4
        and the repair candidate W8/S6 · 4 KV), run the lookup evaluation under both paddings, the flip
        sweep, knockouts, gate statistics with training paths, gate cycling, the repair's goals and the theory
        checks, then write OUT/report/index.html. Resumable: re-running skips finished work."""
        from phasekv.demo.runner import run_demo

        run_demo(out, quick=quick, jobs=jobs, progress=progress, rerun=rerun or [])

    @app.command()
    def study(
        out: Path = typer.Option(None, "--out", "-o", help="Study directory (runs, results, report); default "
                                 "study_out, with --family family_out."),
        quick: bool = typer.Option(False, "--quick", help="Smoke version: every stage of every run at the demo's "
                                   "--quick budgets (too short for the effects to show)."),
        preset: str = typer.Option(STUDY_PRESET, help="Backbone preset of every run (8 KV heads need >= 8 query "
                                   "heads)."),
        family: bool = typer.Option(False, "--family", help="The grid family instead: NSA, MoBA and Activation "
                                    "Beacon beside full attention and W8/S4 · 1 KV at the demo's scale and recipe "
                                    "(tiny preset; --preset does not apply), each model's lookup tested at every "
                                    "grid period of the family, the designs' knockouts; the report's section "
                                    "\"The family\"."),
        needle: bool = typer.Option(False, "--needle", help="The long-context regime instead: full attention, "
                                    "W8/S8 · 1 KV and W8/S4 · 1 KV trained on the needle test's own task up to "
                                    "1,024 tokens (tiny preset, one thread), each model's needle test at 1x, 2x and "
                                    "4x that length and its needle audit; OUT/needle.md (default needle_out)."),
        jobs: int = typer.Option(None, help=JOBS_HELP),
        progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress bars."),
        rerun: list[str] = typer.Option(None, "--rerun", metavar="MODEL", help=RERUN_HELP),
    ) -> None:
        """The whole study on this CPU: every run of the paper's grid (its Figure 2) and its full-attention
        baselines, trained with the demo's recipe plus a quarter of repeat sequences (without them full attention
        stays at chance at 8 query heads) at one backbone; the lookup under both paddings, knockouts,
        gate statistics, gate cycling for every W = S run, the flip sweep and the theory checks; then
        OUT/report/index.html, whose first section gives a verdict on each of the study's claims C1-C10
        (also OUT/report/claims.json). Resumable: re-running skips finished work."""
        from phasekv.demo.runner import run_family, run_study

        if needle:
            from phasekv.demo.needle import run_needle

            run_needle(out or Path("needle_out"), quick=quick, progress=progress)
            return
        if family:
            run_family(out or Path("family_out"), quick=quick, jobs=jobs, progress=progress, rerun=rerun or [])
            return
        run_study(out or Path("study_out"), quick=quick, preset=preset, jobs=jobs, progress=progress, rerun=rerun or [])
