"""The study's claims C1-C11 (docs: The study and its claims), each with a verdict computed from a study directory's results.

`facts(study)` gathers what the rules read, keyed by paper name; each rule (`c1` .. `c10`) is a small
function of those facts that returns a `Verdict`: `reproduced`, `not reproduced`, or `not testable here`
with the reason (the run that would test it is missing, or did not learn the task). Verdicts are read
under prefix padding (the protocol of the published table) unless the claim names both paddings. The
published numbers are shown beside ours as evidence (`phasekv.report.published`), never used as results.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from phasekv.config.names import DEFAULTS, parse_name, seed_of, unseeded
from phasekv.errors import ModelNameError
from phasekv.eval.stats import FLAT, FLAT_MARGIN, NOT_FLAT, clopper_pearson, flat_rule, flatness
from phasekv.report import posttrain
from phasekv.report import published as pub
from phasekv.report.checks import periodic, repair_aliases
from phasekv.report.load import Study
from phasekv.report.tables import learned
from phasekv.report.verdict import (
    NOT_REPRODUCED,
    PADDING,
    REPRODUCED,
    UNTESTABLE,
    VARIES,
    Verdict,
    ci,
    rounded,
    text,
)

FULL_1KV, FULL_8KV, W8S8, W8S4 = "Full attention · 1 KV", "Full attention · 8 KV", "W8/S8 · 1 KV", "W8/S4 · 1 KV"
STRIDES = (4, 6, 8, 12)  # the strides C1 names
MEAN_RATIO = 0.9  # C3: "approaches" = a mean at least this fraction of full attention's
WITHIN_WINDOW = 50.0  # C4: points among phases 0..S-2
PERSISTS = ("W8/S8 · 1 KV · no RoPE", "W8/S8 · 1 KV · uniform averaging")  # C5's runs
SPECIFIC, UNIFORM = 0.3, 0.15  # C7: a head's worst-group loss above its mean loss (relative): phase-specific / flat
CONCENTRATED, ALIGNED = 2.0, 0.5  # C8: static exp(H(E[alpha])) at most this; gate-score/knockout-loss correlation


@dataclass
class Facts:
    """What the claims' rules read, keyed by paper name (synthetic ones in the tests)."""

    lookup: dict[str, dict[str, dict]] = field(default_factory=dict)  # padding -> name -> lookup summary.json
    knockout: dict[str, dict] = field(default_factory=dict)  # name -> knockout summary.json
    gates: dict[str, dict] = field(default_factory=dict)  # name -> gates summary.json
    cycle: dict[str, dict] = field(default_factory=dict)  # name -> {"grid", "boundary_phase", "profiles": {d: acc}}
    theory: dict[str, dict] = field(default_factory=dict)  # minimisers | flow | coverage -> summary.json
    posttrain: list[dict] = field(default_factory=list)  # post-trained models beside their bases (`posttrain.pairs`)


def _compressed(name: str) -> bool:
    return parse_name(name).get("window", 1) > 0


def usable(f: Facts, padding: str = PADDING) -> tuple[dict[str, dict], dict[str, str]]:
    """Lookup summaries of the runs that learned the task under `padding`, and why the others are left out."""
    runs = f.lookup.get(padding, {})
    ok = {n: s for n, s in runs.items() if learned(s)}
    return ok, {n: f"did not learn the lookup (mean {text(s, 'mean')})" for n, s in runs.items() if n not in ok}


def _missing(names, ok: dict, left_out: dict) -> dict[str, str]:
    return {n: left_out.get(n, "not run") for n in names if n not in ok}


def _scope(missing: dict[str, str]) -> str:
    return "" if not missing else " Not tested: " + "; ".join(f"{n} ({why})" for n, why in missing.items()) + "."


def phase_accuracy(s: dict, stride: int) -> tuple[np.ndarray, np.ndarray]:
    """Accuracy (points) and prompts per phase t mod S, pooled over the residue groups of each phase."""
    g = s["groups"]
    correct, n = np.zeros(stride), np.zeros(stride)
    for row in g:
        correct[row["residue"] % stride] += row["correct"]
        n[row["residue"] % stride] += row["n"]
    return 100 * correct / np.maximum(n, 1), n


