"""Synthetic associative recall: the default training data, built for phase studies.

One sequence (word-level tokenizer, one token per word):

    <bos> [prefix filler]  k1 v1 [gap]  k2 v2 [gap] ... kN vN [gap]  ?  k7 v7 [gap]  k2 v2 [gap] ...  <pad>...

Records pair a key (an animal) with a value (a given name); keys and values are distinct within a
sequence. A random filler prefix (0..max_prefix-1 tokens, 24 = every residue mod 24) and random filler
gaps move the records over every phase of every stride. After the marker `?` come as many queries as records,
each a stored key drawn at random *with replacement* among those at least `min_distance` (16) tokens back
(beyond the local window of exact tokens); the loss is only on the value that follows a queried key.
Drawing with replacement matters: when every key is asked exactly once, a model can score by eliminating the
names already asked for, a shortcut that holds it on a plateau for thousands of steps before it learns to
bind keys to names (measured at the tiny preset: 16 records stay near chance for 1,500+ steps with the
permutation, and bind at ~1,000 steps with replacement).
With `repeat_prob` > 0 that share of the training sequences is instead a random run of keys and names shown
twice (loss on the second copy), the classic trigger of induction heads: on recall alone, full attention with 8
query heads stays on the "any name in the context" plateau for thousands of steps (see `repeat_prob`).
The held-out lookup evaluation uses another layout (64 adjacent records, 8 demonstrations, one target,
no marker), so it is never trained on verbatim.

With a tokenizer that splits those words (a BPE trained on text, recall mixed in with `--recall-mix`), keys,
values and filler are its own single-token words instead (`words`, `phasekv.data.words`): the words the
evaluation of such a run uses, one token each.
"""

from __future__ import annotations

import bisect
from dataclasses import asdict, dataclass

import numpy as np
import torch
from tokenizers import Tokenizer

from phasekv.data.stream import IGNORE, Example, batch, known_options, rng_for
from phasekv.data.tokenizer import build_word_tokenizer, special_ids
from phasekv.data.words import WORD_SOURCES, choose_words, load_words
from phasekv.errors import ConfigError, DataError


@dataclass
class RecallConfig:
    """Layout of a synthetic recall sequence (see module doc): records, prefix, gaps, queries, word lists."""

    seq_len: int = 96  # tokens per sequence incl. <bos>; the tail after the last query is padding
    min_records: int = 2  # records per sequence, uniform in [min_records, max_records] (fewer when a long
    #                       prefix and gaps leave no room: the records that fit, then at least one query)
    max_records: int = 16  # (a mix of short and long sequences: the short ones teach binding soonest)
    max_prefix: int = 24  # filler tokens before the first record: uniform in 0..max_prefix-1
    gap_prob: float = 0.25  # chance that a record or query is followed by filler
    max_gap: int = 2  # a gap holds 1..max_gap filler tokens
    keys: str = "animals"  # word list of the keys
    key_words: int = 1  # words per key: 1 (an animal) or 2 (two animals, distinct pairs, as the needle's keys)
    values: str = "names"  # word list of the values
    filler: str = "filler"  # word list of prefixes and gaps
    words: str = "auto"  # where keys, values and filler come from: "lists" (the three lists above), "vocab" (the
    #                      tokenizer's own single-token words, as many as the lists give) or "auto" (the lists
    #                      when every word of them is one token, else the vocabulary: a BPE trained on text)
    n_keys: int = 32  # use only the first n keys (0 = the whole list); 32 keys and 32 names learn in minutes
    n_values: int = 32  # use only the first n values (0 = the whole list)
    marker: str = "?"  # token between the records and the queries
    query_gaps: bool = False  # filler gaps between queries too (only the records' phases matter)
    curriculum: int = 0  # training examples over which the record range grows from 1 to [min, max] (0 = off)
    repeat_prob: float = 0.0  # share of training sequences that are a random run of keys and names shown twice,
    #                           loss on the second copy (held-out splits have none): it teaches the copy circuit
    #                           (a previous-token head feeding a matching head) that recall needs. Without it full
    #                           attention at 8 query heads stayed at chance (18.7% at 1,600 steps, seed 42); with
    #                           0.25 it reached 99.9% (seed 42) and 100% (43) by 1,000 (measured, README)
    repeat_until: int = 0  # only training examples before this index may be repeats (0 = all): a copy warm-up
    #                        that leaves the rest of training to recall (in examples, as `curriculum`)
    min_distance: int = 16  # a query is at least this many tokens after its record's key, i.e. beyond the
    #                         default local window of 16 exact tokens: answers must come from compressed memory

    def __post_init__(self):
        if not 1 <= self.min_records <= self.max_records:
            raise ConfigError(f"recall records: need 1 <= min_records <= max_records, got {self.min_records}, {self.max_records}")
        if self.words not in WORD_SOURCES:
            raise ConfigError(f"recall words must be one of {', '.join(WORD_SOURCES)}, got {self.words!r}")
        if self.key_words not in (1, 2):
            raise ConfigError(f"recall key_words must be 1 or 2, got {self.key_words}")
        if (self.max_prefix < 1 or self.max_gap < 1 or not 0 <= self.gap_prob <= 1
                or min(self.min_distance, self.curriculum, self.repeat_until) < 0):
            raise ConfigError("recall: max_prefix and max_gap must be >= 1, min_distance, curriculum and repeat_until "
                              ">= 0, gap_prob in [0, 1]")
        if not 0 <= self.repeat_prob < 1:
            raise ConfigError(f"recall repeat_prob must be in [0, 1), got {self.repeat_prob}")

    def check_fits(self) -> None:
        """Refuse a seq_len too short for min_records records (worst-case gaps) and the longest prefix."""
        need = 1 + (self.max_prefix - 1) + max(self.min_records * (2 + self.max_gap) + 1, self.min_distance) + 2
        if self.seq_len < need:
            raise ConfigError(f"recall seq_len={self.seq_len} is too short for min_records={self.min_records} "
                              f"and max_prefix={self.max_prefix} (need >= {need})")
        if self.repeat_prob and self.seq_len < 1 + 2 * REPEAT_MIN:
            raise ConfigError(f"recall seq_len={self.seq_len} is too short for repeat sequences (repeat_prob > 0 "
                              f"needs >= {1 + 2 * REPEAT_MIN})")

    @classmethod
    def from_dict(cls, d: dict) -> RecallConfig:
        return known_options(cls, d, "recall")

    def to_dict(self) -> dict:
        return asdict(self)


