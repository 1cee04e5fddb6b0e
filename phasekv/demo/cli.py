"""`phasekv demo [--quick] [--out DIR]`, `phasekv study [--quick] [--out DIR] [--preset P]` (on this machine or,
`--executor slurm`, a SLURM job per task) and `phasekv study status OUT`."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from phasekv.demo.plan import STUDY_PRESET
from phasekv.errors import ConfigError
from phasekv.study.cli import (
    CPUS,
    DEVICE,
    EXECUTOR,
    GPUS,
    NODES,
    PARAM,
    PARTITION,
    RANKS,
    TIME,
    WAIT,
    cluster_options,
)
from phasekv.study.slurm import SlurmOptions

JOBS_HELP = "Worker processes (default: 2, or 1 on a 1-core machine)."
RERUN_HELP = ("Run this model again (paper name or alias; repeatable): its training and everything computed from "
              "it (its evaluations and analyses, the comparison, the repair's goals, the example prompts, the report) "
              "are discarded, every other result is kept; recorded in OUT/demo.json.")
SEED = typer.Option(None, "--seed", help="Train every model at this seed (weights and data; its name then carries "
                    "'· seed N'). Default: 42, or the seeds OUT already holds; a seed OUT lacks is added to them.")
SEEDS = typer.Option(None, "--seeds", metavar="A,B,...", help="Every model at each of these seeds (e.g. 42,43,44), "
                     "into one directory: the report states each claim as k of n seeds and names the failing ones. "
                     "Seeds OUT already holds are kept.")


def seeds_of(seed: int | None, seeds: str | None) -> list[int] | None:
    """The seeds `--seed` or `--seeds` asks for (None: neither given)."""
    if seed is not None and seeds is not None:
        raise ConfigError("give --seed or --seeds, not both")
    if seed is not None:
        return [seed]
    if seeds is None:
        return None
    try:
        return [int(x) for x in seeds.split(",") if x.strip()]
    except ValueError:
        raise ConfigError(f"--seeds {seeds!r}: give comma-separated integers, e.g. 42,43,44") from None


def demo(
    out: Path = typer.Option(Path("demo_out"), "--out", "-o", help="Study directory (runs, results, report)."),
    quick: bool = typer.Option(False, "--quick", help="~2-minute smoke version: every stage, tiny budgets "
                               "(too short for the effects to show)."),
    seed: int = SEED, seeds: str = SEEDS,
    jobs: int = typer.Option(None, help=JOBS_HELP),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress bars."),
    rerun: list[str] = typer.Option(None, "--rerun", metavar="MODEL", help=RERUN_HELP),
    device: str = DEVICE, executor: str = EXECUTOR, wait: bool = WAIT, partition: str = PARTITION,
    nodes: int = NODES, gpus: int = GPUS, ranks: int = RANKS, cpus: int = CPUS, time: int = TIME,
    param: list[str] = PARAM,
) -> None:
    """Reproduce the study end to end on this CPU: train four tiny models (full attention, W8/S8, W8/S4
    and the repair W3/S2 · 1 KV), run the lookup evaluation under both paddings, the flip
    sweep, knockouts, gate statistics with training paths, gate cycling, the repair's goals and the theory
    checks, then write OUT/report/index.html. Resumable: re-running skips finished work."""
    from phasekv.demo.runner import run_demo

    cluster = cluster_options(executor, wait, partition, nodes, gpus, ranks, cpus, time, param)
    run_demo(out, quick=quick, seeds=seeds_of(seed, seeds), jobs=jobs, progress=progress, rerun=rerun or [],
             device=device, cluster=cluster)


def study(
    ctx: typer.Context,
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
    seed: int = SEED, seeds: str = SEEDS,
    jobs: int = typer.Option(None, help=JOBS_HELP),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Show progress bars."),
    rerun: list[str] = typer.Option(None, "--rerun", metavar="MODEL", help=RERUN_HELP),
    dry_run: bool = typer.Option(False, "--dry-run", help="Print the task graph with each task's resources "
                                 "and the trainings' GPU-hours (6·N·D at --gpu-tflops x --mfu); run nothing."),
    gpu_tflops: float = typer.Option(989.0, "--gpu-tflops", help="--dry-run: the GPU's dense bf16 peak "
                                     "(TFLOP/s; default an H100 SXM's)."),
    mfu: float = typer.Option(0.4, "--mfu", help="--dry-run: the share of that peak a training reaches."),
    device: str = DEVICE, executor: str = EXECUTOR, wait: bool = WAIT, partition: str = PARTITION,
    nodes: int = NODES, gpus: int = GPUS, ranks: int = RANKS, cpus: int = CPUS, time: int = TIME,
    param: list[str] = PARAM,
) -> None:
    """The whole study on this CPU: every run of the paper's grid (its Figure 2) and its full-attention
    baselines, trained with the demo's recipe plus a quarter of repeat sequences (without them full attention
    stays at chance at 8 query heads) at one backbone; the lookup under both paddings, knockouts,
    gate statistics, gate cycling for every W = S run, the flip sweep and the theory checks; then
    OUT/report/index.html, whose first section gives a verdict on each of the study's claims C1-C10
    (also OUT/report/claims.json). Resumable: re-running skips finished work. `phasekv study status OUT`:
    where each task stands."""
    if ctx.invoked_subcommand:
        return
    if needle:  # its own chained plan, run in this process (one thread)
        unused = {"--family": family, "--executor": executor != "local", "--device": device != "cpu",
                  "--dry-run": dry_run, "--rerun": bool(rerun), "--jobs": jobs is not None,
                  "--preset": preset != STUDY_PRESET}
        _run_needle(out or Path("needle_out"), quick, seeds_of(seed, seeds), progress, unused)
        return
    from phasekv.demo.plan import family_plan, study_plan

    cluster = cluster_options(executor, wait, partition, nodes, gpus, ranks, cpus, time, param)
    plan = family_plan(quick) if family else study_plan(quick, preset)
    out = out or Path("family_out" if family else "study_out")
    if dry_run:
        from phasekv.demo.cost import GPU
        from phasekv.demo.runner import plan_at

        _print_plan(out, plan_at(out, plan, seeds_of(seed, seeds)), GPU(gpu_tflops, mfu), cluster, device)
        return
    from phasekv.demo.runner import run_plan

    run_plan(out, plan, seeds=seeds_of(seed, seeds), jobs=jobs, progress=progress, rerun=rerun or [],
             device=device, cluster=cluster)


def _run_needle(out: Path, quick: bool, seeds: list[int] | None, progress: bool, unused: dict[str, bool]) -> None:
    """`phasekv study --needle`: refused with the options that do not apply to it (`unused`: flag -> given)."""
    from phasekv.demo.needle import run_needle

    if any(unused.values()):
        raise ConfigError(f"--needle runs its chains in this process on the CPU at the tiny preset: "
                          f"{', '.join(k for k, v in unused.items() if v)} does not apply")
    run_needle(out, quick=quick, progress=progress, seeds=seeds)


def status(out: Path = typer.Argument(..., help="Study directory (of `phasekv study`, `demo` or `study "
                                      "--family`).")) -> None:
    """Each task of the study in OUT: done / running (job id, node) / queued / failed (its log's last lines)
    / not submitted."""
    _print_status(out)


def register(app: typer.Typer) -> None:
    app.command()(demo)
    study_app = typer.Typer(add_completion=False)
    study_app.callback(invoke_without_command=True)(study)
    study_app.command("status")(status)
    app.add_typer(study_app, name="study")


def _print_plan(out: Path, plan, gpu, cluster: SlurmOptions | None, device: str) -> None:
    from phasekv.demo.cost import PAPER_TOKENS, plan_table, training_cost
    from phasekv.demo.runner import build_tasks, check_device

    check_device(device, local=False)
    own = training_cost(plan, gpu)
    rows = plan_table(build_tasks(out, plan, device), own, cluster, device)
    table = Table(title=f"{plan.kind} ({plan.mode}) at the {plan.preset} preset: {len(rows)} tasks")
    for c in ("task", "needs", "resources", "GPU-hours"):
        table.add_column(c)
    for r in rows:
        table.add_row(r["task"], r["after"], r["resources"], "" if r["gpu_hours"] is None else f"{r['gpu_hours']:.3g}")
    con = Console()
    con.print(table)
    n = sum(c["params"] for c in own.values()) / len(own)
    paper = sum(c["paper_gpu_hours"] for c in own.values())
    con.print(f"trainings: {len(own)} models, ~{n / 1e6:,.1f}M parameters each; 6·N·D = "
              f"{sum(c['flops'] for c in own.values()):.3g} FLOPs = {sum(c['gpu_hours'] for c in own.values()):,.1f} "
              f"GPU-hours at {gpu.tflops:g} TFLOP/s x {gpu.utilisation:.0%} utilisation "
              f"({plan.steps_text()}, {plan.seq_len} tokens per sequence)")
    con.print(f"at the paper's budget ({PAPER_TOKENS:.3g} tokens per model): {6 * n * PAPER_TOKENS * len(own):.3g} "
              f"FLOPs = {paper:,.0f} GPU-hours ({paper / len(own):,.0f} per model); evaluations are not priced")


def _print_status(out: Path) -> None:
    import json

    from phasekv.demo.plan import DemoPlan
    from phasekv.demo.runner import build_tasks
    from phasekv.report.layout import Layout
    from phasekv.study.status import STATES, task_states

    manifest_path = Layout(out).manifest
    if not manifest_path.is_file():
        raise ConfigError(f"{out} holds no study ({manifest_path.name} not found)")
    manifest = json.loads(manifest_path.read_text())
    tasks = build_tasks(out, DemoPlan.from_dict(manifest["plan"]))
    states = task_states(tasks, out, manifest.get("failed"))
    table = Table(title=f"{manifest.get('kind', 'study')} in {out}")
    for c in ("task", "state", "job", "detail"):
        table.add_column(c, overflow="fold")
    for s in states:
        table.add_row(s.task, s.state, s.job, s.detail)
    con = Console()
    con.print(table)
    con.print(", ".join(f"{sum(s.state == k for s in states)} {k}" for k in STATES))
