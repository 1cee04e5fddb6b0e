"""Needle-format training data: the task of `phasekv eval needle`, at the training length.

One sequence (word tokenizer, one token per word), the needle test's layout (`phasekv.eval.prompts`):

    <bos> [gap_0] rec_0 [gap_1] rec_1 ... rec_{R-1} [gap_R]  query_1 ... query_Q  <pad>...
    rec = two-animal key, name, separator ("ant cod Maria ;"); query = a record of the context repeated

Records pair a distinct two-animal key with a distinct name, as the needle draws them from the whole lists; the
filler (seq_len less the records and queries) is split at random between the records (the needle's
`in-sequence` padding), so targets sit at every depth and phase. The needle test's demonstrations and target key
are queries: here every query is a record of the context, drawn with replacement among those at least
`min_distance` tokens back (`phasekv.data.recall`: without replacement a model scores by elimination), and the
loss is on each query's name. The record count defaults to the needle's density at the sequence length (125 at
1,024 tokens) and grows to it over a curriculum, as the recall data's does.

The layout (`record`, `layout`, `composition`, `NEEDLE_DENSITY`) is the one the evaluation's prompts are built
with, so the training task and the test cannot drift apart.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass

import numpy as np
from tokenizers import Tokenizer

from phasekv.data.recall import word_ids
from phasekv.data.stream import IGNORE, Example, known_options, rng_for
from phasekv.data.tokenizer import build_word_tokenizer, special_ids
from phasekv.data.words import load_words
from phasekv.errors import ConfigError, DataError

NEEDLE_DENSITY = 16000 / 131072  # records per context token in the study's needle test (16,000 in 128K)
KEY_WORDS = 2  # words per needle key: two animals


def needle_records(context: int) -> int:
    """The study's record count scaled to `context` tokens (its density; at least 16): 125 at 1,024."""
    return max(16, round(context * NEEDLE_DENSITY))


def record(key: Sequence[str], value: str, sep: str | None) -> list[str]:
    """One record's words: the key, its value, the separator (if any)."""
    return [*key, value, *([sep] if sep is not None else [])]


def layout(records: Sequence[list[str]], gaps: Sequence[int], filler: Iterator[str], queries: Sequence[list[str]],
           marker: str | None = None) -> list[str]:
    """A retrieval sequence's words: gaps[i] filler words before record i, gaps[R] after the last, the marker (if
    any), then the queries (records repeated; a prompt's last is the target's key alone)."""
    out: list[str] = []
    for gap, rec in zip(gaps, records, strict=False):
        out.extend(next(filler) for _ in range(gap))
        out.extend(rec)
    out.extend(next(filler) for _ in range(gaps[len(records)]))
    if marker is not None:
        out.append(marker)
    for q in queries:
        out.extend(q)
    return out


def composition(total: int, parts: int, rng: np.random.Generator) -> np.ndarray:
    """Uniformly random split of `total` into `parts` non-negative integers (stars and bars)."""
    if parts == 1:
        return np.array([total], dtype=np.int64)
    bars = np.sort(rng.choice(total + parts - 1, parts - 1, replace=False))
    return np.diff(np.concatenate([[-1], bars, [total + parts - 1]])) - 1


@dataclass
class NeedleConfig:
    """Layout of a needle-format training sequence (module doc)."""

    seq_len: int = 1024  # tokens per sequence incl. <bos>; what records and queries leave is filler between records
    min_records: int = 0  # records per sequence, uniform in [min_records, max_records] (0: max_records)
    max_records: int = 0  # (0: the needle test's density at seq_len, 125 at 1,024 tokens)
    queries: int = 8  # records repeated after the context, loss on each name (the test has 2 demonstrations and
    #                   the target: 3)
    curriculum: int = 0  # training examples over which the record range grows from 1 to [min, max] (0 = off)
    min_distance: int = 16  # a queried record's key is at least this many tokens before its query (beyond the
    #                         local window of 16 exact tokens)
    keys: str = "animals"  # word list of the key words (the needle's: the whole lists)
    values: str = "names"  # word list of the values
    filler: str = "filler"  # word list of the gaps
    separator: str = ";"  # token after each record's value (the needle's `auto` resolves to ";" in the word tokenizer)

    def __post_init__(self):
        if min(self.min_records, self.max_records, self.curriculum, self.min_distance) < 0 or self.queries < 1:
            raise ConfigError("needle: records, curriculum and min_distance must be >= 0, queries >= 1")
        if self.min_records > self.records:
            raise ConfigError(f"needle: min_records={self.min_records} > max_records={self.records}")

    @property
    def records(self) -> int:
        """Most records per sequence: max_records, or the needle's density at seq_len."""
        return self.max_records or needle_records(self.seq_len)

    @property
    def record_len(self) -> int:
        return KEY_WORDS + 1 + 1

    def check_fits(self) -> None:
        """Refuse a seq_len too short for the records and the queries."""
        need = 1 + (self.records + self.queries) * self.record_len
        if self.seq_len < need:
            raise ConfigError(f"needle seq_len={self.seq_len} is too short for {self.records} records and "
                              f"{self.queries} queries of {self.record_len} tokens (need >= {need})")

    @classmethod
    def from_dict(cls, d: dict) -> NeedleConfig:
        return known_options(cls, d, "needle")

    def to_dict(self) -> dict:
        return asdict(self)


