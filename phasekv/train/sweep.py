"""Sweeps: a TOML file of runs (paper names, seeds, presets) run one after another, or printed as
torchrun / SLURM command lines for a cluster.

    [defaults]                 # any `phasekv train` option (TrainConfig field), shared by every run
    preset = "tiny"
    steps = 1600
    out_root = "runs/cpu"      # each run writes to out_root/<model alias>, e.g. runs/cpu/w8s8-1kv-seed43

    [[run]]
    arch = "W8/S8 · 1 KV"
    seeds = [42, 43]           # optional: one run per seed (or `seed = 43`)
    lr = 2e-3                  # optional per-run overrides
    backbone = {n_layers = 4}  # optional: overrides of the preset's backbone (or "n_layers=4,d_model=96")
    tag = "lr2e-3"             # optional: appended to the run's name and directory (runs/cpu/w8s8-1kv-lr2e-3), so
                               # runs of one model with other options (recipe probes) can share a sweep file

`phasekv sweep run FILE` skips finished runs (`done.json` at the planned step count), resumes
interrupted ones (latest checkpoint) and starts the rest.
"""

from __future__ import annotations

import fnmatch
import json
import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from phasekv.config import ModelConfig, format_overrides, parse_overrides
from phasekv.data.sources import DataConfig
from phasekv.errors import ConfigError, PhaseKVError
from phasekv.study import Lock, Task, run_tasks, slurm
from phasekv.study.cli import CPUS, EXECUTOR, GPUS, PARAM, PARTITION, TIME, WAIT, cluster_options
from phasekv.study.slurm import SlurmOptions
from phasekv.train import loop
from phasekv.train.checkpoint import latest_checkpoint
from phasekv.train.config import TrainConfig

app = typer.Typer(help="Run a sweep file (TOML) or print its cluster command lines.", no_args_is_help=True)
console = Console(stderr=True)
DATA_KEYS = set(DataConfig.__dataclass_fields__)
TAG = re.compile(r"[a-z0-9][a-z0-9._-]*")  # a run's tag: lower-case ASCII, safe in a directory name and a glob


@dataclass
class SweepRun:
    """One run of a sweep file: a model (one arch and seed) with its `phasekv train` options."""

    name: str  # paper name of the model (with its seed), then the run's tag in brackets if it has one
    alias: str  # ASCII alias, then "-" and the tag if any: the run's directory name
    options: dict  # TrainConfig fields (data fields flattened)

    @property
    def out(self) -> Path:
        return Path(self.options["out"])

    def config(self) -> TrainConfig:
        opts = dict(self.options)
        data = {k: opts.pop(k) for k in list(opts) if k in DATA_KEYS}
        if isinstance(opts.get("data"), dict):
            data.update(opts.pop("data"))
        return TrainConfig.from_dict({**opts, "data": DataConfig(**data)})

    def status(self) -> str:
        done = self.out / "done.json"
        if done.is_file():
            try:
                if json.loads(done.read_text()).get("steps") == self.config().total_steps:
                    return "done"
            except (OSError, json.JSONDecodeError):
                pass
            return "partial"
        if latest_checkpoint(self.out, verify=False) is not None:
            return "partial"
        return "pending"


def load_sweep(path: str | Path) -> list[SweepRun]:
    """Expand a sweep file into runs (one per arch and seed), validating every option."""
    path = Path(path)
    try:
        spec = tomllib.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"sweep file not found: {path}") from None
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: invalid TOML ({exc})") from None
    unknown = sorted(set(spec) - {"defaults", "run"})
    if unknown:
        raise ConfigError(f"{path}: unknown table(s) {', '.join(unknown)} (expected [defaults] and [[run]])")
    defaults = dict(spec.get("defaults", {}))
    out_root = _inside(path, "out_root", defaults.pop("out_root", f"runs/{path.stem}"))
    runs_spec = spec.get("run", [])
    if not runs_spec:
        raise ConfigError(f"{path}: no [[run]] entries")
    runs, seen = [], set()
    for i, r in enumerate(runs_spec, 1):
        r = {**defaults, **r}
        if "arch" not in r:
            raise ConfigError(f"{path}: run {i} has no 'arch'")
        if "out" in r:
            raise ConfigError(f"{path}: run {i}: 'out' is not a sweep option (runs write to out_root/<alias>)")
        seeds = r.pop("seeds", None) or [r.pop("seed", None)]
        tag = r.pop("tag", None)
        if tag is not None and not (isinstance(tag, str) and TAG.fullmatch(tag)):
            raise ConfigError(f"{path}: run {i}: tag={tag!r} must be lower-case letters, digits, '.', '_' or '-'")
        for seed in seeds:
            opts = {k: v for k, v in r.items()}
            try:
                mcfg = ModelConfig.from_name(opts["arch"], preset=opts.get("preset", "tiny"),
                                             **parse_overrides(opts.get("backbone"), "backbone"))
                if seed is not None:
                    if not isinstance(seed, int) or isinstance(seed, bool):
                        raise ConfigError(f"seed {seed!r} must be an integer")
                    mcfg = mcfg.replace(seed=seed)
                opts["arch"], opts["seed"] = mcfg.name, mcfg.seed
                name, alias = (mcfg.name, mcfg.alias) if tag is None else (f"{mcfg.name} [{tag}]", f"{mcfg.alias}-{tag}")
                opts["out"] = str(out_root / alias)
                run = SweepRun(name, alias, opts)
                run.config()
            except (TypeError, PhaseKVError) as exc:
                raise ConfigError(f"{path}: run {i}: {exc}") from None
            if run.alias in seen:
                raise ConfigError(f"{path}: run {run.name!r} appears twice (a `tag` tells runs of one model apart)")
            seen.add(run.alias)
            runs.append(run)
    return runs


