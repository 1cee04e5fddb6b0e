"""The readable word lists phasekv ships (one word a line, in `phasekv/data/words/*.txt`), and prompt words
taken from a tokenizer's own vocabulary when those lists are not single tokens in it.

`animals` are recall keys, `names` are recall values, `filler` pads prefixes and gaps. The lookup
evaluation draws its prompts from the same lists, so every word is one token of the word tokenizer.
A tokenizer trained on real text (a small byte-level BPE) splits most animals and names into several
tokens; recall data and prompts then take their keys, values and filler from the tokenizer's own
single-token words instead (`choose_words`, `vocab_words`), so a model trained on text is evaluated on
words it knows, with one token per key and value as the position-matched tests need.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from functools import cache
from pathlib import Path

from phasekv.errors import ConfigError, DataError

WORDS_DIR = Path(__file__).parent / "words"
ROLES = ("keys", "values", "filler")  # the three word pools of recall data and retrieval prompts
WORD_SOURCES = ("auto", "lists", "vocab")  # lists: the shipped lists; vocab: the tokenizer's own words;
# auto: the lists when they give enough single-token words, else the vocabulary
MIN_LETTERS = 3  # vocabulary words have at least this many letters (shorter tokens are mostly word pieces)


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


def choose_words(source: str, lists: dict[str, list[str]], need: dict[str, int], single: Callable[[str], bool],
                 texts: Iterable[str]) -> tuple[str, dict[str, list[str]]]:
    """("lists" or "vocab", role -> words) for a source setting (WORD_SOURCES): the shipped `lists` (role ->
    words), or the vocabulary's words (`vocab_words`, decoded tokens `texts`), as many per role as the lists.
    "auto" keeps the lists when every role has `need[role]` words that are one token (`single`), else takes the
    vocabulary when it has `need[role]` words per role, else the lists again (split words and all: a tokenizer
    too small for either). The three roles always come from one source, so pools never mix (a vocabulary key
    could be a filler word of the lists)."""
    if source not in WORD_SOURCES:
        raise ConfigError(f"words must be one of {', '.join(WORD_SOURCES)}, got {source!r}")
    if source == "lists" or source == "auto" and all(sum(map(single, lists[r])) >= need[r] for r in ROLES):
        return "lists", lists
    pools = vocab_words(texts, single, max(len(w) for w in lists.values()))
    words = {r: pools[r][: len(lists[r])] for r in ROLES}
    if source == "auto" and any(len(words[r]) < need[r] for r in ROLES):
        return "lists", lists
    return "vocab", words


def vocab_words(texts: Iterable[str], single: Callable[[str], bool], per_role: int) -> dict[str, list[str]]:
    """Up to `per_role` keys, values and filler words from a tokenizer's vocabulary: `texts` are its tokens
    decoded one by one in id order (special tokens decode to ''), kept when alphabetic ASCII of at least
    MIN_LETTERS letters, distinct ignoring case and one token mid-text (`single`). Id order is frequency order
    for a BPE (frequent pairs merge first), so the most frequent words come first; they are dealt in turn
    to keys, values and filler, so each role's first n words do not depend on `per_role`."""
    pool: list[str] = []
    seen: set[str] = set()
    for text in texts:
        w = text.strip()
        if len(w) >= MIN_LETTERS and w.isascii() and w.isalpha() and w.lower() not in seen and single(w):
            seen.add(w.lower())
            pool.append(w)
            if len(pool) == per_role * len(ROLES):
                break
    return {role: pool[i :: len(ROLES)] for i, role in enumerate(ROLES)}
