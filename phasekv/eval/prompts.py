"""Prompt builders: position-matched record retrieval (lookup, needle) and the filler sweep (flip).

One layout serves lookup and needle (docs: Evaluation protocols and statistics):

    [special] [gap_0] rec_0 [gap_1] rec_1 ... [gap_{R-1}] rec_{R-1} [gap_R] [marker] demo_1 .. demo_D  target-key
    rec = key tokens (1 for lookup, 2 for needle), value (one name), optional separator (needle: 1)

The target record's key starts at position t (its residue t mod M picks the group); the query is the
last token, at the same position Q in every prompt, because the total filler G = sum(gaps) is fixed.
`prefix` padding puts the filler before the target into gap_0 and the rest into gap_R (all records shift
together); `in-sequence` splits it at random over gap_0..gap_i and gap_{i+1}..gap_R, so distractors'
phases do not move in lockstep with the target. Target positions come from an exactly moment-matched
design (`phasekv.eval.design`); key-name mappings are fixed record sets, each used at every residue.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import numpy as np

from phasekv.data.needle import composition, layout, needle_records, record
from phasekv.data.words import WORD_SOURCES
from phasekv.errors import ConfigError
from phasekv.eval.design import PositionDesign, make_design
from phasekv.eval.tokens import WordTokenizer, prompt_words

PADDINGS = ("prefix", "in-sequence")
SEPARATORS = (";", ",", ".", "|", "and")
SHARED_SETS = 6  # prompt sets a process keeps built: the demo's models share one tokenizer and their prompts; a
#   demo worker uses 5 (the lookup under each padding, the knockouts' and cycles' smaller set, the flip prompt,
#   the calibration set), ~30 MB for the largest
_BUILT: OrderedDict[tuple[str, str], dict[int, Prompt]] = OrderedDict()  # (config, tokenizer) -> pid -> prompt


@dataclass
class PromptConfig:
    records: int = 64  # R: key-value records before the demonstrations
    demos: int = 8  # D: demonstrations (repeated records) before the target key
    key_tokens: int = 1  # tokens per key: 1 (lookup: an animal) or 2 (needle: two animals)
    separator: str | None = None  # token after each record's value; "auto": the first single-token of
    # SEPARATORS (needle), None: records adjacent (lookup)
    padding: str = "prefix"  # "prefix" | "in-sequence"
    filler: int = 48  # G: filler tokens per prompt (fixed, so the query position is fixed)
    modulus: int = 24  # M: residue groups, target position mod M
    per_group: int = 576  # N prompts per residue group (exact moment matching needs a multiple of M^2)
    keep_n: bool = False  # keep a non-multiple N (sampled design, spread reported) instead of rounding up
    mappings: int = 32  # key-name mappings (the bootstrap unit); prompt j of every group uses j % mappings
    balance: float | None = None  # needle: keep filler-before-target share within this of the record share
    seed: int = 0
    keys: str = "animals"  # word lists (phasekv/data/words)
    values: str = "names"
    filler_words: str = "filler"
    words: str = "auto"  # "lists" (the three lists above), "vocab" (the tokenizer's own single-token words) or
    # "auto" (the lists when they give enough single tokens, else the vocabulary; `phasekv.eval.tokens.prompt_words`)
    marker: str | None = None  # optional token between the records and the demonstrations (e.g. "?")
    n_keys: int = 0  # use only the first n words of the key list (0 = all; match a run trained on fewer)
    n_values: int = 0  # same for the value list

    def __post_init__(self):
        if self.padding not in PADDINGS:
            raise ConfigError(f"padding must be one of {', '.join(PADDINGS)}, got {self.padding!r}")
        if self.words not in WORD_SOURCES:
            raise ConfigError(f"words must be one of {', '.join(WORD_SOURCES)}, got {self.words!r}")
        if self.key_tokens not in (1, 2):
            raise ConfigError(f"key_tokens must be 1 or 2, got {self.key_tokens}")
        if self.records < self.demos + 1 or self.records < 1 or self.demos < 0:
            raise ConfigError(f"need records > demos >= 0, got records={self.records}, demos={self.demos}")
        if self.mappings < 1 or self.modulus < 1 or self.per_group < 1:
            raise ConfigError("mappings, modulus and per-group must be >= 1")
        if self.filler < self.record_len - 1:
            raise ConfigError(f"filler={self.filler} must be >= record length - 1 = {self.record_len - 1} "
                              "so every residue can be reached")

    @property
    def record_len(self) -> int:
        return self.key_tokens + 1 + (self.separator is not None)

    @property
    def target_positions(self) -> int:
        """Positions the target key can take (the filler before it plus the records ahead of it): a position
        design must fit in them (`phasekv.eval.design.span`)."""
        return self.filler + (self.records - 1) * self.record_len + 1

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass
class Prompt:
    pid: int  # prompt id (order of the run; stable across resumes and ranks)
    residue: int  # target_pos mod M
    mapping: int  # key-name mapping id
    target_pos: int  # position of the target record's (first) key token in the final ids
    query_pos: int  # position of the last token (the query); the answer is predicted there
    target_index: int  # index of the target record among the R records
    answer: int  # token id of the right value
    answer_word: str
    words: list[str]
    ids: list[int]  # final token ids the model sees (checked against the placement)
    question: int = 1  # the last tokens that ask for the answer (marker, demonstrations, target key): what a
    #                    KV-cache press leaves uncompressed after the context (`phasekv.eval.press`)


class RetrievalPrompts:
    """The prompts of one lookup/needle run, built lazily and deterministically from (config, pid)."""

    def __init__(self, cfg: PromptConfig, tok: WordTokenizer):
        self.cfg, self.tok = cfg, tok
        need_keys = cfg.records if cfg.key_tokens == 1 else int(np.ceil(np.sqrt(cfg.records * 2)))
        self.word_source, words = prompt_words(
            tok, {"keys": cfg.keys, "values": cfg.values, "filler": cfg.filler_words},
            {"keys": cfg.n_keys, "values": cfg.n_values, "filler": 0}, {"keys": max(need_keys, 2), "values": 2, "filler": 1},
            cfg.words)
        self.keys, self.values, self.filler = words["keys"], words["values"], words["filler"]
        if cfg.key_tokens == 2 and len(self.keys) ** 2 < cfg.records:
            raise ConfigError(f"{cfg.records} records need distinct two-word keys; only {len(self.keys)} keys")
        self.sep = None
        if cfg.separator == "auto":
            self.sep = tok.single_tokens(SEPARATORS, "separator", 1)[0][0]
        elif cfg.separator is not None:
            self.sep = tok.single_tokens([cfg.separator], "separator", 1)[0][0]
        self.marker = None if cfg.marker is None else tok.single_tokens([cfg.marker], "marker", 1)[0][0]
        self.b = len(tok.prefix)  # special tokens before the first word
        L, R = cfg.record_len, cfg.records
        self.length = self.b + cfg.filler + R * L + (self.marker is not None) + cfg.demos * L + cfg.key_tokens
        self.query_pos = self.length - 1
        lo, hi = self.b, self.b + cfg.target_positions - 1  # reachable target positions
        self.design: PositionDesign = make_design(
            cfg.modulus, cfg.per_group, center=(lo + hi) / 2, keep_n=cfg.keep_n, rng=np.random.default_rng([cfg.seed, 7])
        )
        if self.design.lo < lo or self.design.hi > hi:
            raise ConfigError(
                f"the position design spans {self.design.lo}..{self.design.hi} but targets can only sit in "
                f"{lo}..{hi}; raise records or filler, or lower per-group/modulus"
            )
        self.n = cfg.modulus * self.design.n_per_group
        self._order = [np.random.default_rng([cfg.seed, 0, r]).permutation(self.design.n_per_group)
                       for r in range(cfg.modulus)]
        self._maps: dict[int, tuple[list[list[str]], list[str]]] = {}
        self._built = _shared(json.dumps(cfg.to_dict(), sort_keys=True, default=str), tok.fingerprint)

    def __len__(self) -> int:
        return self.n

    def slot(self, pid: int) -> tuple[int, int, int]:
        """(residue, target position, mapping) of prompt pid."""
        r, j = divmod(pid, self.design.n_per_group)
        return r, int(self.design.positions[r][self._order[r][j]]), j % self.cfg.mappings

    def mapping(self, m: int) -> tuple[list[list[str]], list[str]]:
        """Mapping m: R distinct keys (lists of key_tokens words) and their values."""
        if m not in self._maps:
            cfg, rng = self.cfg, np.random.default_rng([self.cfg.seed, 1, m])
            nk = len(self.keys)
            if cfg.key_tokens == 1:
                keys = [[self.keys[i]] for i in rng.choice(nk, cfg.records, replace=False)]
            else:
                flat = rng.choice(nk * nk, cfg.records, replace=False)
                keys = [[self.keys[i // nk], self.keys[i % nk]] for i in flat]
            replace = len(self.values) < cfg.records
            values = [self.values[i] for i in rng.choice(len(self.values), cfg.records, replace=replace)]
            self._maps[m] = (keys, values)
        return self._maps[m]

    def words(self, pid: int) -> tuple[list[str], int, int, str]:
        """The prompt's words, target position, target record index and answer word."""
        cfg, L, G, R = self.cfg, self.cfg.record_len, self.cfg.filler, self.cfg.records
        r, t, m = self.slot(pid)
        rng = np.random.default_rng([cfg.seed, 2, pid])
        keys, values = self.mapping(m)
        order = rng.permutation(R)
        # target record index i: filler before it, A = t - b - L*i, must fit in 0..G
        cand = np.arange(R)
        a = t - self.b - L * cand
        ok = (a >= 0) & (a <= G)
        if cfg.balance is not None:
            near = ok & (np.abs(a / max(G, 1) - cand / max(R - 1, 1)) <= cfg.balance)
            ok = near if near.any() else ok
        i = int(rng.choice(cand[ok]))
        A = t - self.b - L * i
        if cfg.padding == "prefix":
            gaps = np.zeros(R + 1, dtype=np.int64)
            gaps[0], gaps[R] = A, G - A
        else:
            gaps = np.concatenate([composition(A, i + 1, rng), composition(G - A, R - i, rng)])
        fill = iter(rng.integers(0, len(self.filler), G).tolist())
        target = int(order[i])
        demo_pool = np.delete(order, i)
        demos = rng.choice(demo_pool, cfg.demos, replace=False) if cfg.demos else []

        def rec(k: int) -> list[str]:
            return record(keys[k], values[k], self.sep)

        out = layout([rec(int(k)) for k in order], gaps, (self.filler[j] for j in fill),
                     [*(rec(int(k)) for k in demos), keys[target]], self.marker)
        return out, t, i, values[target]

    def prompt(self, pid: int) -> Prompt:
        """Prompt pid, built once per process for a config and tokenizer (read-only: evaluations of other
        models with the same tokenizer reuse it; building is ~30% of a small model's lookup pass)."""
        if not 0 <= pid < self.n:
            raise ConfigError(f"prompt id {pid} outside 0..{self.n - 1}")
        if pid not in self._built:
            self._built[pid] = self._build(pid)
        return self._built[pid]

    def _build(self, pid: int) -> Prompt:
        """Build, tokenise and check prompt pid (placement must be token-exact on the final ids)."""
        words, t, i, answer = self.words(pid)
        ids = self.tok.check(words, f"prompt {pid}")
        r, _, m = self.slot(pid)
        keys, _ = self.mapping(m)
        tkey = self.tok.word_id(words[t - self.b])
        if len(ids) != self.length or t % self.cfg.modulus != r or ids[t] != tkey or ids[self.query_pos] != ids[
                t + self.cfg.key_tokens - 1] or words[t - self.b + self.cfg.key_tokens] != answer:
            raise ConfigError(f"prompt {pid}: target not at position {t} / query not at {self.query_pos}")
        question = (self.marker is not None) + self.cfg.demos * self.cfg.record_len + self.cfg.key_tokens
        return Prompt(pid, r, m, t, self.query_pos, i, self.tok.word_id(answer), answer, words, ids, question)

    def __iter__(self) -> Iterator[Prompt]:
        return (self.prompt(p) for p in range(self.n))

    def metadata(self) -> dict:
        """Settings and the achieved moments of the target positions (verified design)."""
        return {
            "prompt_config": self.cfg.to_dict(),
            "length": self.length,
            "query_pos": self.query_pos,
            "n_prompts": self.n,
            "per_group": self.design.n_per_group,
            "per_group_requested": self.design.requested,
            "design_notice": self.design.notice,
            "design_moments": self.design.moments(),
            "word_pools": {"keys": len(self.keys), "values": len(self.values), "filler": len(self.filler)},
            "words": self.words_used(),
            "separator": self.sep,
            "tokenizer": self.tok.name,
        }


    def words_used(self) -> dict:
        """Where the prompt words come from and the words themselves (for summaries): the shipped lists by
        name, or the tokenizer's own vocabulary."""
        cfg = self.cfg
        lists = {"keys": cfg.keys, "values": cfg.values, "filler": cfg.filler_words}
        return {"source": self.word_source, **({"lists": lists} if self.word_source == "lists" else {}),
                "keys": self.keys, "values": self.values, "filler": self.filler}


