"""Which periods (compression ratios, grid periods) an evaluation and an audit test, and on which residues.

A model may compress its layers at several ratios (DeepSeek-V4: CSA at 4, HCA at 128; read from its
config by `phasekv.model.hf.compression_layout`), or sit on several grids (NSA's d and l', Beacon's r and w).
Each period g is tested on residues t mod M_g, by one rule (`plan_period`) that the audit and the family
analysis (`phasekv.analysis.family.plan_grid`) share:

    M_g = M          the protocol's own modulus when g divides it and g < M (one evaluation serves every such g),
                     with its N prompts per group
    M_g = k g        else the smallest multiple (k >= 2) whose position design fits the prompts' target positions
                     (`PromptConfig.target_positions`; an exact design at M needs at least 3M - 2 of them), with
                     about the protocol's number of prompts: the largest exact N (a multiple of M_g^2) not above
                     M N / M_g that fits, else N_g = max(16, M N / M_g) kept (sampled from an exact design; the
                     achieved spread of the group means and variances is reported)
    M_g = g          else only the gap (accuracy depends on t mod g or not); the period test needs M_g > g
    none             when not even M_g = g fits: not determinable with these prompts (the audit says so)

For each ratio an evaluation's summary and the audit's verdict give the residue profile folded mod r, its
power at period r (permutation p) and the layer types the ratio belongs to (`ratio_tests`); `phasekv eval`
tests the ratios that divide its modulus and lists the others, `phasekv audit` plans evaluations for all.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field

import numpy as np

from phasekv.errors import ConfigError
from phasekv.eval.design import exact_unit, span
from phasekv.eval.prompts import PromptConfig
from phasekv.eval.stats import periodicity_test, phase_profile

MIN_PER_GROUP = 16  # fewest prompts per residue group of a kept-N design


@dataclass
class PeriodPlan:
    """How one period is tested with given prompts (`plan_period`)."""

    period: int | None  # g (None: no period, the protocol's own evaluation)
    modulus: int | None  # M_g: residue groups (None: not determinable with these prompts)
    per_group: int | None  # N per group (None: the protocol's own)
    keep_n: bool  # N kept (sampled from an exact design, spread reported) instead of a multiple of M_g^2
    test: str | None  # "period" (power at period g, permutation p), "gap" (M_g = g), None
    note: str  # the rule in words

    def config(self, cfg: PromptConfig) -> PromptConfig:
        """The prompts of this plan (`cfg` at its modulus and N)."""
        if self.per_group is None:
            return cfg
        return dataclasses.replace(cfg, modulus=self.modulus, per_group=self.per_group, keep_n=self.keep_n)


@dataclass
class RatioPlan(PeriodPlan):
    """One evaluation of an audit: the plan of its smallest ratio (ratios at one modulus share it; modulus None:
    the ratios cannot be tested with these prompts) and every ratio it tests."""

    ratios: dict[int, list[str]] = field(default_factory=dict)  # ratio -> layer types


def _fits(modulus: int, per_group: int, positions: int) -> bool:
    """Whether the exact design for N = per_group (a multiple of M^2; a sampled one: its M^2 cell) fits."""
    return span(modulus, max(per_group, exact_unit(modulus))) <= positions


def _most(modulus: int, total: int, positions: int) -> int:
    """The most copies q of the exact design (N = q M^2 per group) within `total` prompts that fit (0: none)."""
    u = exact_unit(modulus)
    return max((q for q in range(1, total // (modulus * u) + 1) if _fits(modulus, q * u, positions)), default=0)


def plan_period(name: str, period: int, cfg: PromptConfig) -> PeriodPlan:
    """The modulus and N that test `period` (called `name` in messages) with the prompts `cfg` (module docstring)."""
    M, N, room = cfg.modulus, cfg.per_group, cfg.target_positions
    if period < 1:
        raise ConfigError(f"{name}={period} must be >= 1")
    if M % period == 0 and period < M:
        return PeriodPlan(period, M, None, cfg.keep_n, "period", f"residues mod {M}, the evaluation's own")
    total = M * N
    for mg in (k * period for k in range(2, math.ceil(room / period) + 1)):
        if not _fits(mg, 1, room):
            break
        q = _most(mg, total, room)
        if q:
            return PeriodPlan(period, mg, q * exact_unit(mg), False, "period",
                              f"residues mod {mg}: N = {q * exact_unit(mg)} per group (exact), about the "
                              f"evaluation's {total:,} prompts")
        n = max(MIN_PER_GROUP, round(total / mg))
        return PeriodPlan(period, mg, n, True, "period",
                          f"residues mod {mg}: N = {n} per group kept (sampled from an exact design)")
    above = f"a modulus above {period} needs {span(2 * period, exact_unit(2 * period))} target positions, " \
            f"these prompts have {room}"
    if period == M:
        return PeriodPlan(period, M, None, cfg.keep_n, "gap",
                          f"residues mod {M}, the evaluation's own (gap, no period test): {above}")
    if _fits(period, 1, room):
        q = _most(period, total, room)
        n, keep = (q * exact_unit(period), False) if q else (max(MIN_PER_GROUP, round(total / period)), True)
        return PeriodPlan(period, period, n, keep, "gap", f"residues mod {period} only (gap, no period test): {above}")
    return PeriodPlan(period, None, None, False, None,
                      f"not determinable with these prompts: residues mod {period} need "
                      f"{span(period, exact_unit(period))} target positions, these prompts have {room}")


def plan_ratios(ratios: dict[int, list[str]], cfg: PromptConfig) -> list[RatioPlan]:
    """The evaluations that test every ratio in `ratios` with the prompts `cfg` (`plan_period`; ratios at one
    modulus share an evaluation), smallest modulus first, then the ratios that cannot be tested (modulus None);
    one evaluation at the protocol's modulus when no ratio can be tested (or the model has none)."""
    by_m: dict[int | None, RatioPlan] = {}
    for r, types in sorted(ratios.items()):
        p = plan_period(f"ratio {r}", r, cfg)
        by_m.setdefault(p.modulus, RatioPlan(**dataclasses.asdict(p))).ratios[r] = types
    if not any(m is not None for m in by_m):
        by_m[cfg.modulus] = RatioPlan(None, cfg.modulus, None, cfg.keep_n, None,
                                      f"residues mod {cfg.modulus}, the evaluation's own")
    return sorted(by_m.values(), key=lambda p: (p.modulus is None, p.modulus or 0))


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