def _weak_phases(f: Facts, ok: dict) -> set[str]:
    """Compressed runs with weak phases: gap interval above every full-attention baseline's."""
    base_hi = max((ci(s, "gap")["ci"][1] or 0.0 for n, s in ok.items() if not _compressed(n)), default=None)
    if base_hi is None:
        return set()
    return {n for n, s in ok.items() if _compressed(n) and (ci(s, "gap")["ci"][0] or 0.0) > base_hi}


def c1(f: Facts) -> Verdict:
    """Periodic with period S, in the runs that differ from the default only in W and S."""
    ok, left = usable(f)
    head_only = {"window", "stride", "n_kv_heads"}  # W/S · 1 KV: no other attribute
    base = [n for n in f.lookup.get(PADDING, {})
            if _compressed(n) and set(parse_name(n)) <= head_only and parse_name(n)["n_kv_heads"] == 1]
    runs = {n: ok[n] for n in base if n in ok}
    if not runs:
        return Verdict("C1", UNTESTABLE, "no W/S · 1 KV run learned the lookup (or none was run)." + _scope(
            _missing(base, ok, left)))
    res = {n: {"stride": s["stride"], "detected_period": s.get("detected_period"), "gap": ci(s, "gap"),
               "p_value": (s.get("periodicity") or {}).get("p_value"), "periodic": periodic(s, s["stride"])}
           for n, s in runs.items()}
    strides = sorted({r["stride"] for r in res.values()})
    missing = {f"stride {s}": "not run" for s in STRIDES if s not in strides}
    good = [n for n, r in res.items() if r["periodic"]]
    verdict = REPRODUCED if len(good) == len(res) else NOT_REPRODUCED
    reason = (f"{len(good)} of {len(res)} runs periodic with period S (p < 0.05 and detected period = S): "
              + ", ".join(f"{n} (period {r['detected_period']})" for n, r in res.items()) + "."
              + _scope({**missing, **_missing(base, ok, left)}))
    return Verdict("C1", verdict, reason, {"runs": res, "strides_tested": strides, "padding": PADDING})


def c2(f: Facts) -> Verdict:
    """Every full-attention baseline flat by equivalence (`flatness`: the gap's 95% upper bound below the
    margin), under both paddings. The paper's bound (a point estimate of at most 6.1) is shown as evidence."""
    paddings = list(f.lookup)
    runs = {}
    for padding in paddings:
        ok, _ = usable(f, padding)
        runs.update({f"{n}, {padding}": s for n, s in ok.items() if not _compressed(n)})
    rows = {k: ci(s, "gap") for k, s in runs.items()}
    if not rows or len(paddings) < 2:
        why = "no full-attention baseline learned the lookup" if not rows else "needs both paddings"
        return Verdict("C2", UNTESTABLE, why + ".", {"gaps": rows})
    flat = {k: flatness(s["gap_ci"]) for k, s in runs.items()}
    verdict = REPRODUCED if all(v == FLAT for v in flat.values()) else NOT_REPRODUCED
    reason = (f"{sum(v == FLAT for v in flat.values())} of {len(flat)} baselines {flat_rule()}: "
              + "; ".join(f"{k} {v['value']} [{v['ci'][0]}, {v['ci'][1]}] ({flat[k]})" for k, v in rows.items()) + ".")
    published = {"baselines' gap at most": pub.BASELINE_GAP_MAX, **{f"{n} gap": pub.LOOKUP_PREFIX[n][2]
                                                                  for n in (FULL_1KV, FULL_8KV)}}
    return Verdict("C2", verdict, reason, {"gaps": rows, "flatness": flat, "margin": FLAT_MARGIN,
                                           "published": published})