def recall_tokenizer(cfg: RecallConfig) -> Tokenizer:
    """Word tokenizer of a recall run: only the words its layout uses (its keys, values and filler), so the
    output layer has no never-seen classes. That matters at the tiny preset: the same model and data with the
    528-word vocabulary of every shipped list stays on the chance plateau where a ~250-word one learns to bind
    keys to names in ~600 steps (measured, full attention, 2-16 records)."""
    keys, values = load_words(cfg.keys)[: cfg.n_keys or None], load_words(cfg.values)[: cfg.n_values or None]
    # the shipped lists' order, so that whole lists give exactly `build_word_tokenizer()`'s ids
    return build_word_tokenizer(lists=(), extra_words=[*keys, *values, *load_words(cfg.filler)])


def recall_words(cfg: RecallConfig, tok: Tokenizer) -> tuple[str, dict[str, list[str]]]:
    """A recall run's word source ("lists" or "vocab", `phasekv.data.words.choose_words`) and its keys, values
    and filler (role -> words). "auto" keeps the lists when all their words are single tokens."""
    lists = {"keys": load_words(cfg.keys)[: cfg.n_keys or None], "values": load_words(cfg.values)[: cfg.n_values or None],
             "filler": load_words(cfg.filler)}
    unk = tok.token_to_id("<unk>")

    def single(w: str) -> bool:
        ids = tok.encode(" " + w, add_special_tokens=False).ids
        return len(ids) == 1 and ids[0] != unk

    need = {"keys": len(lists["keys"]), "values": len(lists["values"]), "filler": 1}
    return choose_words(cfg.words, lists, need, single, (tok.decode([i]) for i in range(tok.get_vocab_size())))


def word_ids(tok: Tokenizer, words: list[str], what: str) -> list[list[int]]:
    """Token ids of each word as it appears mid-text (leading space), refusing words the tokenizer lacks."""
    unk = tok.token_to_id("<unk>")
    out = []
    for w in words:
        ids = tok.encode(" " + w, add_special_tokens=False).ids
        if not ids or (unk is not None and unk in ids):
            raise DataError(f"{what} word {w!r} is not in the tokenizer")
        out.append(ids)
    return out


REPEAT_SALT = 101  # random streams of the repeat sequences, apart from the records'
REPEAT_MIN = 20  # tokens in a repeated run, at least: beyond the 16-token local window


