"""`phasekv theory minimisers|flow|coverage`: numerical checks of the idealised induction model."""

from __future__ import annotations

import json
from dataclasses import asdict, replace
from pathlib import Path

import typer
from rich.console import Console

from phasekv.errors import ConfigError
from phasekv.theory import checks
from phasekv.theory.flow import FlowOptions
from phasekv.theory.minimisers import MinimiserOptions

app = typer.Typer(
    help="Idealised induction model: Theorem 1 (minimisers are one-hot), Theorem 2 (gradient flow), coverage.",
    no_args_is_help=True,
)
console = Console(stderr=True)

OUT = typer.Option(..., "--out", help="Output directory (summary.json, results.parquet, PNG figures).")
QUICK = typer.Option(False, "--quick", help="Small default grid and short optimisation (seconds).")
SEED = typer.Option(0, help="Random seed (embeddings, contexts, initialisations).")
THREADS = typer.Option(1, help="torch CPU threads.")
PROGRESS = typer.Option(True, "--progress/--no-progress", help="Show a progress bar.")
N_OPT = typer.Option(None, "--N", help="Comma list of vocabulary sizes N, e.g. '64,256'.")
S_OPT = typer.Option(None, "--S", help="Comma list of chunk lengths S.")
M_OPT = typer.Option(None, "--m", help="Comma list of head counts m (combinations with m >= S are skipped).")
KAPPA_OPT = typer.Option(None, "--kappa", help="Comma list of shared inner products kappa in [0, 1).")
EPS_OPT = typer.Option(None, "--eps", help="Comma list of equiangularity errors eps.")
BETA_OPT = typer.Option(None, "--beta", help="Comma list of unembedding scales beta.")
L_OPT = typer.Option(None, "--L", help="Chunks per context L.")
GAMMA_OPT = typer.Option(None, "--gamma", help="Attention scale gamma.")
STEPS_FLOW = typer.Option(None, help="Gradient steps.")
ETA_OPT = typer.Option(None, help="Step size of the discretised flow.")
N_TEST = typer.Option(512, help="Held-out contexts for accuracy by position.")


