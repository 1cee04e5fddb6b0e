"""The grid family beyond the study: attention designs whose memory sits on a fixed block grid.

`DESIGNS` names, per `ModelConfig.family`, the module and class of each design (NSA, MoBA, Activation Beacon);
`make_attention` builds a layer's attention: the study's `Attention` (full attention or a compressor) when the
config has no family, else the design's class. Every design has `Attention`'s interface (forward, `z_hook`,
`new_cache`) plus `grids()`, its grid periods ({name: tokens}, `ModelConfig.grids`): the strides its periodicity
tests use.
A design is imported when first built, so one that fails to import breaks only the models that use it.
"""

from __future__ import annotations

import importlib

from torch import nn

from phasekv.attention.attention import Attention
from phasekv.config import ModelConfig
from phasekv.config.model import FAMILIES
from phasekv.errors import ConfigError

DESIGNS: dict[str, str] = {  # family -> "module:Class"
    "nsa": "phasekv.attention.nsa:NSAAttention",
    "moba": "phasekv.attention.moba:MoBAAttention",
    "beacon": "phasekv.attention.beacon:BeaconAttention",
}
if set(DESIGNS) != set(FAMILIES):
    raise ImportError(f"attention.family: designs {sorted(DESIGNS)} differ from config's FAMILIES {sorted(FAMILIES)}")


def design_class(family: str) -> type[nn.Module]:
    """The attention class of a family design."""
    if family not in DESIGNS:
        raise ConfigError(f"family={family!r}: must be one of {', '.join(DESIGNS)}")
    module, _, cls = DESIGNS[family].partition(":")
    try:
        return getattr(importlib.import_module(module), cls)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"family={family!r}: its attention ({DESIGNS[family]}) is not available: {e}") from e


def make_attention(cfg: ModelConfig, layer: int) -> nn.Module:
    """Layer `layer`'s attention: the design of `cfg.family`, or the study's `Attention` when there is none."""
    if cfg.family is None:
        return Attention(cfg, layer)
    return design_class(cfg.family)(cfg, layer)

