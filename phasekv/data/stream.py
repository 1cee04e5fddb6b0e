"""Deterministic, index-addressed example streams (the data position of a run is one integer).

Every stream maps a global example index to one fixed-length example, drawing its randomness from
`np.random.default_rng([seed, salt, index])`. Step `s` of a run with global batch `B` reads indices
`s*B .. s*B+B-1`, so resuming needs only the next index, and a rank of a distributed run reads its
own slice of the same indices (the global batch is identical for any world size).

Labels are already shifted: `labels[t]` is the token position `t` must predict (-100 = no loss).
`answer_pos[t]` is, for recall answers, the position of the record's key that the answer belongs to
(-1 elsewhere); it groups accuracy by the phase of the stored record.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from phasekv.errors import ConfigError

IGNORE = -100
SPLIT_SALT = {"train": 0, "val": 1, "probe": 2}


@dataclass
class Example:
    """One fixed-length training example: input ids, shifted labels and, for recall, the answers' key positions."""

    ids: np.ndarray  # (T,) int64 input tokens
    labels: np.ndarray  # (T,) int64 next-token targets, IGNORE where no loss
    answer_pos: np.ndarray | None = None  # (T,) int64 record-key position of a recall answer, -1 elsewhere


class Stream(Protocol):
    """Anything that maps a global example index to one Example of `seq_len` tokens (recall, text, mixture)."""

    seq_len: int

    def example(self, index: int) -> Example: ...


def rng_for(seed: int, split: str, index: int, salt: int = 0) -> np.random.Generator:
    """The generator of one example: independent across seeds, splits, streams (salt) and indices."""
    return np.random.default_rng([seed, SPLIT_SALT[split], salt, index])


def collate(examples: Sequence[Example]) -> dict[str, torch.Tensor]:
    """Stack examples into `input_ids`, `labels` (B, T) and, when all have it, `answer_pos` (B, T)."""
    out = {
        "input_ids": torch.from_numpy(np.stack([e.ids for e in examples])),
        "labels": torch.from_numpy(np.stack([e.labels for e in examples])),
    }
    if all(e.answer_pos is not None for e in examples):
        out["answer_pos"] = torch.from_numpy(np.stack([e.answer_pos for e in examples]))
    return out


def length(e: Example) -> int:
    """Tokens up to and including an example's last target (1 if it has none): the rest is padding."""
    targets = np.flatnonzero(e.labels != IGNORE)
    return int(targets[-1]) + 1 if targets.size else 1


def by_length(examples: Sequence[Example], n: int) -> list[dict[str, torch.Tensor]]:
    """`examples` in `n` collated micro-batches of similar length, shortest first, each cut after its longest
    example's last target: a causal model gives every target the same logits as in one batch, over less padding."""
    lengths = [length(e) for e in examples]
    order = sorted(range(len(examples)), key=lengths.__getitem__)  # stable: ties keep index order
    size = -(-len(examples) // n)
    out = []
    for a in range(0, len(order), size):
        group = order[a : a + size]
        cut = max(lengths[i] for i in group)
        out.append({k: v[:, :cut] for k, v in collate([examples[i] for i in group]).items()})  # (b, cut) each
    return out


def batch(stream: Stream, start: int, n: int) -> dict[str, torch.Tensor]:
    """Examples `start .. start+n-1` of a stream, collated."""
    return collate([stream.example(i) for i in range(start, start + n)])


class MixtureStream:
    """Each index picks one source stream with probability proportional to its weight (e.g. text + recall)."""

    def __init__(self, streams: Sequence[Stream], weights: Sequence[float], seed: int, split: str = "train"):
        lens = {s.seq_len for s in streams}
        if len(lens) != 1:
            raise ValueError(f"mixture streams need one seq_len, got {sorted(lens)}")
        w = np.asarray(weights, dtype=np.float64)
        if len(w) != len(streams) or (w < 0).any() or w.sum() <= 0:
            raise ValueError(f"mixture weights must be non-negative with a positive sum, got {list(weights)}")
        self.streams, self.p = list(streams), w / w.sum()
        self.seed, self.split, self.seq_len = seed, split, lens.pop()

    def example(self, index: int) -> Example:
        k = rng_for(self.seed, self.split, index, salt=99).choice(len(self.streams), p=self.p)
        ex = self.streams[k].example(index)
        if ex.answer_pos is None:  # keep batches collatable when text and recall mix
            ex.answer_pos = np.full_like(ex.ids, -1)
        return ex


def known_options(cls, d: dict, kind: str):
    """A data config dataclass `cls` from a dict, refusing keys it does not declare in one line."""
    unknown = set(d) - set(cls.__dataclass_fields__)
    if unknown:
        raise ConfigError(f"unknown {kind} option(s): {', '.join(sorted(unknown))}")
    return cls(**d)
