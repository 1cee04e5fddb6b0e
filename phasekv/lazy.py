"""Package attributes imported on first use (PEP 562): what a package exports without importing it up front."""

from __future__ import annotations

import importlib
from collections.abc import Callable


def exports(package: str, home: dict[str, str]) -> Callable[[str], object]:
    """The module `__getattr__` of `package` that imports each name of `home` (name -> its module) when first read."""

    def __getattr__(name: str) -> object:
        if name in home:
            return getattr(importlib.import_module(home[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