def c3(f: Facts) -> Verdict:
    """W8/S8 · 8 KV: mean near full attention · 8 KV's, worst phase far below its worst."""
    ok, left = usable(f)
    c8, need = "W8/S8 · 8 KV", ("W8/S8 · 8 KV", FULL_8KV)
    if any(n not in ok for n in need):
        return Verdict("C3", UNTESTABLE, f"needs {c8} and {FULL_8KV}." + _scope(_missing(need, ok, left)))
    c, b = ok[c8], ok[FULL_8KV]
    close = c["mean"] >= MEAN_RATIO * b["mean"]
    floor = ci(c, "worst")["ci"][1] < ci(b, "worst")["ci"][0] / 2
    verdict = REPRODUCED if close and floor else NOT_REPRODUCED
    reason = (f"mean {text(c, 'mean')} vs {text(b, 'mean')} ({'' if close else 'not '}within {MEAN_RATIO:.0%}); "
              f"worst {text(c, 'worst')} vs {text(b, 'worst')} ({'' if floor else 'not '}below half of it).")
    evidence = {n: {"mean": ci(s, "mean"), "worst": ci(s, "worst")} for n, s in ((c8, c), (FULL_8KV, b))}
    if W8S8 in ok:
        evidence[W8S8] = {"mean": ci(ok[W8S8], "mean"), "worst": ci(ok[W8S8], "worst")}
    return Verdict("C3", verdict, reason, {**evidence, "published": {n: pub.LOOKUP_PREFIX[n] for n in need}})


def within_window(s: dict, stride: int) -> dict:
    """Spread (points) among phases 0..S-2 and a normal-approximation 95% interval of the difference of the
    two extreme phases (their counts are large: a phase pools M/S residue groups)."""
    acc, n = phase_accuracy(s, stride)
    a, k = acc[: stride - 1], n[: stride - 1]
    hi, lo = int(np.argmax(a)), int(np.argmin(a))
    p = a / 100
    se = 100 * float(np.sqrt(p[hi] * (1 - p[hi]) / max(k[hi], 1) + p[lo] * (1 - p[lo]) / max(k[lo], 1)))
    spread = float(a[hi] - a[lo])
    return {"spread": rounded(spread), "ci": [rounded(spread - 1.96 * se), rounded(spread + 1.96 * se)],
            "phases": [rounded(x) for x in acc], "strongest": hi, "weakest": lo}


def c4(f: Facts) -> Verdict:
    """Phases inside a window (0..S-2) of W8/S8 · 1 KV differ by more than 50 points."""
    ok, left = usable(f)
    if W8S8 not in ok:
        return Verdict("C4", UNTESTABLE, "needs W8/S8 · 1 KV." + _scope(_missing([W8S8], ok, left)))
    res = {W8S8: within_window(ok[W8S8], 8)}
    lo = res[W8S8]["ci"][0]
    verdict = REPRODUCED if lo > WITHIN_WINDOW else NOT_REPRODUCED
    pub_spread = {f"{n}, phases 0..6 span": rounded(max(p[:-1]) - min(p[:-1])) for n, p in pub.PHASE_PROFILES.items()}
    reason = (f"{W8S8}: phases 0..6 span {res[W8S8]['spread']} points [{lo}, {res[W8S8]['ci'][1]}] "
              f"({'above' if verdict == REPRODUCED else 'not above'} {WITHIN_WINDOW:.0f}).")
    return Verdict("C4", verdict, reason, {"runs": res, "published": pub_spread})


