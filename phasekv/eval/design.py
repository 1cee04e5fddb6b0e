"""Position designs: target positions per residue group with identical mean and variance.

Every target position of residue group r is r + M*k. Construction (exact, integers): draw Y = Y1 + Y2
with Y1 uniform on {0..L1*M-1} and Y2 uniform on {0..L2*M-1} (all L1*L2*M^2 pairs once) and put the
target at the largest position <= base + Y with residue r:

    p_r(Y) = base + Y - ((base + Y - r) mod M)

e = (base + Y - r) mod M is uniform on {0..M-1} given Y1 (Y2 covers every residue) and given Y2, so it
is uncorrelated with Y; hence E[p_r] = base + E[Y] - (M-1)/2 and Var[p_r] = Var[Y] + (M^2-1)/12 for
every r: exact moment matching with N = L1*L2*M^2 prompts per group. No smaller N can work in general
(N r(r-1) = 0 mod M^2; docs: Evaluation protocols and statistics), so other N are rounded up to the next multiple of M^2, or
(keep_n) drawn from this exactly matched design distribution, with the empirical spread reported.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, field

import numpy as np

from phasekv.errors import ConfigError


@dataclass
class PositionDesign:
    """Target positions per residue group (positions[r] has n_per_group entries, all = r mod M)."""

    modulus: int  # M: number of residue groups
    n_per_group: int  # N actually used (after rounding)
    requested: int  # N asked for
    exact: bool  # True when group means and variances are identical by construction
    positions: list[np.ndarray] = field(repr=False)  # M arrays of int64 target positions
    notice: str | None = None  # what was changed (rounding) or approximated (keep_n)

    @property
    def lo(self) -> int:
        return int(min(p.min() for p in self.positions))

    @property
    def hi(self) -> int:
        return int(max(p.max() for p in self.positions))

    def moments(self) -> dict:
        """Achieved per-group mean/variance of target positions and their spread across groups."""
        return {**group_moments(self.positions), "exact": self.exact}


def group_moments(groups) -> dict:
    """Per-group mean and variance of integer positions, in exact integer arithmetic (equal moments compare
    equal), and their spread (max - min) across groups."""
    mean, var = [], []
    for g in groups:
        t = [int(x) for x in g]
        n, s1, s2 = len(t), sum(t), sum(x * x for x in t)
        mean.append(s1 / n)
        var.append((n * s2 - s1 * s1) / (n * n))
    return {"group_mean": mean, "group_var": var, "mean_spread": max(mean) - min(mean),
            "var_spread": max(var) - min(var)}


def exact_unit(modulus: int) -> int:
    return modulus * modulus


def round_up(n: int, modulus: int) -> int:
    """Next multiple of M^2 at or above n."""
    u = exact_unit(modulus)
    return max(1, math.ceil(n / u)) * u


def _factor(q: int) -> tuple[int, int]:
    """q = L1*L2 with L1 >= L2 as close as possible (keeps the position span (L1+L2)*M small)."""
    l2 = max(d for d in range(1, math.isqrt(q) + 1) if q % d == 0)
    return q // l2, l2


def span(modulus: int, n: int) -> int:
    """Number of distinct positions the exact design for N (a multiple of M^2) may touch."""
    l1, l2 = _factor(max(1, n // exact_unit(modulus)))
    return (l1 + l2) * modulus + modulus - 2


def _grid(modulus: int, q: int, base: int) -> list[np.ndarray]:
    """Exact design: per group, the L1*L2*M^2 positions p_r(Y) of the construction above."""
    l1, l2 = _factor(q)
    y = (np.arange(l1 * modulus)[:, None] + np.arange(l2 * modulus)[None, :]).ravel()  # (N,) Y1+Y2
    return [base + y - ((base + y - r) % modulus) for r in range(modulus)]


def make_design(
    modulus: int,
    n_per_group: int,
    center: float,
    keep_n: bool = False,
    rng: np.random.Generator | None = None,
) -> PositionDesign:
    """Target positions for `modulus` residue groups, centred near `center` (the common group mean).

    N a multiple of M^2: exact. Otherwise round N up (warning + notice) or, with keep_n, sample N
    positions per group from the exact design (stratified: whole copies, then a random subset).
    """
    if modulus < 1:
        raise ConfigError(f"modulus must be >= 1, got {modulus}")
    if n_per_group < 1:
        raise ConfigError(f"per-group must be >= 1, got {n_per_group}")
    u = exact_unit(modulus)
    exact_n = n_per_group if n_per_group % u == 0 else round_up(n_per_group, modulus)
    q = exact_n // u
    l1, l2 = _factor(q)
    # E[p] = base + ((l1 + l2) * M - 2) / 2 - (M - 1) / 2: choose the integer base that puts it at center
    base = int(round(center - ((l1 + l2) * modulus - 2) / 2 + (modulus - 1) / 2))
    grid = _grid(modulus, q, base)
    if n_per_group % u == 0:
        return PositionDesign(modulus, n_per_group, n_per_group, True, grid)
    if not keep_n:
        notice = (
            f"per-group N={n_per_group} is not a multiple of M^2={u} (needed for exact mean and variance "
            f"matching at M={modulus}); rounded up to N={exact_n}"
        )
        warnings.warn(notice, stacklevel=2)
        return PositionDesign(modulus, exact_n, n_per_group, True, grid, notice)
    rng = rng or np.random.default_rng(0)
    # keep N: sample from the exactly matched design distribution (one cell of the q=1 grid per draw)
    grid1 = _grid(modulus, 1, int(round(center - (2 * modulus - 2) / 2 + (modulus - 1) / 2)))
    whole, rest = divmod(n_per_group, u)
    pos = [np.concatenate([np.tile(g, whole), g[rng.choice(u, size=rest, replace=False)]]) for g in grid1]
    d = PositionDesign(modulus, n_per_group, n_per_group, False, pos)
    m = d.moments()
    d.notice = (
        f"per-group N={n_per_group} kept (not a multiple of M^2={u}): positions sampled from an exactly "
        f"matched design; achieved spread across groups: mean {m['mean_spread']:.3f}, "
        f"variance {m['var_spread']:.3f}"
    )
    return d