class RecallStream:
    """Index-addressed recall examples (see module doc); `split` picks disjoint random streams."""

    def __init__(self, tok: Tokenizer, cfg: RecallConfig | None = None, seed: int = 0, split: str = "train"):
        self.cfg = cfg = cfg or RecallConfig()
        cfg.check_fits()
        self.seed, self.split, self.seq_len = seed, split, cfg.seq_len
        self.source, words = recall_words(cfg, tok)
        keys, values = words["keys"], words["values"]
        if len(keys) ** cfg.key_words < cfg.max_records or len(values) < cfg.max_records:
            raise ConfigError(f"recall: max_records={cfg.max_records} exceeds the {len(keys)} keys / {len(values)} "
                              f"values (words from the {self.source})")
        self.words = word_ids(tok, keys, "key")
        self.values = word_ids(tok, values, "value")
        self.filler = word_ids(tok, words["filler"], "filler")
        self.single_filler = all(len(w) == 1 for w in self.filler)  # the word tokenizer's: one token per word
        self.filler_ids = np.array([w[0] for w in self.filler], dtype=np.int64)  # (n_filler,) when single
        self.marker = word_ids(tok, [cfg.marker], "marker")[0]
        sp = special_ids(tok)
        self.bos = [sp["bos"]] if sp["bos"] is not None else []
        self.pad = sp["pad"] if sp["pad"] is not None else 0

    def key(self, i: int) -> list[int]:
        """Token ids of key number i: word i, or for two-word keys the pair (i // n, i % n) of the n words."""
        if self.cfg.key_words == 1:
            return self.words[i]
        a, b = divmod(i, len(self.words))
        return self.words[a] + self.words[b]

    def record_range(self, index: int) -> tuple[int, int]:
        """Record-count range of example `index`: with a curriculum, training starts at 1 record and reaches
        [min_records, max_records] after `curriculum` examples (held-out splits always use the full range)."""
        c = self.cfg
        if not c.curriculum or self.split != "train" or index >= c.curriculum:
            return c.min_records, c.max_records
        f = index / c.curriculum
        return 1 + round((c.min_records - 1) * f), 1 + round((c.max_records - 1) * f)

    def example(self, index: int) -> Example:
        c = self.cfg
        if self.is_repeat(index):
            return self.repeat(index)
        rng = rng_for(self.seed, self.split, index)
        lo, hi = self.record_range(index)
        n = int(rng.integers(lo, hi + 1))
        keys = [self.key(i) for i in rng.choice(len(self.words) ** c.key_words, n, replace=False)]
        vals = [self.values[v] for v in rng.choice(len(self.values), n, replace=False)]
        ids: list[int] = list(self.bos)
        targets: list[tuple[int, int, list[int]]] = []  # (query position, record key position, value tokens)

        def filler(k: int):  # exactly k tokens of filler words (the last word may be cut)
            if self.single_filler:  # one draw per token: the same draws as the loop below, in one call
                ids.extend(self.filler_ids[rng.integers(0, len(self.filler), size=k)].tolist())
                return
            target = len(ids) + k
            while len(ids) < target:
                ids.extend(self.filler[int(rng.integers(0, len(self.filler)))][: target - len(ids)])

        def gap():
            if rng.random() < c.gap_prob:
                filler(int(rng.integers(1, c.max_gap + 1)))

        filler(int(rng.integers(0, c.max_prefix)))
        key_pos, longest = [], 0
        for k, v in zip(keys, vals, strict=True):
            size = len(k) + len(v)
            longest = max(longest, size)
            first = key_pos[0] if key_pos else len(ids)
            if max(len(ids) + size + c.max_gap + len(self.marker), first + c.min_distance) + longest > c.seq_len:
                break  # long prefix and gaps: fewer records, so that at least one query still fits
            key_pos.append(len(ids))
            ids.extend(k)
            ids.extend(v)
            gap()
        ids.extend(self.marker)
        n = len(key_pos)
        if n and key_pos[0] + c.min_distance > len(ids):  # few records: filler, so the first one is far enough
            filler(key_pos[0] + c.min_distance - len(ids))
        for _ in range(n):  # n queries, keys drawn with replacement (see module doc)
            ready = bisect.bisect_right(key_pos, len(ids) - c.min_distance)  # records beyond the local window: a prefix
            r = int(rng.integers(0, ready))
            k, v = keys[r], vals[r]
            if len(ids) + len(k) + len(v) > c.seq_len:
                continue  # a shorter record may still fit
            ids.extend(k)
            targets.append((len(ids) - 1, key_pos[r], v))  # the queried key's last token predicts the value's first
            ids.extend(v)
            if c.query_gaps:
                gap()
        return self._pack(ids, targets)

    def _pack(self, ids: list[int], targets: list[tuple[int, int, list[int]]]) -> Example:
        """A sequence cut or padded to seq_len, its labels (the values after queried keys, multi-token values
        trained whole) and answer positions."""
        T = self.seq_len
        labels, answer = np.full(T, IGNORE, dtype=np.int64), np.full(T, -1, dtype=np.int64)
        for q, key, v in targets:
            if q < T:
                answer[q] = key
                labels[q : q + len(v)] = v[: T - q]
        if not targets or targets[0][0] >= T:
            raise DataError(f"recall: seq_len={T} leaves no room for a query with this tokenizer")
        del ids[T:]  # a last gap may run past the end
        return Example(np.array(ids + [self.pad] * (T - len(ids)), dtype=np.int64), labels, answer)

    def is_repeat(self, index: int) -> bool:
        """Whether training example `index` is a repeat sequence (its own random stream decides, so every other
        index's records are those of a run without repeats)."""
        c = self.cfg
        if not c.repeat_prob or self.split != "train" or (c.repeat_until and index >= c.repeat_until):
            return False
        return rng_for(self.seed, "train", index, REPEAT_SALT).random() < c.repeat_prob

    def repeat(self, index: int) -> Example:
        """A repeat sequence: <bos>, L random key and name tokens (REPEAT_MIN <= L <= half the sequence), the same
        L again; every token of the second copy but the last is trained to predict the next one (the copy's first
        token follows the random run, so it is not predictable)."""
        rng = rng_for(self.seed, "train", index, REPEAT_SALT + 1)
        pool = [w[0] for w in self.words + self.values]
        n = int(rng.integers(REPEAT_MIN, (self.seq_len - len(self.bos)) // 2 + 1))
        run = [pool[i] for i in rng.integers(0, len(pool), n)]
        ids = self.bos + run + run
        labels = [IGNORE] * len(ids)
        second = len(self.bos) + n  # the second copy's first token
        labels[second : len(ids) - 1] = ids[second + 1 :]
        pad = self.seq_len - len(ids)
        return Example(np.array(ids + [self.pad] * pad, dtype=np.int64),
                       np.array(labels + [IGNORE] * pad, dtype=np.int64), np.full(self.seq_len, -1, dtype=np.int64))


def _logits(out) -> torch.Tensor:
    return out if isinstance(out, torch.Tensor) else out.logits


@torch.no_grad()
def recall_accuracy(model, stream, n: int = 512, start: int = 0, batch_size: int = 64, modulus: int = 24) -> dict:
    """Held-out recall accuracy: full-vocabulary top-1 on each queried value, grouped by the phase
    (position mod `modulus`) of the stored record's key.

    Returns `accuracy` (over all answers), per-residue `by_residue` accuracies and counts, and the phase
    summary `mean`/`worst`/`best`/`gap` over residue groups (points, as the evaluations report it), plus
    `loss` (mean cross-entropy on the answers) and `chance` (1 / records per sequence, averaged).
    """
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    correct, total = np.zeros(modulus), np.zeros(modulus)
    loss_sum, n_ans, inv_records = 0.0, 0, 0.0
    for s in range(start, start + n, batch_size):
        b = batch(stream, s, min(batch_size, start + n - s))
        logits = _logits(model(b["input_ids"].to(device))).float()  # (B, T, V)
        mask = b["answer_pos"] >= 0  # (B, T)
        ans_logits, target = logits[mask.to(device)], b["labels"][mask].to(device)
        hit = (ans_logits.argmax(-1) == target).cpu().numpy()
        res = (b["answer_pos"][mask] % modulus).numpy()
        np.add.at(correct, res, hit)
        np.add.at(total, res, 1)
        loss_sum += torch.nn.functional.cross_entropy(ans_logits, target, reduction="sum").item()
        n_ans += int(mask.sum())
        inv_records += float((1.0 / mask.sum(1).clamp(min=1)).sum())  # recall: queries == records
    model.train(was_training)
    acc = np.where(total > 0, correct / np.maximum(total, 1), np.nan)
    pts = acc[total > 0] * 100
    return {
        "accuracy": float(correct.sum() / max(total.sum(), 1)),
        "loss": loss_sum / max(n_ans, 1),
        "n_answers": n_ans,
        "modulus": modulus,
        "by_residue": [None if np.isnan(a) else float(a) for a in acc],
        "count_by_residue": total.astype(int).tolist(),
        "mean": float(pts.mean()), "worst": float(pts.min()), "best": float(pts.max()),
        "gap": float(pts.max() - pts.min()),
        "chance": getattr(stream, "chance", inv_records / n),  # a stream that knows its chance (needle) says it
    }
