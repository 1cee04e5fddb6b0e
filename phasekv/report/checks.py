"""The report's verdicts: what the numbers do (and do not) show, computed, never asserted.

Each check compares measured quantities with intervals; the report prints every check with the numbers
behind it, passed or not, so a tiny model that fails to reproduce an effect is reported as such.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from phasekv import config
from phasekv.config.names import unseeded
from phasekv.eval.protocols import LOOKUP
from phasekv.eval.stats import FLAT, FLAT_MARGIN, flatness
from phasekv.report.load import Study, retrieval_evals
from phasekv.report.published import CYCLING_R2
from phasekv.report.tables import learned, r2_grid

ALPHA = 0.05  # significance level for "periodic"


@dataclass
class Check:
    claim: str  # what is being checked, in the paper's words
    passed: bool | None  # None: could not be checked (missing results)
    detail: str  # the numbers behind the verdict


def _gap(s: dict) -> tuple[float, float, float]:
    lo, hi = s.get("gap_ci") or (float("nan"), float("nan"))
    return float(s["gap"]), float(lo), float(hi)


def periodic(s: dict, stride: int) -> bool:
    """Significant power at the stride's period and a detected period equal to the stride."""
    p = (s.get("periodicity") or {}).get("p_value")
    return p is not None and p < ALPHA and s.get("detected_period") == stride


def entries_per_record(s: dict, stride: int) -> tuple[float, str] | None:
    """Compressed entries a model can spend on each record of a lookup prompt, and the product behind it:
    layers x KV heads x tokens per record / S (one entry holds about one record). Below 1 some records
    cannot have an entry of their own, which forces weak phases; at or above 1 only what the model learned can
    (the demo's W8/S4: 1.00, flat when trained on densely packed records, periodic when trained spaced out)."""
    prov = s.get("provenance") or {}
    cfg, pc = (prov.get("model_info") or {}).get("config") or {}, prov.get("prompt_config") or {}
    if not cfg.get("n_layers") or not pc or not stride:
        return None
    per_record = pc.get("key_tokens", 1) + 1 + (pc.get("separator") is not None)  # tokens per record
    n = config.entries_per_record(cfg["n_layers"], cfg.get("n_kv_heads", 1), stride, per_record)
    return n, f"{cfg['n_layers']} layers × {cfg.get('n_kv_heads', 1)} KV × {per_record} tokens per record / S={stride}"


def lookup_checks(study: Study, padding: str, protocol: str = LOOKUP.name) -> list[Check]:
    """The checks of a retrieval protocol's evaluations under one padding (default: the lookup)."""
    stages = study.evals.get(protocol, {}).get(padding, {})
    models = study.models
    out: list[Check] = []
    if not stages:
        return [Check(f"{protocol} evaluation ({padding} padding) was run", None, "no results found")]
    learnt = {}
    for alias, st in stages.items():  # without retrieval there is no phase pattern to measure
        s = st.summary
        if s.get("records"):
            chance = 100.0 / s["records"]
            lo = (s.get("mean_ci") or [s["mean"]])[0]
            learnt[alias] = learned(s)
            out.append(Check(f"{models[alias].name}: retrieves well above chance (mean's interval above 2× chance)",
                             learnt[alias], f"mean {s['mean']:.1f} [{lo:.1f}, …] vs chance ≈ {chance:.1f} "
                             f"(1 of {s['records']} names)"))
    baselines = [a for a in stages if a in models and not models[a].compressed]
    repairs = repair_aliases(study)
    compressed = [a for a in stages if a in models and models[a].compressed and a not in repairs]
    base = baselines[0] if baselines else None
    for alias in (a for a in stages if a in repairs):
        out.append(_repair_check(models[alias].name, stages[alias].summary,
                                 stages[base].summary if base else None, models[base].name if base else None))
    for alias in compressed:
        m, s = models[alias], stages[alias].summary
        gap, lo, hi = _gap(s)
        if base is None:
            out.append(Check(f"{m.name}: gap far above full attention's", None,
                             f"gap {gap:.1f} [{lo:.1f}, {hi:.1f}]; no full-attention baseline under {padding} padding"))
        else:
            bgap, blo, bhi = _gap(stages[base].summary)
            ok = lo > bhi
            cap = entries_per_record(s, m.stride)
            out.append(Check(
                f"{m.name}: gap above {models[base].name}'s, intervals not overlapping", ok,
                f"gap {gap:.1f} [{lo:.1f}, {hi:.1f}] vs {bgap:.1f} [{blo:.1f}, {bhi:.1f}]"
                + ("" if ok else " (intervals overlap)")
                + ("" if cap is None else f"; compressed entries per record {cap[0]:.2f} ({cap[1]})"
                   + (": capacity alone does not force a weak phase, any gap is learned" if cap[0] >= 1 else "")),
            ))
        det = s.get("detected_period")
        out.append(Check(f"{m.name}: detected period equals the stride S={m.stride}", det == m.stride,
                         f"detected period {det} (among the divisors of M={s.get('modulus')})"))
        if m.gate == "uniform":
            p = (s.get("periodicity") or {}).get("p_value")
            p_txt = "n/a" if p is None else f"{p:.4f}"
            out.append(Check(f"{m.name}: still periodic without a learned gate", periodic(s, m.stride),
                             f"periodicity test at S={m.stride}: p = {p_txt}; detected period {det}"))
    for alias in baselines:
        s = stages[alias].summary
        gap, lo, hi = _gap(s)
        p = (s.get("periodicity") or {}).get("p_value")
        flat = flatness((lo, hi)) == FLAT if learnt.get(alias, True) else None  # flat at chance says nothing
        out.append(Check(f"{models[alias].name}: flat (gap's 95% upper bound below δ = {FLAT_MARGIN:g})", flat,
                         f"gap {gap:.1f} [{lo:.1f}, {hi:.1f}], detected period {s.get('detected_period')}"
                         + ("" if p is None else f", p = {p:.3f}")))
    return out


