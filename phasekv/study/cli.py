"""The command-line options of where a task graph runs, one set for `phasekv demo`, `study` and `sweep`:
`--device`, `--executor local|slurm`, `--wait` and the `--slurm-*` resources (`phasekv.study.slurm.SlurmOptions`)."""

from __future__ import annotations

import typer

from phasekv.errors import ConfigError
from phasekv.study.slurm import SlurmOptions

DEVICE = typer.Option("cpu", "--device", help="Device of every training, evaluation and analysis: cpu, cuda or "
                      "cuda:N.")
EXECUTOR = typer.Option("local", "--executor", help="Where the tasks run: local (worker processes here) or slurm "
                        "(a SLURM job per task, through submitit; OUT on a file system every node mounts).")
WAIT = typer.Option(False, "--wait", help="slurm: stay until every task is done (progress bars, then the report); "
                    "without it the driver queues the graph and leaves.")
PARTITION = typer.Option(None, "--slurm-partition", help="slurm: the partition of every job (default: the "
                         "cluster's).")
NODES = typer.Option(1, "--slurm-nodes", help="slurm: nodes of each training job.")
GPUS = typer.Option(0, "--slurm-gpus-per-node", help="slurm: GPUs of a training job per node (one rank each; "
                    "an evaluation job gets one); 0: CPUs only, no GPU request.")
RANKS = typer.Option(None, "--slurm-ranks-per-node", help="slurm: ranks of a training per node (default: the GPUs "
                     "per node, or 1).")
CPUS = typer.Option(1, "--slurm-cpus-per-task", help="slurm: CPU cores of each rank.")
TIME = typer.Option(60, "--slurm-time", help="slurm: minutes of each job; a job at its limit is requeued and "
                    "resumes (a training from its latest checkpoint).")
PARAM = typer.Option(None, "--slurm-param", metavar="KEY=VALUE", help="slurm: any further sbatch parameter "
                     "(repeatable), e.g. account=proj or qos=high.")


def cluster_options(executor: str, wait: bool, partition: str | None, nodes: int, gpus: int, ranks: int | None,
                    cpus: int, time: int, params: list[str] | None) -> SlurmOptions | None:
    """The SLURM options of `--executor slurm` (None: the local pool)."""
    if executor not in ("local", "slurm"):
        raise ConfigError(f"--executor {executor!r} must be local or slurm")
    extra = {}
    for p in params or []:
        key, sep, value = p.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--slurm-param {p!r} must be KEY=VALUE")
        extra[key.strip()] = value.strip()
    if executor == "local":
        return None
    return SlurmOptions(partition=partition, nodes=nodes, gpus_per_node=gpus, ranks_per_node=ranks,
                        cpus_per_task=cpus, time=time, params=extra, wait=wait)