LOOKUP_LAYOUTS = (  # (records, demos, filler), longest first: the study's lookup; the demo's (90 tokens with
    (64, 8, 48), (16, 4, 48), (16, 2, 40))  # single-token keys); a shorter one (78)


def lookup_layout(max_len: int | None, key_tokens: int = 1) -> dict:
    """Records, demonstrations and filler of the longest layout whose prompts (bos, filler, records,
    demonstrations, target key) fit in `max_len` tokens, e.g. a model's training length; None: the study's."""
    def length(lay: tuple[int, int, int]) -> int:
        return 1 + lay[2] + (key_tokens + 1) * (lay[0] + lay[1]) + key_tokens

    fits = [lay for lay in LOOKUP_LAYOUTS if max_len is None or length(lay) <= max_len]
    return dict(zip(("records", "demos", "filler"), fits[0] if fits else LOOKUP_LAYOUTS[-1], strict=True))


def lookup_config(model_info: dict | None = None, **kw) -> PromptConfig:
    """The study's lookup test: 64 single-token animal -> name records, 8 demonstrations, M = 24.
    `model_info` (`EvalModel.info`) of a phasekv recall run: the prompts use only the words it was trained on
    and its key length, and, unless one of records, demos or filler is given, the longest layout that fits its
    training length (a tiny run trained on 96 tokens gets 16 records, 4 demonstrations). Options in kw that
    are None are not given."""
    info = model_info or {}
    t = info.get("recall") or {}
    own = {"n_keys": t.get("n_keys", 0), "n_values": t.get("n_values", 0), "key_tokens": t.get("key_words", 1),
           "words": t.get("words", "auto")}
    given = {k: v for k, v in kw.items() if v is not None}
    if not {"records", "demos", "filler"} & set(given):
        own.update(lookup_layout(info.get("train_len"), own["key_tokens"]))
    return PromptConfig(**{**own, **given})


