"""Simulation test of the gap estimator (`phasekv.eval.stats.gap_estimate`) at the study's lookup design:
M = 24 residue groups x 576 prompts, 18 per group from each of 32 key-name mappings (the bootstrap unit).
Planted profiles have one weak phase of stride 8 (residues r, r+8, r+16, the study's pattern) and a
per-mapping difficulty effect (logit sd 0.3); for true gaps 0, 5, 20 and 85 points the estimate's bias
must be under 1 point and the 95% interval's coverage within 93-97%, the boundary gap 0 included (the
interval is Feldman-Cousins', one-sided near 0 at the nominal level; see `gap_estimate`)."""

import numpy as np
import pytest
from scipy import stats as sps
from scipy.optimize import brentq

from phasekv.eval.stats import gap_estimate, unified_interval

M, K, PER, STRIDE = 24, 32, 18, 8
REPLICATES, N_BOOT = 1000, 200
MAPPING_SD = 0.3  # per-mapping difficulty, logit scale
# true gap (points) -> (accuracy of the other phases, of the weak phase)
PROFILES = {0: (0.97, 0.97), 5: (0.95, 0.90), 20: (0.90, 0.70), 85: (0.95, 0.10)}


def logit_with_mean(p: float) -> float:
    """Logit a with E[sigmoid(a + u)] = p, u ~ N(0, MAPPING_SD): the group's accuracy over mappings is p."""
    u, w = np.polynomial.hermite_e.hermegauss(40)
    return brentq(lambda a: w @ (1 / (1 + np.exp(-(a + MAPPING_SD * u)))) / w.sum() - p, -20, 20)


def simulate(gap: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Estimates, intervals and raw max - min (points) of REPLICATES simulated evaluations of the profile."""
    hi, lo = (logit_with_mean(q) for q in PROFILES[gap])
    a = np.where(np.arange(M) % STRIDE == 3, lo, hi)  # (M,)
    rng = np.random.default_rng(seed)
    logit = a + rng.normal(0, MAPPING_SD, (REPLICATES, K, 1))  # (R, K, M)
    hits = rng.binomial(PER, 1 / (1 + np.exp(-logit))).astype(float)  # (R, K, M)
    trials = np.full((K, M), float(PER))
    out = [gap_estimate(h, trials, n_boot=N_BOOT, seed=i) for i, h in enumerate(hits)]
    raw = np.ptp(hits.sum(1) / (K * PER), -1)
    return 100 * np.array([e for e, _ in out]), 100 * np.array([ci for _, ci in out]), 100 * raw


@pytest.mark.parametrize("gap", sorted(PROFILES))
def test_gap_estimate_unbiased_and_covers(gap):
    est, ci, raw = simulate(gap, seed=gap)
    assert np.all((ci[:, 0] <= est) & (est <= ci[:, 1]))  # the interval contains its estimate
    assert abs(est.mean() - gap) < 1.0
    coverage = np.mean((ci[:, 0] <= gap) & (gap <= ci[:, 1]))
    assert 0.93 <= coverage <= 0.97, coverage
    assert raw.mean() - gap > est.mean() - gap  # the raw max - min is the more biased one


def test_unified_interval_covers_at_every_mean_and_holds_the_estimate():
    """Feldman-Cousins for x ~ N(mu, 1), mu >= 0: exact coverage at mu = 0 (the boundary) and above, always
    containing max(x, 0), [0, upper] below 0 and the central x -+ 1.96 far from it."""
    x = np.linspace(-6, 10, 3201)
    ci = np.array([unified_interval(v) for v in x])  # (X, 2)
    assert np.all((ci[:, 0] <= np.maximum(x, 0)) & (np.maximum(x, 0) <= ci[:, 1]))
    for mu in (0.0, 0.3, 1.0, 2.0, 3.5, 5.0):
        inside = (ci[:, 0] <= mu + 1e-9) & (mu - 1e-9 <= ci[:, 1])
        assert sps.norm.pdf(x - mu) @ inside * (x[1] - x[0]) == pytest.approx(0.95, abs=0.006), mu
    assert unified_interval(-2.0)[0] == 0 and unified_interval(6.0) == pytest.approx((6 - 1.96, 6 + 1.96), abs=0.01)
