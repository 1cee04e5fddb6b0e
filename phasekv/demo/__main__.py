"""`python -m phasekv.demo`: import what `phasekv demo` runs (the runner, the report and every room a stage imports
when it runs: the `from phasekv...` lines of `stages`), which writes their byte code. `make demo`'s set-up runs
it instead of compiling every installed package: the demo imports ~1,800 of their ~10,800 files (measured)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import phasekv.demo.runner  # noqa: F401  the main process's modules, the report's too
from phasekv.demo import stages


def rooms() -> list[str]:
    """The phasekv modules the stages import (inside their functions: each in the worker that runs it)."""
    tree = ast.parse(Path(stages.__file__).read_text(encoding="utf-8"))
    return sorted({n.module for n in ast.walk(tree)
                   if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("phasekv.")})


if __name__ == "__main__":
    for room in rooms():
        importlib.import_module(room)