def repair_aliases(study: Study) -> set[str]:
    """The repair designs among the study's models (the demo plan's `repair_models`), at every seed."""
    names = {unseeded(n) for n in (study.manifest.get("plan") or {}).get("repair_models") or []}
    return {a for a, m in study.models.items() if unseeded(m.name) in names}


def _repair_check(name: str, s: dict, base: dict | None, base_name: str | None) -> Check:
    """A repair design has no weak phase: detected period 1 and a gap interval overlapping full attention's."""
    gap, lo, hi = _gap(s)
    claim = f"{name} (the repair): no weak phase, like full attention (period 1, gap intervals overlapping)"
    if base is None:
        return Check(claim, None, f"gap {gap:.1f} [{lo:.1f}, {hi:.1f}]; no full-attention baseline")
    bgap, blo, bhi = _gap(base)
    ok = s.get("detected_period") == 1 and lo <= bhi
    return Check(claim, ok, f"gap {gap:.1f} [{lo:.1f}, {hi:.1f}] vs {base_name}'s {bgap:.1f} [{blo:.1f}, {bhi:.1f}], "
                            f"detected period {s.get('detected_period')}")


def cycling_checks(study: Study) -> list[Check]:
    grid = r2_grid(study)
    if grid is None or grid.empty:
        return []
    out = []
    for alias, d in grid.groupby("alias", sort=False):
        name = study.models[alias].name if alias in study.models else alias
        vals = d.r2.dropna()  # no R² where the profile is flat: nothing to predict, so not checkable
        ok = None if len(vals) < len(d) else bool((vals >= CYCLING_R2[0]).all())  # a group is never empty
        out.append(Check(f"{name}: gate cycling moves the weak phases as predicted (R² ≥ {CYCLING_R2[0]:.2f}, the "
                         "published lower end, for every δ)", ok,
                         ", ".join(f"δ={int(r.delta):+d}: " + ("n/a" if pd.isna(r.r2) else f"{r.r2:.2f}")
                                   for r in d.itertuples())))
    return out


def theory_checks(study: Study) -> list[Check]:
    out = []
    for check, stage in study.theory.items():
        s = stage.summary
        out.append(Check(s.get("check", check), s.get("claim_reproduced"),
                         f"{len(s.get('settings', []))} settings; see the theory section"))
    return out


def all_checks(study: Study) -> dict[str, list[Check]]:
    return {
        **{f"{name}, {p} padding": lookup_checks(study, p, name) for name, variants in retrieval_evals(study).items()
           for p, stages in variants.items() if stages},
        "gate cycling": cycling_checks(study),
        "theory": theory_checks(study),
    }