def _list(text: str | None, cast, name: str) -> list | None:
    if text is None:
        return None
    try:
        values = [cast(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise ConfigError(f"--{name}: cannot parse {text!r} as a comma list of numbers") from exc
    if not values:
        raise ConfigError(f"--{name}: empty list")
    return values


def _grid(base: checks.Grid, N, S, m, kappa, eps, beta, L, gamma) -> checks.Grid:
    lists = {"N": _list(N, int, "N"), "S": _list(S, int, "S"), "m": _list(m, int, "m"),
             "kappa": _list(kappa, float, "kappa"), "eps": _list(eps, float, "eps"), "beta": _list(beta, float, "beta")}
    scalars = {"L": L, "gamma": gamma}
    return replace(base, **{k: v for k, v in (lists | scalars).items() if v is not None})


def _settings(grids: dict, options: dict, quick: bool, grid_args: tuple, **values):
    """(grid, options) of a check: its full or quick defaults, overridden by the options given (counts >= 1)."""
    mode = "quick" if quick else "full"
    grid = _grid(grids[mode], *grid_args)
    opts = replace(options[mode], **{k: v for k, v in values.items() if v is not None})
    _validate_counts(opts)
    return grid, opts


def _report(summary: dict, out: Path) -> None:
    for s in summary["settings"]:
        keep = {k: v for k, v in s.items() if k not in ("config", "flow", "setting")}
        console.print(f"[bold]{s['setting']}[/bold] {json.dumps(keep, default=str)}")
    console.print(f"claim reproduced: {summary['claim_reproduced']}  ->  {out}/summary.json")


@app.command()
def minimisers(
    out: Path = OUT, quick: bool = QUICK, N: str = N_OPT, S: str = S_OPT, m: str = M_OPT, kappa: str = KAPPA_OPT,
    eps: str = EPS_OPT, beta: str = BETA_OPT, L: int = L_OPT, gamma: float = GAMMA_OPT,
    starts: int = typer.Option(None, help="Random starts per context."),
    steps: int = typer.Option(None, help="Adam steps per start."),
    lr: float = typer.Option(None, help="Adam learning rate."),
    seed: int = SEED, threads: int = THREADS, progress: bool = PROGRESS,
) -> None:
    """Theorem 1: are the optimal query-independent compression rules one-hot?

    Optimises unconstrained softmax-parameterised rules from many random starts, measures one-hotness
    (max_r p^K(r) and the value mass on r+1) and, at eps = 0, compares distinct against colliding one-hot
    assignments exactly. Writes summary.json, results.parquet, assignments.parquet, minimisers.png.
    """
    grid, opts = _settings(checks.MINIMISER_GRIDS, checks.MINIMISER_OPTS, quick, (N, S, m, kappa, eps, beta, L, gamma),
                           starts=starts, steps=steps, lr=lr, seed=seed)
    _report(checks.minimisers_check(out, grid, opts, progress=progress, threads=threads), out)


@app.command()
def flow(
    out: Path = OUT, quick: bool = QUICK, N: str = N_OPT, S: str = S_OPT, m: str = M_OPT, kappa: str = KAPPA_OPT,
    eps: str = EPS_OPT, beta: str = BETA_OPT, L: int = L_OPT, gamma: float = GAMMA_OPT,
    rho: str = typer.Option(None, help="Comma list of initial radii rho."),
    steps: int = STEPS_FLOW, eta: float = ETA_OPT,
    runs: int = typer.Option(None, help="Independent initialisations per setting."),
    batch: int = typer.Option(None, help="Monte Carlo contexts per step and run."),
    seed: int = SEED, threads: int = THREADS, progress: bool = PROGRESS,
) -> None:
    """Theorem 2: does gradient flow on log-linear gates concentrate each head on one position?

    Runs small-step gradient descent from a ball of radius rho and tracks, uniformly over held-out contexts,
    p^K(r_h) and p^V(r_h + 1) per head; reports chosen positions and the collision rate against independent
    uniform choice. Writes summary.json, results.parquet, gate_paths.png, collision_rate.png.
    """
    grid, opts = _settings(checks.FLOW_GRIDS, checks.FLOW_OPTS, quick, (N, S, m, kappa, eps, beta, L, gamma),
                           runs=runs, steps=steps, eta=eta, batch=batch, seed=seed)
    rhos = _list(rho, float, "rho") or checks.FLOW_RHOS["quick" if quick else "full"]
    _report(checks.flow_check(out, grid, opts, rhos, progress=progress, threads=threads), out)


@app.command()
def coverage(
    out: Path = OUT, quick: bool = QUICK, N: str = N_OPT, S: str = S_OPT, m: str = M_OPT, kappa: str = KAPPA_OPT,
    eps: str = EPS_OPT, beta: str = BETA_OPT, L: int = L_OPT, gamma: float = GAMMA_OPT,
    n_test: int = N_TEST,
    rho: float = typer.Option(None, help="Initial radius rho."),
    runs: int = typer.Option(None, help="Trained models per setting."),
    steps: int = STEPS_FLOW, eta: float = ETA_OPT,
    seed: int = SEED, threads: int = THREADS, progress: bool = PROGRESS,
) -> None:
    """Coverage: are positions that no head selected weak phases?

    Trains idealised models by gradient flow, then measures retrieval accuracy by query position next to each
    head's chosen position (and the distinct Theorem 1 optimum). Writes summary.json, results.parquet,
    flow.parquet, accuracy_by_position.png.
    """
    grid, opts = _settings(checks.COVERAGE_GRIDS, checks.COVERAGE_OPTS, quick, (N, S, m, kappa, eps, beta, L, gamma),
                           rho=rho, runs=runs, steps=steps, eta=eta, seed=seed)
    if n_test < 1:
        raise ConfigError(f"--n-test must be >= 1, got {n_test}")
    _report(checks.coverage_check(out, grid, opts, n_test=n_test, progress=progress, threads=threads), out)


def _validate_counts(opts: MinimiserOptions | FlowOptions) -> None:
    for k, v in asdict(opts).items():
        if k in ("starts", "steps", "runs", "batch", "eval_contexts", "contexts", "track_every") and v < 1:
            raise ConfigError(f"--{k.replace('_', '-')} must be >= 1, got {v}")
        if k in ("lr", "eta", "rho") and v <= 0:
            raise ConfigError(f"--{k} must be > 0, got {v}")
