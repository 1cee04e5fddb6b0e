"""phasekv: find, explain and repair periodic weak spots of compressed-KV-cache language models."""

from __future__ import annotations

from typing import TYPE_CHECKING

from phasekv.lazy import exports

if TYPE_CHECKING:
    from phasekv.config import ModelConfig
    from phasekv.model.transformer import PhaseLM

__all__ = ["ModelConfig", "PhaseLM"]
__version__ = "0.1.0"

# Imported on first use (PEP 562): a submodule that needs torch alone (`python -m phasekv.kernels`, which the
# set-up runs while pip still installs the other dependencies) does not pull in the model and its dependencies.
__getattr__ = exports(__name__, {"ModelConfig": "phasekv.config", "PhaseLM": "phasekv.model.transformer"})
