"""phasekv: find, explain and repair periodic weak spots of compressed-KV-cache language models."""

from phasekv.config import ModelConfig
from phasekv.model.transformer import PhaseLM

__all__ = ["ModelConfig", "PhaseLM"]
__version__ = "0.1.0"
