"""The filler sweep (flip test): fixed prompt and candidates, filler lengthened one token at a time.

For every filler family and length L the sequence is [special] filler(L) prompt; each candidate's
probability is read after the prompt (teacher-forced for multi-token candidates). Token-exactness: the
prompt's ids must be identical at every length and filler(L) must be exactly one token longer than
filler(L-1); a family whose text does not tokenise that way is skipped with a notice. A ranking
"follows the pattern" when its winner is the majority winner of its phase L mod S.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from phasekv.errors import ConfigError, DataError
from phasekv.eval.figure import to_png
from phasekv.eval.models import EvalModel
from phasekv.eval.prompts import PromptConfig, RetrievalPrompts
from phasekv.eval.protocols import FLIP
from phasekv.eval.run import json_default, versions
from phasekv.eval.tokens import WordTokenizer, word_list
from phasekv.io import write_json, write_parquet
from phasekv.progress import progress_bar

DEFAULT_FAMILIES = ("words", "repeat:the", "repeat:=", "repeat:,")


@dataclass
class FlipConfig:
    prompt: str | None = None  # prompt text; None: a lookup-style prompt built from the shipped words
    candidates: list[str] | None = None  # continuations (with their leading space); None: right + wrong name
    families: list[str] = field(default_factory=lambda: list(DEFAULT_FAMILIES))  # "words" | "repeat:X"
    lengths: int = 16  # filler lengths per family
    start: int = 0  # first filler length (tokens)
    records: int = 8  # records of the default prompt
    seed: int = 0

    def __post_init__(self):
        if self.lengths < 1 or self.start < 0 or self.records < 1:
            raise ConfigError(f"flip needs lengths >= 1, start >= 0 and records >= 1, got lengths={self.lengths}, "
                              f"start={self.start}, records={self.records}")
        if not self.families:
            raise ConfigError("flip needs at least one filler family (words or repeat:X)")

    def to_dict(self) -> dict:
        return asdict(self)


def default_prompt(tok: WordTokenizer, records: int, seed: int) -> tuple[str, list[str]]:
    """A short lookup prompt (no filler) and candidates [right name, the next record's name]."""
    cfg = PromptConfig(records=records, demos=1, modulus=1, per_group=1, filler=1, mappings=1, seed=seed)
    ps = RetrievalPrompts(cfg, tok)
    words, t, i, answer = ps.words(0)
    keys, values = ps.mapping(0)
    wrong = next(v for v in values if v != answer)
    return " ".join(words), [" " + answer, " " + wrong]


def filler_text(family: str, n: int, seed: int) -> str:
    if family == "words":
        pool = word_list("filler")
        draws = np.random.default_rng([seed, 11]).integers(0, len(pool), 1 << 16)  # one fixed word stream
        if n > draws.size:
            raise ConfigError(f"filler length {n} exceeds {draws.size}")
        return " ".join(pool[i] for i in draws[:n])
    if family.startswith("repeat:") and len(family) > len("repeat:"):
        return " ".join([family[len("repeat:"):]] * n)
    raise ConfigError(f"unknown filler family {family!r}: use 'words' or 'repeat:X'")


def sequences(tok: WordTokenizer, cfg: FlipConfig, prompt: str, family: str) -> list[list[int]] | str:
    """Token ids per length (start .. start+lengths-1), or the reason the family is not token-exact."""
    seqs = []
    for L in range(cfg.start, cfg.start + cfg.lengths):
        fill = filler_text(family, L, cfg.seed)
        seqs.append(tok.encode(tok.lead + (fill + " " + prompt if fill else prompt)))
    tail = len(tok.encode(tok.lead + prompt)) - len(tok.prefix)
    for k, s in enumerate(seqs):
        if s[-tail:] != seqs[0][-tail:] or s[: len(tok.prefix)] != tok.prefix:
            return f"the prompt tokenises differently after {cfg.start + k} filler tokens"
        if len(s) != len(seqs[0]) + k:
            return f"filler of {cfg.start + k} units is {len(s) - len(seqs[0]) + cfg.start} tokens, not {cfg.start + k}"
    return seqs


def candidate_ids(tok: WordTokenizer, prompt: str, cand: str) -> list[int]:
    base = tok.encode(tok.lead + prompt)
    full = tok.encode(tok.lead + prompt + cand)
    if full[: len(base)] != base or len(full) == len(base):
        raise DataError(f"candidate {cand!r} does not tokenise as a continuation of the prompt")
    return full[len(base):]


def follow_pattern(winners: list[int], lengths: list[int], stride: int) -> tuple[int, dict]:
    """Rankings that follow a pattern in L mod S: the winner is the strict plurality winner of the OTHER
    lengths of the same phase (leave-one-out, so a phase seen once cannot count), and the plurality winner
    per phase over all its lengths."""
    phases: dict[int, list[int]] = {}
    for w, L in zip(winners, lengths, strict=True):
        phases.setdefault(L % stride, []).append(w)

    def plurality(ws: list[int]) -> int | None:
        counts = sorted(((ws.count(c), c) for c in set(ws)), reverse=True)
        return counts[0][1] if counts and (len(counts) == 1 or counts[0][0] > counts[1][0]) else None

    follow = 0
    for w, L in zip(winners, lengths, strict=True):
        others = list(phases[L % stride])
        others.remove(w)
        follow += plurality(others) == w
    return follow, {ph: plurality(ws) for ph, ws in phases.items()}


def run_flip(em: EvalModel, cfg: FlipConfig, out: str | Path, stride: int | None = None,
             progress: bool = True) -> dict:
    """Sweep every filler family over the lengths, write OUT/results.parquet, summary.json and flip.png;
    returns the summary."""
    t0 = time.time()
    stride = stride if stride is not None else em.stride
    prompt, cands = _prompt_and_candidates(em.tok, cfg)
    cand_ids = [candidate_ids(em.tok, prompt, c) for c in cands]
    seqs, skipped = {}, {}
    for fam in cfg.families:
        s = sequences(em.tok, cfg, prompt, fam)
        (skipped if isinstance(s, str) else seqs)[fam] = s
    if not seqs:
        raise DataError(f"no filler family tokenises one token per step: {skipped}")
    lengths = list(range(cfg.start, cfg.start + cfg.lengths))
    df = _sweep(em, seqs, lengths, cand_ids, cands, progress)
    fams = {fam: _family(df[df["family"] == fam], cands, stride) for fam in seqs}
    summary = {
        "task": "flip", "model": em.name, "model_kind": em.kind, "stride": stride, "prompt": prompt,
        "candidates": cands, "families": fams, "skipped_families": skipped,
        "rankings": len(seqs) * len(lengths),
        "follow_pattern": sum(f.get("follow", 0) for f in fams.values()) if stride else None,
        "switching": bool(stride) and any(len(set(f["majority_by_phase"].values()) - {None}) > 1
                                          for f in fams.values()),
        "note": None if not stride or cfg.lengths >= 2 * stride else
        f"{cfg.lengths} lengths give fewer than two per phase of S={stride}: no ranking can follow a pattern",
        "provenance": {"config": cfg.to_dict(), "model_info": em.info, "tokenizer": em.tok.name,
                       "seconds": round(time.time() - t0, 2), "versions": versions()},
    }
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_parquet(out / "results.parquet", df)
    write_json(out / "summary.json", summary, default=json_default)
    to_png(FLIP.build_figure(summary, df), out / FLIP.figure)
    return summary


def _prompt_and_candidates(tok: WordTokenizer, cfg: FlipConfig) -> tuple[str, list[str]]:
    if cfg.prompt is None:
        prompt, cands = default_prompt(tok, cfg.records, cfg.seed)
        cands = cfg.candidates or cands
    else:
        prompt, cands = cfg.prompt, cfg.candidates
    if not cands or len(cands) < 2:
        raise ConfigError("flip needs at least two candidates (--candidates ' 8,32')")
    return prompt, cands


def _sweep(em: EvalModel, seqs: dict, lengths: list[int], cand_ids: list[list[int]], cands: list[str],
           progress: bool) -> pd.DataFrame:
    """One row per (family, length, candidate): its log-probability and whether it ranks first."""
    rows = []
    with progress_bar(progress, len(seqs) * len(lengths), f"flip · {em.name}") as advance:
        for fam, ss in seqs.items():
            for L, ids in zip(lengths, ss, strict=True):
                lps = em.candidate_logprobs(ids, cand_ids)
                win = int(np.argmax(lps))
                for k, (c, lp) in enumerate(zip(cands, lps, strict=True)):
                    rows.append({"family": fam, "length": L, "tokens": len(ids), "candidate": c, "logprob": lp,
                                 "prob": float(np.exp(lp)), "top": k == win, "winner": cands[win]})
                advance(1)
    return pd.DataFrame(rows)


def _family(rows: pd.DataFrame, cands: list[str], stride: int | None) -> dict:
    """A family's winners by length, wins per candidate and (with a stride) how they follow L mod S."""
    d = rows[rows["top"]].sort_values("length")
    winners = [cands.index(w) for w in d["winner"]]
    entry = {"winners": [cands[w] for w in winners], "wins": {c: winners.count(i) for i, c in enumerate(cands)}}
    if stride:
        n, major = follow_pattern(winners, d["length"].tolist(), stride)
        entry.update(follow=n, majority_by_phase={str(k): None if v is None else cands[v]
                                                  for k, v in sorted(major.items())})
    return entry
