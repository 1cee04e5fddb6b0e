"""Phase-aware statistics: per-residue accuracy with intervals, gap, fold consistency, periodicity.

Accuracies are proportions in [0, 1] inside this module; `summarize` converts to percent (points) for
reports. The bootstrap unit is the key-name mapping: every mapping is evaluated at every residue, so
resampling mappings keeps the residue groups paired (docs: Evaluation protocols and statistics).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np
from scipy import stats as sps

from phasekv.errors import ConfigError


def wilson(correct, n, alpha: float = 0.05) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval for `correct` successes out of `n` (arrays broadcast); equal to statsmodels'
    proportion_confint(method="wilson")."""
    k = np.asarray(correct, dtype=float)
    n = np.asarray(n, dtype=float)
    if np.any(n <= 0) or np.any(k < 0) or np.any(k > n):
        raise ConfigError(f"wilson: need 0 <= correct <= n and n > 0, got correct={correct}, n={n}")
    z = sps.norm.isf(alpha / 2.0)
    q = k / n
    denom = 1.0 + z**2 / n
    center = (q + z**2 / (2.0 * n)) / denom
    half = z * np.sqrt(q * (1.0 - q) / n + z**2 / (4.0 * n**2)) / denom
    return np.clip(center - half, 0.0, 1.0), np.clip(center + half, 0.0, 1.0)


def clopper_pearson(k: int, n: int, alpha: float = 0.05) -> tuple[float, float]:
    """Exact (Clopper-Pearson) interval for `k` successes out of `n`: beta quantiles, [0, ...] at k = 0 and
    [..., 1] at k = n; never narrower than the nominal coverage, which matters at a handful of trials (seeds)."""
    if n <= 0 or not 0 <= k <= n:
        raise ConfigError(f"clopper_pearson: need 0 <= k <= n and n > 0, got k={k}, n={n}")
    lo = 0.0 if k == 0 else float(sps.beta.ppf(alpha / 2.0, k, n - k + 1))
    hi = 1.0 if k == n else float(sps.beta.ppf(1.0 - alpha / 2.0, k + 1, n - k))
    return lo, hi


def divisors(m: int) -> list[int]:
    return [d for d in range(1, m + 1) if m % d == 0]