def c5(f: Facts) -> Verdict:
    """No RoPE and uniform averaging: still periodic with period S, gap above full attention · 1 KV's."""
    ok, left = usable(f)
    runs = {n: ok[n] for n in PERSISTS if n in ok}
    if not runs or FULL_1KV not in ok:
        return Verdict("C5", UNTESTABLE, f"needs {' or '.join(PERSISTS)} beside {FULL_1KV}."
                       + _scope(_missing((*PERSISTS, FULL_1KV), ok, left)))
    base_hi = ci(ok[FULL_1KV], "gap")["ci"][1]
    res = {n: {"periodic": periodic(s, 8), "detected_period": s.get("detected_period"), "gap": ci(s, "gap"),
               "gap_above_baseline": ci(s, "gap")["ci"][0] > base_hi} for n, s in runs.items()}
    held = all(r["periodic"] and r["gap_above_baseline"] for r in res.values())
    reason = "; ".join(f"{n}: {'' if r['periodic'] else 'not '}periodic (period {r['detected_period']}), gap "
                       f"{text(runs[n], 'gap')} vs {FULL_1KV} {text(ok[FULL_1KV], 'gap')}" for n, r in res.items())
    published = {n: pub.LOOKUP_PREFIX[n] for n in PERSISTS if n in pub.LOOKUP_PREFIX}
    return Verdict("C5", REPRODUCED if held else NOT_REPRODUCED, reason + "." + _scope(_missing(PERSISTS, ok, left)),
                   {"runs": res, "baseline_gap": ci(ok[FULL_1KV], "gap"), "published": published})


def c6(f: Facts) -> Verdict:
    """W8/S4's gap below W8/S8's (narrows: intervals apart) and not removed: shown above the flatness margin
    (`flatness`: its gap's 95% lower bound at or above delta; full attention's gap beside it as evidence)."""
    ok, left = usable(f)
    need = (W8S4, W8S8, FULL_1KV)
    if any(n not in ok for n in need):
        return Verdict("C6", UNTESTABLE, f"needs {', '.join(need)}." + _scope(_missing(need, ok, left)))
    o, w, b = (ci(ok[n], "gap") for n in need)
    narrows, remains = o["ci"][1] < w["ci"][0], flatness(ok[W8S4]["gap_ci"]) == NOT_FLAT
    other = {p: {n: ci(runs[n], "gap") for n in need if n in runs} for p, runs in f.lookup.items() if p != PADDING}
    reason = (f"gap {W8S4} {text(ok[W8S4], 'gap')} vs {W8S8} {text(ok[W8S8], 'gap')} "
              f"({'narrower, intervals apart' if narrows else 'not narrower'}) vs {FULL_1KV} "
              f"{text(ok[FULL_1KV], 'gap')} ({'not removed: above' if remains else 'not shown above'} δ = "
              f"{FLAT_MARGIN:g})"
              + "".join(f"; {p} padding: {v.get(W8S4, {}).get('value')} vs {v.get(W8S8, {}).get('value')}"
                        for p, v in other.items()) + ".")
    return Verdict("C6", REPRODUCED if narrows and remains else NOT_REPRODUCED, reason,
                   {"gaps": dict(zip(need, (o, w, b), strict=True)), "other_paddings": other,
                    "published": {n: pub.LOOKUP_PREFIX[n][2] for n in (W8S4, W8S8)}})


def _learned_gate(name: str) -> bool:
    return parse_name(name).get("gate") != "uniform"


def c7(f: Facts) -> Verdict:
    """Knockouts phase-specific in every compressed run with learned gates and weak phases (uniform averaging's
    heads have no phase preference to knock out; their numbers are in the evidence), uniform in full attention."""
    ok, _ = usable(f)
    weak = {n for n in _weak_phases(f, ok) if _learned_gate(n)}
    spec = {n: max((u["specificity"] for u in k.get("strongest", [])), default=0.0) for n, k in f.knockout.items()
            if n in ok}
    comp = {n: v for n, v in spec.items() if n in weak}
    base = {n: v for n, v in spec.items() if not _compressed(n)}
    if not comp or not base:
        return Verdict("C7", UNTESTABLE, "needs knockouts of a full-attention baseline and of a compressed run "
                       "with learned gates and weak phases (gap interval above the baselines').",
                       {"specificity": {n: rounded(v, 3) for n, v in spec.items()}})
    good = [n for n, v in comp.items() if v >= SPECIFIC] + [n for n, v in base.items() if v <= UNIFORM]
    verdict = REPRODUCED if len(good) == len(comp) + len(base) else NOT_REPRODUCED
    reason = (f"most phase-specific KV head (worst group's relative loss minus the head's mean loss): compressed "
              f"(≥ {SPECIFIC} expected) " + ", ".join(f"{n} {v:.2f}" for n, v in comp.items())
              + f"; full attention (≤ {UNIFORM} expected) " + ", ".join(f"{n} {v:.2f}" for n, v in base.items()) + ".")
    return Verdict("C7", verdict, reason, {"specificity": {n: rounded(v, 3) for n, v in spec.items()},
                                           "tested": sorted([*comp, *base])})


