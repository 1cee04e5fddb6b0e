"""Layer 2 (above errors/io): what a model *is*, as data. `ModelConfig` (a Qwen3-shaped backbone plus the study's
compression attributes), its presets, and the paper-style names that map to it and back.

It sits below `attention` and `model` because both build modules from a config; it imports nothing but
`phasekv.errors`, so every layer above can describe a model without building one.
"""

from phasekv.config.model import (
    BACKBONE_FIELDS,
    CONFIG_VERSION,
    GATES,
    PRESETS,
    ModelConfig,
    entries_per_record,
    format_overrides,
    parse_overrides,
    preset_fields,
)

__all__ = ["BACKBONE_FIELDS", "CONFIG_VERSION", "GATES", "PRESETS", "ModelConfig", "entries_per_record",
           "format_overrides", "parse_overrides", "preset_fields"]