def group_table(residue, mapping, correct, modulus: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-(mapping, residue) counts: hits (K, M) and trials (K, M), K = number of distinct mappings."""
    residue = np.asarray(residue, dtype=np.int64)
    correct = np.asarray(correct, dtype=float)
    _, midx = np.unique(np.asarray(mapping), return_inverse=True)
    if residue.size == 0:
        raise ConfigError("statistics need at least one evaluated prompt")
    if residue.min() < 0 or residue.max() >= modulus:
        raise ConfigError(f"residue outside 0..{modulus - 1}")
    K = int(midx.max()) + 1
    hits = np.zeros((K, modulus))
    trials = np.zeros((K, modulus))
    np.add.at(hits, (midx, residue), correct)
    np.add.at(trials, (midx, residue), 1.0)
    return hits, trials


def profile_summary(acc: np.ndarray) -> dict[str, np.ndarray]:
    """mean / worst / best / gap of residue profiles acc (..., M) (mean = mean over residue groups)."""
    worst, best = acc.min(axis=-1), acc.max(axis=-1)
    return {"mean": acc.mean(axis=-1), "worst": worst, "best": best, "gap": best - worst}


MIN_MAPPINGS = 10  # fewer mappings than this: resample prompts within residue groups instead


def bootstrap_profiles(hits: np.ndarray, trials: np.ndarray, n_boot: int = 2000, seed: int = 0) -> np.ndarray:
    """Residue profiles (n_boot, M) from resampling mappings with replacement (the study's unit); with fewer
    than MIN_MAPPINGS mappings, from resampling prompts within each residue group (binomial)."""
    K = hits.shape[0]
    rng = np.random.default_rng(seed)
    if K < MIN_MAPPINGS:
        n, k = trials.sum(0), hits.sum(0)
        return rng.binomial(n.astype(np.int64), k / n, size=(n_boot, n.size)) / n  # (B, M)
    w = rng.multinomial(K, np.full(K, 1.0 / K), size=n_boot).astype(float)  # (B, K) mapping multiplicities
    num, den = w @ hits, w @ trials  # (B, M)
    with np.errstate(invalid="ignore", divide="ignore"):
        acc = num / den
    # a resample that misses every mapping of some residue falls back to that residue's point estimate
    point = hits.sum(0) / np.maximum(trials.sum(0), 1.0)
    return np.where(den > 0, acc, point)


def basic_interval(estimate: float, boot: np.ndarray, level: float = 0.95) -> np.ndarray:
    """Basic (reverse-percentile) bootstrap interval 2*est - q, clipped to [0, 1]. worst/best are
    minima/maxima over noisy groups, biased away from the truth; the percentile interval inherits that
    bias twice (it can miss its own point estimate), the basic interval corrects it to first order."""
    a = (1 - level) / 2 * 100
    lo, hi = np.percentile(boot, [a, 100 - a])
    return np.clip([2 * estimate - hi, 2 * estimate - lo], 0.0, 1.0)


GAP_SPLITS = 32  # random halvings of the mappings averaged by `gap_estimate`
PROMPT_FOLDS = 32  # with fewer than MIN_MAPPINGS mappings: random folds of each group's prompts stand in


def _prompt_folds(hits: np.ndarray, trials: np.ndarray, folds: int, rng) -> tuple[np.ndarray, np.ndarray]:
    """Pool the mappings and deal each residue group's prompts at random into `folds` folds: (folds, M)
    hits and trials whose folds stand in for mappings (prompts resampled within groups, as the study does
    with too few mappings)."""
    k, n = np.rint(hits.sum(0)).astype(np.int64), trials.sum(0).astype(np.int64)  # (M,)
    out = np.zeros((2, folds, k.size))
    for r in range(k.size):
        fold = np.arange(n[r]) % folds
        out[0, :, r] = np.bincount(fold, weights=rng.permutation(n[r]) < k[r], minlength=folds)
        out[1, :, r] = np.bincount(fold, minlength=folds)
    return out[0], out[1]


def _halves(hits: np.ndarray, trials: np.ndarray, n_splits: int, n_boot: int, rng) -> tuple[np.ndarray, ...]:
    """Accuracy profiles of two disjoint halves of the mappings, for n_splits random halvings: point (S, M)
    x 2 and bootstrap resamples of the mappings (B, S, M) x 2 (a resampled mapping stays in its half)."""
    K = hits.shape[0]
    masks = (np.argsort(rng.random((n_splits, K)), axis=1) < K // 2).astype(float)  # (S, K) in half A
    w = np.concatenate([np.ones((1, K)), rng.multinomial(K, np.full(K, 1.0 / K), size=n_boot)])  # (1+B, K)
    out = []
    for half in (masks, 1.0 - masks):
        wh = w[:, None, :] * half[None]  # (1+B, S, K)
        out.append((wh @ hits) / np.maximum(wh @ trials, 1e-12))  # (1+B, S, M)
    return out[0][0], out[1][0], out[0][1:], out[1][1:]


def _crossfit(pa: np.ndarray, pb: np.ndarray, picks_a=None, picks_b=None) -> np.ndarray:
    """best - worst with groups picked on one half and measured on the other, both ways, per split:
    pa, pb (..., S, M) -> (..., S). picks_a/picks_b: (best, worst) indices (S,) to use instead of picking."""
    def diff(sel, val, picks):
        best, worst = picks if picks is not None else (sel.argmax(-1), sel.argmin(-1))
        idx = np.broadcast_to(np.stack(np.broadcast_arrays(best, worst), -1), val.shape[:-1] + (2,))  # (..., S, 2)
        got = np.take_along_axis(val, idx, -1)
        return got[..., 0] - got[..., 1]  # (..., S)
    return 0.5 * (diff(pa, pb, picks_a) + diff(pb, pa, picks_b))


@functools.lru_cache(maxsize=4)
def _unified_belt(level: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Feldman-Cousins confidence belt for x ~ N(mu, 1), mu >= 0: for each mu on a grid, the acceptance
    interval [x1, x2] holding `level` of the mass, filled in order of the likelihood ratio
    N(x; mu, 1) / N(x; max(x, 0), 1). Built once per level (~0.1 s)."""
    mu = np.linspace(0.0, 6.0, 301)  # (U,)
    x = np.linspace(-8.0, 10.0, 901)  # (X,)
    logr = -0.5 * (x[None] - mu[:, None]) ** 2 + 0.5 * np.minimum(x, 0.0)[None] ** 2  # (U, X)
    order = np.argsort(-logr, axis=1, kind="stable")
    mass = np.take_along_axis(sps.norm.pdf(x[None] - mu[:, None]) * (x[1] - x[0]), order, 1)  # (U, X) sorted
    inside = np.zeros(logr.shape, dtype=bool)
    np.put_along_axis(inside, order, np.cumsum(mass, 1) - mass < level, 1)
    return mu, np.where(inside, x, np.inf).min(1), np.where(inside, x, -np.inf).max(1)


def unified_interval(x: float, level: float = 0.95) -> tuple[float, float]:
    """Feldman-Cousins ("unified") interval for mu >= 0 from one x ~ N(mu, 1): [0, upper] near or below 0,
    the central x -+ z once x is well above 0, coverage `level` for every mu including mu = 0."""
    z = float(sps.norm.isf((1 - level) / 2))
    if x >= 4.0:  # the belt is central there
        return x - z, x + z
    mu, x1, x2 = _unified_belt(level)
    return float(mu[np.argmax(x2 >= x)]), float(mu[x1 <= x].max())


def gap_estimate(hits: np.ndarray, trials: np.ndarray, n_boot: int = 2000, seed: int = 0, level: float = 0.95,
                 n_splits: int = GAP_SPLITS) -> tuple[float, np.ndarray]:
    """Cross-fitted best - worst gap and its interval, from per-(mapping, residue) counts (proportions).

    Estimator. The raw max - min of the group accuracies is biased upward: with 24 groups of 576 prompts
    the noise alone spreads them by ~4 standard errors (3 points at 97% accuracy, 8 at 50%), and a bootstrap
    bias correction removes only part of that (the bootstrap world's profile is already spread). The winner's
    curse comes from choosing and measuring the best and worst group on the same data, so this estimator
    separates the two: split the mappings into two halves, pick the best and worst group on one half, measure
    their accuracies on the other, both ways round, and average over `n_splits` random halvings. The measured
    difference is unbiased for the true accuracies of the picked groups, so the estimate is unbiased when the
    extremes are ties (a flat profile, a gap of 0; a weak phase repeated at r, r+S, ...) or well separated; it
    is biased downward only by picking a group that is not truly extreme, i.e. when a second group lies
    within about two half-sample standard errors of the best or worst. Simulated at the study's design
    (tests/eval/test_gap_estimator.py): bias under 0.3 points for one weak phase at gaps 0, 5, 20, 85 at the
    study's accuracies (raw max - min: +2.6 to +4 points); about -1.1 points and ~86% coverage where the
    extremes are hard to tell apart (a 5-point dip at 60% accuracy, a graded 5-point profile). With fewer
    than MIN_MAPPINGS mappings, PROMPT_FOLDS random folds of each group's prompts take the mappings' place.

    Interval. The split estimate is an average of differences of means, close to normal. Its variance is the
    halvings' own (between-split variance / number of splits) plus the bootstrap variance over mappings (same
    halvings; a resampled mapping stays in its half), taken as the mean of two variances that bracket the
    truth: re-picking the groups in every resample overstates how much the picks vary (the resamples' profile
    is the observed one, spread apart by noise, with fewer near-ties than the truth; ~20% too large an SE,
    ~99% coverage), keeping the data's picks ignores it (~30% too small, ~85%); their mean is within ~5% of
    the simulated SD for one weak phase at gaps 0-85. A gap cannot be negative, and a true gap of 0 is the
    case the reports care most about, where a clipped symmetric interval would be one-sided at 97.5% and flip-
    flop between one- and two-sided by the data. So the interval is the Feldman-Cousins unified interval for a
    normal mean bounded at 0 (estimate / SE as the measurement): [0, upper] near 0, the usual estimate +- z SE
    once the estimate is clear of 0, the nominal level at every true gap, 0 included. The reported estimate is
    max(estimate, 0), inside the interval; at a true gap of 0 that adds at most 0.4 SE of upward bias (the
    unclipped estimate is unbiased there).
    """
    rng = np.random.default_rng([seed, 1])  # own stream: bootstrap_profiles' draws stay as they were
    if hits.shape[0] < MIN_MAPPINGS:
        hits, trials = _prompt_folds(hits, trials, PROMPT_FOLDS, rng)
    pa, pb, ba, bb = _halves(hits, trials, n_splits, n_boot, rng)
    picks = [(p.argmax(-1), p.argmin(-1)) for p in (pa, pb)]
    per_split = _crossfit(pa, pb)  # (S,)
    est = float(per_split.mean())
    var = (_crossfit(ba, bb).mean(-1).var() + _crossfit(ba, bb, *picks).mean(-1).var()) / 2  # re-picking / data's picks
    var += per_split.var(ddof=1) / n_splits  # the random halvings' own noise
    se = float(np.sqrt(var))
    if se <= 0:  # every resample alike (e.g. all correct): no spread to report
        return max(est, 0.0), np.full(2, max(est, 0.0))
    lo, hi = unified_interval(est / se, level)
    return max(est, 0.0), np.clip([lo * se, hi * se], 0.0, 1.0)


# delta (points): a profile is flat when its gap's 95% upper bound is below this margin (`flatness`). Fixed from
# full attention alone, before any candidate design was judged by it: the 20 evaluations of full-attention models
# that learned the lookup in the project's measurements (tiny and tiny-8h, 1-8 KV heads, five recipes, both
# paddings, the held-out layout, the mod-16 grid, 96 and 576 prompts per group; listed in
# docs/reference/protocols.md "Flat") have upper bounds 0.0-3.2 (2.8 at most at 576 prompts per group, 3.2 at
# 96), so 3.5, the next half point above the largest, is the smallest such margin under which full attention is
# flat in every one of them.
FLAT_MARGIN = 3.5
FLAT, NOT_FLAT, UNDECIDED = "flat", "not flat", "undecided"  # `flatness`'s words


def flatness(gap_ci, margin: float = FLAT_MARGIN) -> str:
    """Flat by equivalence (the TOST idea: the burden of proof is on flatness): FLAT when the gap's 95% upper
    bound is below `margin`, NOT_FLAT when its lower bound is at or above it (a gap shown larger than the
    margin), UNDECIDED in between (the interval is too wide to tell: more prompts can). Only FLAT is flat: a small
    or noisy evaluation cannot pass by failing to reject, and a large one is not failed for resolving an effect
    smaller than the margin (the periodicity test is a report of the pattern, never a veto below the margin)."""
    lo, hi = gap_ci
    return FLAT if hi < margin else NOT_FLAT if lo >= margin else UNDECIDED


def flat_rule(margin: float = FLAT_MARGIN) -> str:
    """The rule in words, for every output that applies it."""
    why = (" (the next half point above the largest 95% upper bound full attention showed in the project's "
           "measurements, 3.2)"
           if margin == FLAT_MARGIN else "")
    return f"flat: the gap's 95% upper bound below the margin δ = {margin:g} points{why}"


def retrieves(mean_ci, chance: float | None, margin: float | None = None) -> bool:
    """Whether a model retrieves well enough for its profile to be read: the mean's 95% lower bound above twice
    chance (the percentage a guess among the value words gets), and, where a flat verdict at margin δ is to rest
    on it, above chance + δ: a phase lost to chance then leaves a gap of at least the mean's excess over chance,
    over δ, so a gap below δ means no phase was lost. Below that a small gap says nothing (a model at 2.3% with
    chance 0.8% has no room for a gap of δ = 3.5). No chance level (unknown vocabulary): it cannot be told."""
    if chance is None:
        return False
    floor = 2 * chance if margin is None else max(2 * chance, chance + margin)
    return bool(mean_ci[0] > floor)


def phase_profile(acc, stride: int) -> np.ndarray:
    """A residue profile acc (M,) folded mod `stride` (which divides M): the mean accuracy of each phase, (S,)."""
    acc = np.asarray(acc, dtype=float)
    return acc.reshape(len(acc) // stride, stride).mean(0)


GRADED = (20.0, 90.0)  # a phase in between (percent) is neither lost nor kept


def profile_kind(phases) -> str:
    """'graded' (at least 3 phases between 20% and 90%, as in the study's 28-layer models), 'flat' (all phases
    within 20 points) or 'all-or-nothing' (phases kept or lost: few compressed entries per record)."""
    phases = np.asarray(phases, dtype=float)
    if ((phases > GRADED[0]) & (phases < GRADED[1])).sum() >= 3:
        return "graded"
    return "flat" if np.ptp(phases) < 20 else "all-or-nothing"


def fold_consistency(acc: np.ndarray, stride: int) -> float:
    """mean_r |A(r) - A(r+S)| over r = 0..M-S-1 (consecutive stride periods of the residue profile)."""
    acc = np.asarray(acc, dtype=float)
    M = acc.shape[-1]
    if stride <= 0 or M % stride or stride >= M:
        raise ConfigError(f"fold consistency needs a stride that divides the modulus and is smaller: S={stride}, M={M}")
    return float(np.abs(acc[: M - stride] - acc[stride:]).mean())


def periodic_power(acc: np.ndarray, period: int) -> np.ndarray:
    """Share of the profile's non-constant spectral power at period `period` (its harmonics), for
    profiles acc (..., M); 1 for an exactly periodic profile, 0/NaN-safe for flat ones."""
    acc = np.asarray(acc, dtype=float)
    M = acc.shape[-1]
    power = np.abs(np.fft.rfft(acc - acc.mean(-1, keepdims=True), axis=-1)) ** 2  # (..., M//2+1)
    k = np.arange(power.shape[-1])
    weight = np.where((k == 0) | ((M % 2 == 0) & (k == M // 2)), 1.0, 2.0)  # one-sided spectrum weights
    power = power * weight
    harmonic = (k > 0) & (k % (M // period) == 0)
    total = power[..., 1:].sum(-1)
    return np.where(total > 1e-15, power[..., harmonic].sum(-1) / np.maximum(total, 1e-300), 0.0)


def periodicity_test(acc, period: int, n_perm: int = 10000, seed: int = 0) -> dict:
    """Power of the residue profile at period S against a permutation null (residues shuffled)."""
    acc = np.asarray(acc, dtype=float)
    M = acc.shape[-1]
    if period <= 0 or M % period or period >= M:
        raise ConfigError(f"periodicity test needs a period that divides the modulus and is smaller: {period}, M={M}")
    obs = float(periodic_power(acc, period))
    rng = np.random.default_rng(seed)
    perms = rng.permuted(np.broadcast_to(acc, (n_perm, M)), axis=1)  # (n_perm, M)
    null = periodic_power(perms, period)
    p = (1.0 + float(np.sum(null >= obs - 1e-12))) / (1.0 + n_perm)
    return {"period": period, "power": obs, "p_value": p, "n_perm": n_perm}


def detected_period(acc, var, alpha: float = 0.001, share: float = 0.75) -> int:
    """Smallest divisor d of M at which the residue profile repeats: either 'A(r) depends on r mod d only'
    is not rejected by a chi-square lack-of-fit test with per-residue variances `var`, or the period-d fold
    explains at least `share` of the profile's variance (`periodic_power`) and within 1% as much as any
    longer period below M does. The second clause keeps a clearly periodic profile periodic when thousands
    of prompts per group resolve small real deviations from exact periodicity (in-sequence padding places
    the distractors differently in groups r and r + S), without folding a period-6 profile whose two weak
    phases differ onto period 3. 1 means no residue dependence (only the test can say that), M no shorter
    period."""
    acc = np.asarray(acc, dtype=float)
    var = np.maximum(np.asarray(var, dtype=float), 1e-12)
    M = acc.shape[-1]
    r = np.arange(M)
    power = {d: float(periodic_power(acc, d)) for d in divisors(M)}
    for d in divisors(M):
        if d == M:
            return M
        w = 1.0 / var
        fold = np.array([np.sum((w * acc)[r % d == c]) / np.sum(w[r % d == c]) for c in range(d)])
        chi2 = float(np.sum((acc - fold[r % d]) ** 2 * w))
        longer = max(power[e] for e in power if e % d == 0 and e < M)
        if sps.chi2.sf(chi2, M - d) > alpha or (d > 1 and power[d] >= share and power[d] >= 0.99 * longer):
            return d
    return M


@dataclass
class PhaseSummary:
    """Per-residue table and scalar summary (accuracies in percent)."""

    groups: list[dict]
    mean: float
    worst: float
    best: float
    gap: float  # cross-fitted best - worst (`gap_estimate`), the gap every report shows
    gap_ci: list[float]
    gap_raw: float  # max - min of the group accuracies as measured (biased upward by noise)
    mean_ci: list[float]
    worst_ci: list[float]
    best_ci: list[float]
    fold_consistency: float | None
    periodicity: dict
    detected_period: int
    interval: str
    bootstrap_unit: str  # "mapping" or "prompt" (too few mappings)

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def summarize(
    residue,
    mapping,
    correct,
    modulus: int,
    stride: int | None,
    interval: str = "bootstrap",
    n_boot: int = 2000,
    n_perm: int = 10000,
    seed: int = 0,
) -> PhaseSummary:
    """Everything a phase-aware report needs from one run's per-prompt rows.

    interval: "wilson" (per-group binomial intervals; single model) or "bootstrap" (over mappings).
    mean/worst/best get basic bootstrap intervals over mappings; the gap is `gap_estimate` (cross-fitted,
    normal interval with a bootstrap SE), the raw max - min is kept as gap_raw.
    """
    if interval not in ("wilson", "bootstrap"):
        raise ConfigError(f"interval must be 'wilson' or 'bootstrap', got {interval!r}")
    hits, trials = group_table(residue, mapping, correct, modulus)
    k, n = hits.sum(0), trials.sum(0)
    if np.any(n == 0):
        raise ConfigError(f"residue groups without prompts: {np.flatnonzero(n == 0).tolist()}")
    acc = k / n  # (M,)
    boot = bootstrap_profiles(hits, trials, n_boot=n_boot, seed=seed)  # (B, M)
    if interval == "wilson":
        lo, hi = wilson(k, n)
    else:
        lo, hi = np.percentile(boot, [2.5, 97.5], axis=0)
    point = {key: float(v) for key, v in profile_summary(acc).items()}
    ci = {key: basic_interval(point[key], v) for key, v in profile_summary(boot).items() if key != "gap"}
    gap, gap_ci = gap_estimate(hits, trials, n_boot=n_boot, seed=seed)
    # per-residue variance for the period detector: bootstrap variance (captures mapping overdispersion),
    # floored by the binomial variance of a smoothed proportion so 0% / 100% groups stay finite
    smooth = (k + 1.0) / (n + 2.0)
    var = np.maximum(boot.var(0), smooth * (1 - smooth) / n)
    groups = [
        {"residue": r, "n": int(n[r]), "correct": int(round(k[r])), "acc": 100 * float(acc[r]),
         "lo": 100 * float(lo[r]), "hi": 100 * float(hi[r])}
        for r in range(modulus)
    ]
    use_s = stride is not None and 0 < stride < modulus and modulus % stride == 0
    per = periodicity_test(acc, stride, n_perm=n_perm, seed=seed) if use_s else {"period": stride, "p_value": None}
    return PhaseSummary(
        groups=groups,
        mean=100 * point["mean"],
        worst=100 * point["worst"],
        best=100 * point["best"],
        gap=100 * gap,
        gap_ci=[100 * float(x) for x in gap_ci],
        gap_raw=100 * point["gap"],
        mean_ci=[100 * float(x) for x in ci["mean"]],
        worst_ci=[100 * float(x) for x in ci["worst"]],
        best_ci=[100 * float(x) for x in ci["best"]],
        fold_consistency=100 * fold_consistency(acc, stride) if use_s else None,
        periodicity=per,
        detected_period=detected_period(acc, var),
        interval=interval,
        bootstrap_unit="mapping" if hits.shape[0] >= MIN_MAPPINGS else "prompt",
    )
