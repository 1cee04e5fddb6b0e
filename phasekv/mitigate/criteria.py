"""The acceptance check of the mitigations: Pareto flags in (cache size, gap) and the criteria (compression,
gap against full attention's, mean against the baseline's) on point estimates and with the 95% intervals."""

from __future__ import annotations

from phasekv.mitigate.results import CompareRow


def mark_pareto(rows: list[CompareRow]) -> None:
    """Pareto-optimal in (cache_rel, gap): no other model is at least as small in both and smaller in one."""
    for r in rows:
        if r.cache_rel is None:
            r.pareto = None
            continue
        r.pareto = not any(
            o is not r and o.cache_rel is not None and o.cache_rel <= r.cache_rel and o.gap <= r.gap
            and (o.cache_rel < r.cache_rel or o.gap < r.gap) for o in rows)


def acceptance(rows: list[CompareRow], ref: str | None, base: str | None, min_compression: float, factor: float) -> dict:
    """The acceptance check: compression >= min_compression, gap <= factor x the reference's gap, mean >= the
    baseline's. `point`: on the estimates; `ci`: not contradicted by the 95% intervals (gap lower bound <=
    factor x the reference's upper bound, mean upper bound >= the baseline's lower bound); `strict`: implied
    by them (gap upper bound <= factor x the reference's lower bound, mean lower bound >= the baseline's upper).
    `baseline_fails` says whether the baseline itself misses the gap criterion beyond its interval, i.e. whether
    there is a weak spot to repair at all."""
    by = {r.label: r for r in rows}
    out = {"min_compression": min_compression, "max_gap_factor": factor, "reference": ref, "baseline": base,
           "checks": [], "passing": {"point": [], "ci": [], "strict": []}, "best": None}
    if ref is None or base is None:
        out["note"] = "needs a full-attention reference and the baseline among the compared models"
        return out
    R, B = by[ref], by[base]
    out.update(reference_gap=R.gap, reference_gap_ci=R.gap_ci, baseline_mean=B.mean, baseline_mean_ci=B.mean_ci,
               baseline_gap=B.gap, baseline_gap_ci=B.gap_ci, baseline_period_p=B.periodicity_p,
               baseline_detected_period=B.detected_period)
    # is there a weak spot to repair? The baseline must itself fail the gap criterion beyond its interval
    out["baseline_fails"] = B.gap_ci[0] > factor * R.gap_ci[1]
    for r in rows:
        if r.label in (ref, base) or r.compression is None:
            continue
        ok_c = r.compression >= min_compression
        v = {
            "point": ok_c and r.gap <= factor * R.gap and r.mean >= B.mean,
            "ci": ok_c and r.gap_ci[0] <= factor * R.gap_ci[1] and r.mean_ci[1] >= B.mean_ci[0],
            "strict": ok_c and r.gap_ci[1] <= factor * R.gap_ci[0] and r.mean_ci[0] >= B.mean_ci[1],
        }
        out["checks"].append({"label": r.label, "compression": r.compression, "gap": r.gap, "gap_ci": r.gap_ci,
                              "mean": r.mean, "mean_ci": r.mean_ci, **v})
        for k, ok in v.items():
            if ok:
                out["passing"][k].append(r.label)
    eligible = [c for c in out["checks"] if c["compression"] >= min_compression]
    if eligible:  # best: smallest gap relative to the limit, ties broken by the higher mean
        out["best"] = min(eligible, key=lambda c: (c["gap"] / max(factor * R.gap, 1e-9), -c["mean"]))["label"]
    return out


def verdict_lines(summary: dict) -> list[str]:
    c = summary["criteria"]
    if c.get("note"):
        return [f"acceptance check skipped: {c['note']}"]
    lines = [f"acceptance: compression >= {c['min_compression']:g}x, gap <= {c['max_gap_factor']:g} x "
             f"{c['reference']}'s {c['reference_gap']:.1f} [{c['reference_gap_ci'][0]:.1f}, "
             f"{c['reference_gap_ci'][1]:.1f}], mean >= {c['baseline']}'s {c['baseline_mean']:.1f} "
             f"[{c['baseline_mean_ci'][0]:.1f}, {c['baseline_mean_ci'][1]:.1f}]"]
    for k, what in (("point", "on point estimates"), ("ci", "within the 95% intervals"),
                    ("strict", "beyond the 95% intervals")):
        lines.append(f"  passing {what}: {', '.join(c['passing'][k]) or 'none'}")
    if c["best"]:
        lines.append(f"  best eligible: {c['best']}")
    if not c.get("baseline_fails", True):
        lines.append(f"  warning: {c['baseline']} itself meets the gap criterion (gap {c['baseline_gap']:.1f} "
                     f"[{c['baseline_gap_ci'][0]:.1f}, {c['baseline_gap_ci'][1]:.1f}]): there is no clear weak spot to "
                     "repair, so passing says little")
    return lines
