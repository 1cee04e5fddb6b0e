"""Outputs of the theory checks: parquet/json/PNG writers (atomic, `phasekv.io`), provenance, progress bars."""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

import phasekv.io
from phasekv.errors import ConfigError
from phasekv.progress import Progress


def prepare_out(out: str | os.PathLike) -> Path:
    path = Path(out)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"--out {path} exists and is not a directory")
    path.mkdir(parents=True, exist_ok=True)
    return path


def write_parquet(df: pd.DataFrame, path: Path) -> None:
    phasekv.io.write_parquet(path, df)


def write_json(obj: dict, path: Path) -> None:
    phasekv.io.write_text(path, json.dumps(phasekv.io.jsonable(obj), indent=2) + "\n")


def save_figure(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    phasekv.io.write_figure(path, fig, dpi=120, bbox_inches="tight")
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


def progress_bar(enabled: bool = True) -> Progress:
    """The theory checks' progress display (disabled: shows nothing)."""
    return Progress(disable=not enabled)
