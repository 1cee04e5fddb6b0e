"""Provenance of every output: package versions and the git revision of the code that wrote it."""

from __future__ import annotations

import platform
import subprocess
from functools import cache
from importlib import metadata
from pathlib import Path


@cache
def git_revision() -> str | None:
    """Short commit of the phasekv checkout (with '-dirty' when it has uncommitted changes), None outside git."""
    root = Path(__file__).resolve().parents[1]
    try:
        rev = subprocess.run(["git", "-C", str(root), "rev-parse", "--short", "HEAD"], capture_output=True,
                             text=True, timeout=5).stdout.strip()
        if not rev:
            return None
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
        return rev + ("-dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def versions(*packages: str) -> dict:
    """phasekv, torch, numpy, python, the given packages (read from metadata, not imported) and git."""
    import numpy
    import torch

    out = {"phasekv": _installed("phasekv"), "torch": torch.__version__, "numpy": numpy.__version__,
           "python": platform.python_version()}
    out.update({p: _installed(p) for p in packages})
    out["git"] = git_revision()
    return out


def _installed(package: str) -> str | None:
    """The installed version of `package` (from its metadata: phasekv's own without importing the package root)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None