def _inside(path: Path, key: str, value) -> Path:
    """A directory named in a sweep file: relative, and inside the working directory (no '..')."""
    p = Path(str(value))
    if not str(value).strip() or p.is_absolute() or ".." in p.parts:
        raise ConfigError(f"{path}: {key}={str(value)!r} must be a relative path inside the working directory "
                          "(no absolute paths, no '..')")
    return p


def _select(runs: list[SweepRun], only: str | None) -> list[SweepRun]:
    if not only:
        return runs
    return [r for r in runs if fnmatch.fnmatch(r.alias, only) or fnmatch.fnmatch(r.name, only)]


def train_run(name: str, alias: str, options: dict, **runtime) -> dict:
    """Train (or resume) one run of a sweep: the unit of work a sweep's task runs, in a SLURM job's every rank."""
    return loop.train(SweepRun(name, alias, options).config(), resume=True, **runtime)


def sweep_tasks(runs: list[SweepRun], **runtime) -> list[Task]:
    """A sweep as a task graph (no dependencies): one training task per run, done when its run is."""
    return [Task(f"train {r.alias}", train_run, {"name": r.name, "alias": r.alias, "options": r.options, **runtime},
                 lambda r=r: r.status() == "done", units=r.config().total_steps, parallel=True) for r in runs]


def submit_sweep(path: str | Path, cluster: SlurmOptions, only: str | None = None, **runtime) -> dict[str, str]:
    """Every unfinished run of a sweep a SLURM job (`phasekv.study.slurm`; jobs recorded in out_root/jobs.json),
    waiting for them when `cluster.wait`; returns {task: error} of failed runs."""
    runs = _select(load_sweep(path), only)
    if not runs:
        return {}
    root = runs[0].out.parent
    slurm.check(cluster, root, runs[0].config().device.replace("auto", "cuda" if cluster.gpus_per_node else "cpu"))
    root.mkdir(parents=True, exist_ok=True)
    tasks = sweep_tasks(runs, **runtime)
    with Lock(root), slurm.SlurmExecutor(root, cluster, "sweep") as ex:
        failed = run_tasks(tasks, 1, runtime.get("progress", True), lambda *a: None, "sweep", executor=ex)
    jobs = ex.book.read()
    for t in (t for t in tasks if not cluster.wait and t.name in jobs and not t.is_done()):
        console.print(f"queued {t.name}: job {jobs[t.name]['job_id']} (logs in {jobs[t.name]['folder']})")
    return failed


def run_sweep(path: str | Path, only: str | None = None, dry_run: bool = False, **runtime) -> list[dict]:
    """Run every unfinished run of a sweep in turn; returns one row per run (name, status, summary/error)."""
    return run_runs(_select(load_sweep(path), only), dry_run, **runtime)


def run_runs(runs: list[SweepRun], dry_run: bool = False, **runtime) -> list[dict]:
    """Run every unfinished run in turn (finished ones skipped, interrupted ones resumed); one row per run."""
    rows = []
    for run in runs:
        status = run.status()
        row = {"name": run.name, "out": str(run.out), "before": status}
        if status == "done" or dry_run:
            row["after"] = status if status == "done" else "planned"
            rows.append(row)
            continue
        console.print(f"[bold]{'resuming' if status == 'partial' else 'starting'}[/] {run.name} -> {run.out}")
        try:
            row["summary"] = loop.train(run.config(), resume=True, **runtime)
            row["after"] = "done"
        except PhaseKVError as exc:
            row["after"], row["error"] = "failed", str(exc)
            console.print(f"[red]failed[/] {run.name}: {exc}")
        rows.append(row)
    return rows