def needle_config(context: int = 131072, records: int | None = None, **kw) -> PromptConfig:
    """The needle test: four-token records (two-animal key, name, separator), M = 8, N = 256; `context`
    tokens (special tokens not counted), the part not taken by records is filler spread between them;
    the target sits near the middle. Records: the study's density unless given (`needle_records`). Options in
    kw that are None are not given."""
    kw = {"modulus": 8, "per_group": 256, "padding": "in-sequence", "demos": 2, "separator": "auto",
          "balance": 0.02, **{k: v for k, v in kw.items() if v is not None}}
    records = needle_records(context) if records is None else records
    record_len = 2 + 1 + (kw["separator"] is not None)
    filler = context - (records + kw["demos"]) * record_len - 2
    if filler < record_len - 1:
        raise ConfigError(f"context={context} tokens is too short for {records} records of {record_len} tokens")
    return PromptConfig(records=records, key_tokens=2, filler=filler, **kw)


def _shared(config: str, tokenizer: str) -> dict[int, Prompt]:
    """The process's built prompts of (config, tokenizer), the SHARED_SETS most recently used kept."""
    key = (config, tokenizer)
    built = _BUILT.pop(key, None)
    _BUILT[key] = built = {} if built is None else built
    while len(_BUILT) > SHARED_SETS:
        _BUILT.popitem(last=False)
    return built