def needle_tokenizer(cfg: NeedleConfig) -> Tokenizer:
    """Word tokenizer of a needle run: its three word lists (and the separators), one token per word."""
    return build_word_tokenizer(lists=(cfg.keys, cfg.values, cfg.filler))


class NeedleStream:
    """Index-addressed needle-format examples (see module doc); `split` picks disjoint random streams."""

    def __init__(self, tok: Tokenizer, cfg: NeedleConfig | None = None, seed: int = 0, split: str = "train"):
        self.cfg = cfg = cfg or NeedleConfig()
        cfg.check_fits()
        self.seed, self.split, self.seq_len = seed, split, cfg.seq_len
        self.keys, self.values, self.filler = (load_words(n) for n in (cfg.keys, cfg.values, cfg.filler))
        if len(self.keys) ** KEY_WORDS < cfg.records or len(self.values) < cfg.records:
            raise ConfigError(f"needle: {cfg.records} records exceed the {len(self.keys)} keys / {len(self.values)} "
                              "values")
        words = [*self.keys, *self.values, *self.filler, cfg.separator]
        ids = word_ids(tok, words, "needle")
        if any(len(i) != 1 for i in ids):
            bad = next(w for w, i in zip(words, ids, strict=True) if len(i) != 1)
            raise DataError(f"needle data needs one token per word; the tokenizer splits {bad!r} (use the word "
                            "tokenizer)")
        self.id = {w: i[0] for w, i in zip(words, ids, strict=True)}
        sp = special_ids(tok)
        self.bos = [sp["bos"]] if sp["bos"] is not None else []
        self.pad = sp["pad"] if sp["pad"] is not None else 0

    def record_range(self, index: int) -> tuple[int, int]:
        """Record-count range of example `index`: with a curriculum, training starts at 1 record and reaches
        [min_records, max_records] after `curriculum` examples (held-out splits always use the full range)."""
        c = self.cfg
        lo, hi = c.min_records or c.records, c.records
        if not c.curriculum or self.split != "train" or index >= c.curriculum:
            return lo, hi
        f = index / c.curriculum
        return 1 + round((lo - 1) * f), 1 + round((hi - 1) * f)

    @property
    def chance(self) -> float:
        """Accuracy of naming a random record of the sequence (held-out: the full record range)."""
        lo, hi = self.cfg.min_records or self.cfg.records, self.cfg.records
        return float(np.mean(1 / np.arange(lo, hi + 1)))

    def example(self, index: int) -> Example:
        c, L, b = self.cfg, self.cfg.record_len, len(self.bos)
        rng = rng_for(self.seed, self.split, index)
        lo, hi = self.record_range(index)
        n = int(rng.integers(lo, hi + 1))
        nk = len(self.keys)
        keys = [(self.keys[i // nk], self.keys[i % nk]) for i in rng.choice(nk * nk, n, replace=False)]
        values = [self.values[i] for i in rng.choice(len(self.values), n, replace=False)]
        records = [record(k, v, c.separator) for k, v in zip(keys, values, strict=True)]
        G = c.seq_len - b - (n + c.queries) * L + 1  # filler: the last query needs no separator
        gaps = composition(G, n + 1, rng)
        starts = b + np.cumsum(gaps[:n]) + L * np.arange(n)  # (n,) each record's first key token
        context_end = b + G + n * L
        ready = np.flatnonzero(starts <= context_end - c.min_distance)  # records far enough back for any query
        if not ready.size:
            ready = np.array([0])
        asked = rng.choice(ready, c.queries)  # with replacement
        fill = iter(rng.integers(0, len(self.filler), G).tolist())
        words = layout(records, gaps, (self.filler[i] for i in fill), [records[q] for q in asked])
        ids = np.array(self.bos + [self.id[w] for w in words[: c.seq_len - b]], dtype=np.int64)  # (<= T,)
        labels = np.full(c.seq_len, IGNORE, dtype=np.int64)
        answer = np.full(c.seq_len, -1, dtype=np.int64)
        query_pos = context_end + L * np.arange(c.queries) + KEY_WORDS - 1  # (Q,) each query's last key token
        labels[query_pos] = ids[query_pos + 1]
        answer[query_pos] = starts[asked]
        return Example(np.concatenate([ids, np.full(c.seq_len - len(ids), self.pad, dtype=np.int64)]), labels, answer)
