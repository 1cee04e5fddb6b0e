"""Outputs of the theory checks: atomic parquet/json writes, provenance, progress bars."""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from phasekv.errors import ConfigError


def prepare_out(out: str | os.PathLike) -> Path:
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--out {path} exists and is not a directory")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _atomic(path: Path, write) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


def write_parquet(df: pd.DataFrame, path: Path) -> None:
    _atomic(path, lambda tmp: df.to_parquet(tmp, index=False))


def _jsonable(obj):
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_jsonable(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, float) and not np.isfinite(obj):
        return None
    return obj


def write_json(obj: dict, path: Path) -> None:
    def write(tmp):
        with open(tmp, "w") as f:
            json.dump(_jsonable(obj), f, indent=2)
            f.write("\n")

    _atomic(path, write)


def save_figure(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    _atomic(path, lambda tmp: fig.savefig(tmp, dpi=120, bbox_inches="tight", format="png"))
    plt.close(fig)


def provenance(command: str, config: dict, seed: int) -> dict:
    try:
        from importlib.metadata import version

        pkg = version("phasekv")
    except Exception:  # not pip-installed: running from the source tree
        pkg = "source"
    return {
        "command": command,
        "argv": sys.argv,
        "seed": seed,
        "config": config,
        "versions": {
            "phasekv": pkg,
            "python": platform.python_version(),
            "torch": torch.__version__,
            "numpy": np.__version__,
            "pandas": pd.__version__,
        },
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


@contextmanager
def progress_bar(enabled: bool = True):
    """A rich progress bar (disabled: a no-op object with the same interface)."""
    prog = Progress(
        TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
        disable=not enabled, transient=False,
    )
    with prog:
        yield prog
