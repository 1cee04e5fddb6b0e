"""Which compression ratios an evaluation and an audit test, and on which residues: every distinct ratio.

A model may compress its layers at several ratios (DeepSeek-V4: CSA at 4, HCA at 128; read from its
config by `phasekv.model.hf.compression_layout`). Each ratio r is tested on residues mod M_r, a multiple of
r: the protocol's modulus M when r divides it (ratios that share M share one evaluation), otherwise the
smallest multiple of r above both M and r (the period test needs r < M_r; at r = M only the gap is tested). At M_r = M the protocol's N
prompts per group are used (exact moment matching); at a larger M_r the total number of prompts is kept,
N_r = max(16, M·N / M_r) per group, and the design keeps N_r (sampled from the exactly matched design; the
achieved spread of the group means and variances is reported) instead of rounding it up to M_r².
For each ratio an evaluation's summary and the audit's verdict give the residue profile folded mod r, its
power at period r (permutation p) and the layer types the ratio belongs to (`ratio_tests`); `phasekv eval`
tests the ratios that divide its modulus and lists the others, `phasekv audit` plans evaluations for all.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from phasekv.eval.stats import periodicity_test, phase_profile

MIN_PER_GROUP = 16  # fewest prompts per residue group of a kept-N design


@dataclass
class RatioPlan:
    """One evaluation of an audit: its modulus and the ratios it tests."""

    modulus: int  # M_r: residue groups
    ratios: dict[int, list[str]]  # ratio -> layer types, every ratio dividing `modulus`
    per_group: int | None  # N per group (None: the protocol's own)
    keep_n: bool  # N kept as given (sampled design, spread reported) instead of rounded up to M_r²
    n_rule: str  # how N was chosen, in words


def plan_ratios(ratios: dict[int, list[str]], modulus: int, per_group: int) -> list[RatioPlan]:
    """The evaluations that test every ratio in `ratios` (protocol modulus M, N = `per_group`), smallest
    modulus first; one evaluation at M for a model without ratios."""
    by_m: dict[int, dict[int, list[str]]] = {} if ratios else {modulus: {}}
    for r, types in sorted(ratios.items()):
        m = modulus if modulus % r == 0 else r * max(2, math.ceil(modulus / r))
        by_m.setdefault(m, {})[r] = types
    plans = []
    for m, rs in sorted(by_m.items()):
        if m == modulus:
            plans.append(RatioPlan(m, rs, None, False, f"the protocol's N = {per_group} per group"))
            continue
        n = max(MIN_PER_GROUP, round(modulus * per_group / m))
        plans.append(RatioPlan(m, rs, n, True, f"N = max({MIN_PER_GROUP}, M·N / M_r) = {n} per group: the "
                                               f"{modulus * per_group:,} prompts of the M = {modulus} design "
                                               f"spread over {m} groups, kept (not rounded up to {m}²)"))
    return plans


def ratio_tests(summary: dict, ratios: dict[int, list[str]], n_perm: int = 10000, seed: int = 0) -> list[dict]:
    """Per ratio r in `ratios` that divides the modulus M of `summary` (an evaluation's groups): its layer
    types, the profile folded mod r, its weakest phase and its power at period r with a permutation p-value
    (None at r = M)."""
    acc = np.array([g["acc"] for g in summary["groups"]])
    M, out = len(acc), []
    for r, types in ratios.items():
        if M % r:
            continue
        fold = phase_profile(acc, r)  # (r,)
        per = periodicity_test(acc / 100, r, n_perm=n_perm, seed=seed) if r < M else {"power": None, "p_value": None}
        out.append({"ratio": r, "layer_types": types, "modulus": M, "phase_profile": fold.round(3).tolist(),
                    "weakest_phase": int(np.argmin(fold)), "phase_gap": float(fold.max() - fold.min()),
                    "period_power": per["power"], "period_p_value": per["p_value"]})
    return out