def _aligned(row: dict) -> bool:
    """A head's gate preference lines up with its knockout: its key or (shifted) value gate peaks at the phase
    the knockout hurts most, or its score correlates with the knockout loss across phases."""
    peak = row.get("ko_worst_phase")
    corr = max((row.get(f"{b}_loss_corr") or -1.0) for b in ("key", "value"))
    return peak is not None and (peak in (row.get("key_peak_phase"), row.get("value_peak_phase")) or corr >= ALIGNED)


def c8(f: Facts) -> Verdict:
    """Some gates statically concentrated (static ≤ 2), and most of those line up with their knockout."""
    ok, _ = usable(f)
    heads = [{"model": n, **a} for n, g in f.gates.items() if n in ok for a in g.get("alignment", [])]
    if not heads:
        return Verdict("C8", UNTESTABLE, "needs gate statistics with knockouts of a run with learned gates that "
                       "learned the lookup.")
    conc = [h for h in heads if h["static"] <= CONCENTRATED]
    aligned = [h for h in conc if _aligned(h)]
    held = bool(conc) and 2 * len(aligned) >= len(conc)
    reason = (f"{len(conc)} of {len(heads)} key gates statically concentrated (exp(H(E[α])) ≤ {CONCENTRATED}; "
              f"lowest {min(h['static'] for h in heads):.2f}); {len(aligned)} of them line up with their knockout.")
    evidence = {"heads": len(heads), "concentrated": [{k: h.get(k) for k in ("model", "layer", "kv_head", "static",
                                                                          "ko_worst_phase", "key_peak_phase")}
                                                      for h in conc], "aligned": len(aligned)}
    return Verdict("C8", REPRODUCED if held else NOT_REPRODUCED, reason, evidence)


def _cycled(c: dict) -> dict:
    """Per-δ R² (with interval) and whether the boundary phase stays weak (at or below the median phase)."""
    b = c["boundary_phase"]
    stays = {d: p[b] <= float(np.median(p)) for d, p in c["profiles"].items() if int(d) != 0}
    r2 = {int(r["delta"]): [rounded(r.get("r2"), 2), rounded(r.get("r2_lo"), 2), rounded(r.get("r2_hi"), 2)] for r in c["grid"]}
    reach = [r.get("r2_hi") is not None and r["r2_hi"] >= pub.CYCLING_R2[0] for r in c["grid"]]
    return {"r2": r2, "in_range": bool(reach) and all(reach),
            "boundary_stays_weak": all(stays.values()) and bool(stays)}


def c9(f: Facts) -> Verdict:
    """Every cycled W = S run with weak phases: R² reaches the published range for every δ, boundary stays weak."""
    ok, _ = usable(f)
    weak = _weak_phases(f, ok)
    res = {n: _cycled(c) for n, c in f.cycle.items() if n in weak}
    if not res:
        return Verdict("C9", UNTESTABLE, "needs gate cycling of a W = S run with weak phases (gap interval above "
                       "the full-attention baselines').")
    held = all(r["in_range"] and r["boundary_stays_weak"] for r in res.values())
    reason = "; ".join(f"{n}: R² " + ", ".join(f"δ={d:+d} {v[0]} [{v[1]}, {v[2]}]" for d, v in r["r2"].items())
                       + f", boundary phase {'stays' if r['boundary_stays_weak'] else 'does not stay'} weak"
                       for n, r in res.items())
    return Verdict("C9", REPRODUCED if held else NOT_REPRODUCED, reason + ".",
                   {"runs": res, "published": {"R² excluding the boundary phase": list(pub.CYCLING_R2)}})


