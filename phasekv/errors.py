"""One exception family for every user-facing failure.

The CLI turns these into a one-line message and a non-zero exit (no traceback unless --debug);
the Python API raises them as they are. Messages name the field, file or value at fault.
"""


class PhaseKVError(Exception):
    """Base of every error phasekv raises on purpose."""


class ConfigError(PhaseKVError, ValueError):
    """An invalid model, training or evaluation setting (names the field and the value)."""


class ModelNameError(ConfigError):
    """A model name that does not parse (lists the known attributes)."""


class CheckpointError(PhaseKVError):
    """A missing, corrupt or mismatched checkpoint/weights file (names the file)."""


class DataError(PhaseKVError, ValueError):
    """Unusable input data: empty/unreadable/non-UTF-8 corpus, missing words, bad prompt (names file/line)."""
