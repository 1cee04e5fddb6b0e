"""phasekv: find, explain and repair periodic weak spots of compressed-KV-cache language models."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from phasekv.config import ModelConfig
    from phasekv.model.transformer import PhaseLM

__all__ = ["ModelConfig", "PhaseLM"]
__version__ = "0.1.0"

# Imported on first use (PEP 562): a submodule that needs torch alone (`python -m phasekv.kernels`, which the
# set-up runs while pip still installs the other dependencies) does not pull in the model and its dependencies.
_HOME = {"ModelConfig": "phasekv.config", "PhaseLM": "phasekv.model.transformer"}


def __getattr__(name: str):
    if name in _HOME:
        return getattr(importlib.import_module(_HOME[name]), name)
    raise AttributeError(f"module 'phasekv' has no attribute {name!r}")