def c10(f: Facts) -> Verdict:
    """Theorem 1 (one-hot minimisers), Theorem 2 (gradient flow reaches static positions), and collisions."""
    t = f.theory
    if not {"minimisers", "flow"} <= set(t):
        return Verdict("C10", UNTESTABLE, "needs the theory checks (minimisers, flow).")
    parts = {"theorem 1": t["minimisers"].get("claim_reproduced"), "theorem 2": t["flow"].get("claim_reproduced"),
             "heads collide (nothing pushes them apart)": t["flow"].get("collisions_occur")}
    held = all(v is True for v in parts.values())
    reason = "; ".join(f"{k}: {'shown' if v else 'not shown'}" for k, v in parts.items()) + "."
    return Verdict("C10", REPRODUCED if held else NOT_REPRODUCED, reason, {"checks": parts})


def c11(f: Facts) -> Verdict:
    """Post-training raises the mean, narrows the gap and keeps the period (its own module: `report.posttrain`)."""
    return posttrain.c11(f.posttrain)


RULES = (c1, c2, c3, c4, c5, c6, c7, c8, c9, c10, c11)
# read once over the whole directory, not per seed: C10 is about the idealised model, C11 reads each seed's pair itself
SEEDLESS = (c10, c11)


def by_seed(f: Facts) -> dict[int, Facts]:
    """The facts of the runs trained at each seed, keyed by their names without it (`· seed N`): each seed's runs
    are read apart, never a seed's run beside another seed's. The theory checks belong to every seed."""
    out: dict[int, Facts] = {}
    for padding, runs in f.lookup.items():
        for n, s in runs.items():
            out.setdefault(seed_of(n), Facts(theory=f.theory)).lookup.setdefault(padding, {})[unseeded(n)] = s
    for key in ("knockout", "gates", "cycle"):
        for n, s in getattr(f, key).items():
            getattr(out.setdefault(seed_of(n), Facts(theory=f.theory)), key)[unseeded(n)] = s
    return dict(sorted(out.items()))


def verdicts(f: Facts) -> list[Verdict]:
    """Every claim's verdict: at one seed, read on its runs; at several, read at each seed and stated once
    (`over_seeds`)."""
    seeds = by_seed(f) or {DEFAULTS["seed"]: f}
    if len(seeds) == 1:
        (seed, g), = seeds.items()
        return [rule(f) if rule in SEEDLESS else at_seed_of(rule(g), seed) for rule in RULES]
    return [rule(f) if rule in SEEDLESS else over_seeds({s: rule(g) for s, g in seeds.items()}) for rule in RULES]


@dataclass
class SeedTable:
    """Every claim's verdict at each seed of a directory, and the models that did not learn at each (never read)."""

    seeds: list[int]
    verdicts: dict[str, dict[int, str]]  # claim -> seed -> its verdict there
    unlearned: dict[int, list[str]]  # seed -> the models that did not learn the lookup there (either padding)

    def varying(self) -> list[str]:
        """The claims whose verdict changes with the seed (among the seeds where they could be tested)."""
        return [c for c, by in self.verdicts.items() if len({v for v in by.values() if v != UNTESTABLE}) > 1]


def seed_table(f: Facts) -> SeedTable | None:
    """The claims at each seed (`by_seed`) side by side; None with one seed."""
    seeds = by_seed(f)
    if len(seeds) < 2:
        return None
    found = {s: verdicts(g) for s, g in seeds.items()}
    table = {v.claim: {s: found[s][i].verdict for s in seeds} for i, v in enumerate(found[next(iter(seeds))])
             if RULES[i] not in SEEDLESS}
    unlearned = {s: sorted({n for p in g.lookup for n in usable(g, p)[1]}) for s, g in seeds.items()}
    return SeedTable(list(seeds), table, unlearned)