@app.command("run")
def run_cmd(
    file: Path = typer.Argument(..., help="Sweep TOML file (e.g. sweeps/cpu.toml)."),
    only: str = typer.Option(None, help="Only runs whose alias or name matches this glob (e.g. 'w8s8*')."),
    dry_run: bool = typer.Option(False, "--dry-run", help="Show what would run; train nothing."),
    threads: int = typer.Option(None, help="torch CPU threads for every run."),
    progress: bool = typer.Option(True, "--progress/--no-progress", help="Progress bars."),
    executor: str = EXECUTOR, wait: bool = WAIT, partition: str = PARTITION, gpus: int = GPUS, cpus: int = CPUS,
    time: int = TIME, param: list[str] = PARAM,
    nodes: int = typer.Option(1, "--slurm-nodes", help="slurm: nodes of each run's job."),
    ranks: int = typer.Option(None, "--slurm-ranks-per-node", help="slurm: ranks of each run per node (default: "
                              "the GPUs per node, or 1)."),
) -> None:
    """Run a sweep here, one run after another: finished runs are skipped, interrupted ones resumed. With
    `--executor slurm`: each unfinished run a SLURM job (its ranks from SLURM's environment), requeued at a
    preemption or its time limit and resumed from its latest checkpoint."""
    runtime = {"progress": progress} | ({"threads": threads} if threads is not None else {})
    cluster = cluster_options(executor, wait, partition, nodes, gpus, ranks, cpus, time, param)
    if cluster is not None and not dry_run:
        failed = submit_sweep(file, cluster, only, **runtime)
        for name, err in failed.items():
            console.print(f"[red]failed[/] {name}: {err}")
        if failed:
            raise typer.Exit(1)
        return
    rows = run_sweep(file, only, dry_run, **runtime)
    table = Table(title=str(file))
    for c in ("run", "before", "after", "final loss", "accuracy"):
        table.add_column(c)
    for r in rows:
        s = r.get("summary", {})
        table.add_row(r["name"], r["before"], r["after"], f"{s['final_loss']:.4f}" if s else "",
                      f"{100 * s['val_accuracy']:.1f}%" if "val_accuracy" in s else "")
    console.print(table)
    if any(r["after"] == "failed" for r in rows):
        raise typer.Exit(1)


@app.command("status")
def status_cmd(file: Path = typer.Argument(..., help="Sweep TOML file.")) -> None:
    """Show each run of a sweep as done / partial / pending."""
    table = Table(title=str(file))
    for c in ("run", "alias", "status", "out"):
        table.add_column(c)
    for r in load_sweep(file):
        table.add_row(r.name, r.alias, r.status(), str(r.out))
    console.print(table)


def train_args(run: SweepRun) -> list[str]:
    """`phasekv train` arguments of a run (options that differ from the defaults, plus --resume)."""
    default = TrainConfig().to_dict()
    cfg = run.config().to_dict()
    args = ["--arch", run.options["arch"], "--out", str(run.out)]
    data = cfg.pop("data")
    for k, v in data.items():
        if k in ("recall", "needle") or v == default["data"][k]:
            continue
        args += [f"--{k.replace('_', '-')}", str(v)]
    for k, v in cfg.items():
        if k in ("arch", "out") or v == default[k] or v is None:
            continue
        v = format_overrides(v) if k == "backbone" else v
        flag = f"--{k.replace('_', '-')}"
        args += ([flag] if v is True else [f"--no-{k.replace('_', '-')}"] if v is False else [flag, str(v)])
    return args + ["--resume"]


@app.command("commands")
def commands_cmd(
    file: Path = typer.Argument(..., help="Sweep TOML file."),
    nproc: int = typer.Option(1, help="Processes (GPUs) per node."),
    nnodes: int = typer.Option(1, help="Nodes per run (a printed multi-node torchrun line meets at $MASTER_ADDR:29500, "
                               "which you set; --slurm and --submit find the first node of the job themselves)."),
    slurm: bool = typer.Option(False, "--slurm", help="Print sbatch command lines instead of torchrun ones."),
    submit: bool = typer.Option(False, "--submit", help="Submit the runs to SLURM through submitit, nproc ranks "
                                "per node (= `sweep run FILE --executor slurm`)."),
    gpus: bool = typer.Option(False, "--gpus/--no-gpus", help="--slurm/--submit: one GPU per process (default: "
                              "CPUs only, no GPU request)."),
    only: str = typer.Option(None, help="Only runs matching this glob."),
) -> None:
    """Print one torchrun (or sbatch) command line per unfinished run of a sweep, or submit them."""
    if submit:
        cluster = SlurmOptions(nodes=nnodes, ranks_per_node=nproc, gpus_per_node=nproc if gpus else 0)
        for name, err in submit_sweep(file, cluster, only, progress=False).items():
            console.print(f"[red]failed[/] {name}: {err}")
        return
    runs = [r for r in _select(load_sweep(file), only) if r.status() != "done"]
    head = "$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1)" if slurm else "$MASTER_ADDR"
    for run in runs:
        rdzv = [] if nnodes == 1 else ["--nnodes", str(nnodes), "--rdzv-backend", "c10d",
                                       "--rdzv-endpoint", f"{head}:29500", "--rdzv-id", run.alias]
        torchrun = ["torchrun", "--nproc_per_node", str(nproc), *rdzv, "-m", "phasekv", "train", *train_args(run)]
        line = " ".join(shlex.quote(a) if not a.startswith("$") else a for a in torchrun)
        if slurm:  # one torchrun per node (srun), the shell of the job expands the first node's name
            gres = f" --gpus-per-node {nproc}" if gpus else ""
            print(f"sbatch --job-name {run.alias} --nodes {nnodes} --ntasks-per-node 1{gres} "
                  f"--output {run.out}/slurm-%j.log --wrap {shlex.quote('srun ' + line)}")
        else:
            print(line)
