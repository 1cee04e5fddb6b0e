"""The readable word lists phasekv ships (one word a line, in `phasekv/data/words/*.txt`).

`animals` are recall keys, `names` are recall values, `filler` pads prefixes and gaps. The lookup
evaluation draws its prompts from the same lists, so every word is one token of the word tokenizer.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from phasekv.errors import DataError

WORDS_DIR = Path(__file__).parent / "words"


def list_names() -> list[str]:
    """Names of the shipped lists (file stems), e.g. ['animals', 'filler', 'names']."""
    return sorted(p.stem for p in WORDS_DIR.glob("*.txt"))


@cache
def _load(name: str) -> tuple[str, ...]:
    path = WORDS_DIR / f"{name}.txt"
    if not path.is_file():
        raise DataError(f"unknown word list {name!r}; shipped lists: {', '.join(list_names())}")
    words = tuple(w.strip() for w in path.read_text(encoding="utf-8").splitlines() if w.strip())
    for lineno, w in enumerate(words, 1):
        if len(w.split()) != 1:
            raise DataError(f"{path}:{lineno}: word list entries must be single words, got {w!r}")
    if len(set(words)) != len(words):
        raise DataError(f"{path}: duplicate words")
    return words


def load_words(name: str) -> list[str]:
    """The words of one shipped list, in file order (a fresh list, safe to mutate)."""
    return list(_load(name))