def at_seed_of(v: Verdict, seed: int) -> Verdict:
    """A verdict read at one seed, the seed named where it is not the default (42)."""
    if seed == DEFAULTS["seed"]:
        return v
    return Verdict(v.claim, v.verdict, f"At seed {seed}: {v.reason}", v.evidence | {"seeds": [seed]})


def _seed_list(seeds: list[int]) -> str:
    return ("seed " if len(seeds) == 1 else "seeds ") + ", ".join(map(str, seeds))


def over_seeds(found: dict[int, Verdict]) -> Verdict:
    """One claim read at several seeds (seed -> its verdict there), stated once: reproduced at every seed it could be
    tested at, at none, or VARIES; k of n with an exact (Clopper-Pearson) 95% interval, the failing seeds named with
    their numbers, the seeds where it could not be tested (a run missing, or one that did not learn) named too."""
    claim = next(iter(found.values())).claim
    tested = [s for s, v in found.items() if v.verdict != UNTESTABLE]
    held = [s for s in tested if found[s].verdict == REPRODUCED]
    failing, untested = [s for s in tested if s not in held], [s for s in found if s not in tested]
    evidence = {"seeds": {s: {"verdict": v.verdict, "reason": v.reason, "evidence": v.evidence}
                          for s, v in found.items()},
                "reproduced_seeds": held, "failing_seeds": failing, "untestable_seeds": untested}
    why_not = "".join(f" Not testable at seed {s}: {found[s].reason}" for s in untested)
    if not tested:
        return Verdict(claim, UNTESTABLE, f"at none of {len(found)} seeds.{why_not}", evidence)
    lo, hi = clopper_pearson(len(held), len(tested))
    verdict = REPRODUCED if not failing else NOT_REPRODUCED if not held else VARIES
    reason = (f"{len(held)} of {len(tested)} seeds (exact 95% interval {100 * lo:.0f}-{100 * hi:.0f}%)"
              + (f", at {_seed_list(held)}" if held and failing else "")
              + "".join(f"; not at seed {s}: {found[s].reason}" for s in failing)
              + ("." if not failing else "") + why_not)
    return Verdict(claim, verdict, reason, evidence | {"rate_ci": [lo, hi]})


def _cycle_facts(stage) -> dict:
    d, models = stage.results, stage.summary.get("models") or [{}]
    profiles = {} if d is None else {int(k): g.sort_values("phase")["acc"].to_numpy() * 100
                                     for k, g in d.groupby("delta")}
    return {"grid": stage.summary.get("grid", []), "boundary_phase": models[0].get("boundary_phase"),
            "profiles": profiles}


def _paper_name(name: str) -> bool:
    try:
        parse_name(name)
    except ModelNameError:  # e.g. a Hugging Face model evaluated beside the study's: no claim is about it
        return False
    return True


def _named(study: Study, stages: dict, fn=lambda stage: stage.summary) -> dict:
    """fn(stage) of each stage of a model with a paper name, keyed by that name instead of its alias; the plan's
    repair designs left out (built to have no weak phase, they are checked against the repair's goals, not as the
    study's compressed models: W3/S2 · 1 KV is flat, and C1 would count it as a stride that shows no period)."""
    names = {a: study.models[a].name if a in study.models else a for a in stages}
    repairs = repair_aliases(study)
    return {names[a]: fn(st) for a, st in stages.items() if _paper_name(names[a]) and a not in repairs}


def facts(study: Study) -> Facts:
    """The study's results keyed by paper name."""
    an = study.analyses
    cycle = _named(study, an.get("cycle", {}), _cycle_facts)
    return Facts(lookup={p: _named(study, st) for p, st in study.lookup.items() if st},
                 knockout=_named(study, an.get("knockout", {})), gates=_named(study, an.get("gates", {})),
                 cycle={n: c for n, c in cycle.items() if c["boundary_phase"] is not None},
                 theory={k: st.summary for k, st in study.theory.items()}, posttrain=posttrain.pairs(study))
