"""The report's section "The family": the grid family's designs (NSA, MoBA, Activation Beacon) beside full
attention and W8/S4 · 1 KV from the same run, from each model's family analysis (`phasekv.analysis.family`,
DIR/analysis/family/<alias>/). Every table is built once as text cells and written both into the page (the macro
`titled` of templates/macros.html) and as Markdown (DIR/report/family.md), so a results page quotes exactly what the report says."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from phasekv.analysis.family import BRANCH_WORDS, LEARNED
from phasekv.report.html import fmt, interval
from phasekv.report.layout import Layout
from phasekv.report.load import Stage, Study, read_json


@dataclass
class Table:
    title: str
    headers: list[str]
    rows: list[list[str]]
    note: str = ""
    aliases: list[str | None] = field(default_factory=list)


def _p(p) -> str:
    return "–" if p is None else f"{p:.4f}"


def grid_text(t: dict) -> str:
    """One grid's test in words: '"d = 4 (mod 24): weakest phase 3, p 0.0001, weak spot"'."""
    head = f"{t['grid']} = {t['period']} (mod {t['modulus']}): "
    if t["test"] == "gap":
        return head + f"gap {interval(t['gap'], t['gap_ci'])}, period {t['detected_period']} (no period test)"
    spot = "periodic weak spot" if t["weak_spot"] else "none"
    return head + f"weakest phase {t['weakest_phase']}, p {_p(t['p_value'])}: {spot}"


def label(study: Study, alias: str, summary: dict) -> str:
    """The model's name, and what it was continued from when its run changed design (`phasekv train --init-from`):
    'MoBA B16 top 3 · 1 KV (continued from Full attention · 1 KV, 600 steps)'."""
    config = Layout(study.root).run(alias) / "config.json"
    run = read_json(config) if config.is_file() else {}
    init = run.get("init")
    if not init:
        return summary["model"]
    return f"{summary['model']} (continued from {init['from_name']}, {run['train']['steps']} steps)"


def _ordered(study: Study) -> list[tuple[str, Stage]]:
    """The family analyses, the baselines (no design) first, each group in the study's model order."""
    stages = study.analyses.get("family", {})
    order = [a for a in study.models if a in stages] + [a for a in stages if a not in study.models]
    return sorted(((a, stages[a]) for a in order), key=lambda kv: kv[1].summary.get("design") is not None)


def lookup_table(study: Study) -> Table:
    rows, aliases = [], []
    for alias, st in _ordered(study):
        s = st.summary
        untested = [p for p in s["plans"] if p["test"] is None]
        for padding, lk in s["lookup"].items():
            tests = [grid_text(t) for t in lk["grids"]] + [f"{p['grid']} = {p['period']}: not determinable"
                                                          for p in untested]
            rows.append([label(study, alias, s), padding, interval(lk["mean"], lk["mean_ci"]), fmt(lk["worst"]), fmt(lk["best"]),
                         interval(lk["gap"], lk["gap_ci"]), fmt(lk["detected_period"]), "; ".join(tests)])
            aliases.append(alias)
    first = _ordered(study)[0][1].summary if rows else {}
    m = first.get("lookup", {}).get("prefix", {}).get("modulus")
    note = (f"Lookup accuracy in percent; mean, worst, best, gap and period over residues mod {m} (the study's "
            "modulus; 95% intervals: bootstrap over key-name mappings, the gap cross-fitted). Each grid period g is "
            "tested on residues mod M_g: the profile folded at g, its weakest phase, and the permutation p of its "
            f"power at period g (a periodic weak spot: p < {first.get('alpha', 0.01)} and the gap's interval above 0). "
            "A period whose multiples need more target positions than the prompts have is tested for a gap alone "
            "(M_g = g) or is not determinable at this prompt length. The baselines are tested at every grid of the "
            "family, where a weak spot is not expected.")
    return Table("Lookup by design and padding", ["model", "padding", "mean [95%]", "worst", "best", "gap [95%]",
                                                  "period", "at each grid"], rows, note, aliases)


def _condition_word(name: str) -> str:
    return BRANCH_WORDS.get(name, "as trained" if name == LEARNED else name)


def knockout_tables(study: Study) -> list[Table]:
    """Per design with knockouts: each condition's mean, gap and its grid tests (accuracy by phase)."""
    out = []
    for alias, st in _ordered(study):
        ko = st.summary.get("knockouts")
        if not ko:
            continue
        for run in ko["runs"]:
            rows = []
            for c in run["conditions"]:
                phases = ["; ".join(f"{g['grid']}: " + " / ".join(f"{x:.0f}" for x in g["phase_profile"])
                                    + f" (weakest {g['weakest_phase']}, p {_p(g['p_value'])})" for g in c["grids"])]
                rows.append([_condition_word(c["condition"]), interval(c["mean"], c["mean_ci"]), fmt(c["worst"]),
                             fmt(c["best"]), interval(c["gap"], c["gap_ci"]), fmt(c["detected_period"]), *phases])
            what = {"branch_gates": "branch knockouts (gates fixed at evaluation: open branches 1, others 0)",
                    "oracle_blocks": "the oracle block (the target's block forced into every later query's "
                                     "selection)",
                    "beacon_knockout": "beacon knockouts (one beacon of every completed window removed)"}[ko["hook"]]
            note = (f"{ko['padding']} padding, {run['per_group']} prompts per residue group mod {run['modulus']}, the "
                    "same prompts in every row (paired); accuracy by phase at each grid in percent.")
            out.append(Table(f"{label(study, alias, st.summary)}: {what}",
                             ["condition", "mean [95%]", "worst", "best", "gap [95%]", "period", "accuracy by phase"],
                             rows, note, [alias] * len(rows)))
    return out


def _first_with(study: Study, file: str) -> tuple[str, str, pd.DataFrame] | None:
    """(alias, label, table) of the first family analysis (in `_ordered`'s order) that wrote `file`, else None."""
    for alias, st in _ordered(study):
        if (st.path / file).is_file():
            return alias, label(study, alias, st.summary), pd.read_parquet(st.path / file)
    return None


def beacon_table(study: Study) -> Table | None:
    if (found := _first_with(study, "beacons.parquet")) is None:
        return None
    alias, name, t = found
    groups = list(dict.fromkeys(t["group"]))
    wide = t.pivot(index="condition", columns="group", values="acc").reindex(columns=groups)
    change = t.pivot(index="condition", columns="group", values="change").reindex(columns=groups)
    rows = [[_condition_word(c), *(f"{fmt(wide.at[c, g])} ({change.at[c, g]:+.1f})" for g in groups)]
            for c in dict.fromkeys(t["condition"])]
    n = t[t["condition"] == LEARNED].set_index("group")["n"]
    return Table(f"{name}: accuracy by the beacon that holds the target",
                 ["condition", *(f"target in {'the raw window' if g == 'raw' else f'beacon {g}'} (n {n[g]})"
                                 for g in groups)], rows,
                 "Accuracy in percent (change from the model as trained, points) by where the target key sits: "
                 "beacon i of a completed window (raw offsets i·r .. i·r + r − 1), or the query's own window, "
                 "whose raw tokens stay. Groups follow the lookup's position design (not moment-matched by "
                 "group); the comparison with the model as trained is paired.", [alias] * len(rows))


def gate_table(study: Study) -> Table | None:
    if (found := _first_with(study, "gates.parquet")) is None:
        return None
    alias, name, g = found
    rows = [[r.grid, str(r.phase), str(r.layer), fmt(r.cmp, 3), fmt(r.sel, 3), fmt(r.win, 3)] for r in g.itertuples()]
    return Table(f"{name}: branch gates at the query by the target's phase",
                 ["grid", "phase", "layer", "compressed", "selected", "window"], rows,
                 "Mean sigmoid gate of each branch at the query token (over heads and prompts, the model as "
                 "trained), by the target key's phase at each grid.", [alias] * len(rows))


def beacon_attention_table(study: Study) -> Table | None:
    if (found := _first_with(study, "beacon_attention.parquet")) is None:
        return None
    alias, name, a = found
    cols = [c for c in a.columns if c.startswith("beacon ")] + ["own window"]
    rows = [[str(r["layer"]), "the raw window" if r["target"] == "raw" else f"beacon {r['target']}", str(r["n"]),
             *(fmt(r[c], 3) for c in cols)] for r in a.to_dict("records")]
    return Table(f"{name}: the query's attention on its beacons by offset",
                 ["layer", "target key in", "n", *cols], rows,
                 "Attention of the query token (mean over heads and prompts, the model as trained) on each "
                 "beacon index of the completed windows (summed over windows) and on its own window's raw "
                 "tokens and beacons, by where the target key sits.", [alias] * len(rows))


def tables(study: Study) -> list[Table]:
    if not study.analyses.get("family"):
        return []
    return [t for t in (lookup_table(study), *knockout_tables(study), beacon_table(study), beacon_attention_table(study),
                        gate_table(study)) if t is not None]


def sentences(study: Study) -> list[str]:
    """One plain sentence per design: periodic weak spots or not, at which period, under each padding (and for
    NSA whether its exact branches mask the compressed branch)."""
    return [design_sentence(label(study, alias, st.summary), st.summary) for alias, st in _ordered(study)
            if st.summary.get("design")]


def design_sentence(name: str, s: dict) -> str:
    """'NAME: periodic weak spots at d = 4 and l' = 8 under both paddings (prefix: ...; in-sequence: ...).'"""
    found = {padding: _padding_finding(lk, 2 * s["chance"]) for padding, lk in s["lookup"].items()}
    weak = {padding: f[1] for padding, f in found.items() if f[1]}
    at = [g for g in (f"{p['grid']} = {p['period']}" for p in s["plans"]) if any(g in w for w in weak.values())]
    chance = [padding for padding, f in found.items() if f[1] is None]
    if len(chance) == len(found):
        head = "it does not retrieve (lookup mean not above twice chance), so whether it has periodic weak spots " \
               "is not determinable"
    elif weak:
        where = "both paddings" if len(weak) == len(found) == 2 else " and ".join(weak) + " padding"
        head = f"periodic weak spots at {' and '.join(at)} under {where}"
    elif any(p["test"] == "period" for p in s["plans"]):
        head = "no periodic weak spot at any tested grid"
    else:
        head = "no period test is possible at its grid with these prompts, only a gap test"
    untested = [f"{p['grid']} = {p['period']}" for p in s["plans"] if p["test"] is None]
    tail = f"; {', '.join(untested)} not determinable at this prompt length" if untested else ""
    details = "; ".join(f"{padding}: {f[0]}" for padding, f in found.items())
    return f"{name}: {head} ({details}{tail})." + _masking(s)


def _padding_finding(lk: dict, floor: float) -> tuple[str, list[str] | None]:
    """One padding's lookup in words and the grids with a periodic weak spot (None: at chance)."""
    mean = f"mean {interval(lk['mean'], lk['mean_ci'])}"
    if lk["mean_ci"][0] <= floor:
        return mean + ", not above twice chance", None
    words, weak = [mean], []
    for t in lk["grids"]:
        where = f"{t['grid']} = {t['period']}"
        if t["test"] == "gap":
            depends = "depends" if t["gap_ci"][0] > 0 else "does not measurably depend"
            words.append(f"accuracy {depends} on t mod {t['period']} (gap {interval(t['gap'], t['gap_ci'])})")
            continue
        words.append(f"{where}: gap {interval(t['gap'], t['gap_ci'])}, p {_p(t['p_value'])}"
                     + (f", weakest phase {t['weakest_phase']}" if t["weak_spot"] else ", none"))
        weak += [where] if t["weak_spot"] else []
    return ", ".join(words), weak


def _masking(s: dict) -> str:
    """NSA: whether the exact branches mask the compressed branch's weak phases (its branch knockouts)."""
    mask = (s.get("knockouts") or {}).get("masking")
    if mask is None:
        return ""
    if mask["masks"] is None:
        return " Whether its exact branches mask the compressed branch cannot be said here."
    alone = ", ".join(mask["compressed_weak_at"]) or "no grid"
    whole = ", ".join(mask["learned_weak_at"]) or "no grid"
    verdict = "mask it" if mask["masks"] else "mask nothing"
    return f" Compressed branch alone periodic at {alone}, the model as trained at {whole}: its exact branches {verdict}."


def to_markdown(t: Table) -> str:
    def cell(x: str) -> str:
        return x.replace("|", "\\|")

    lines = [f"### {t.title}", "", "| " + " | ".join(map(cell, t.headers)) + " |", "|" + "---|" * len(t.headers)]
    lines += ["| " + " | ".join(map(cell, r)) + " |" for r in t.rows]
    return "\n".join(lines + (["", t.note] if t.note else []))


def family_markdown(study: Study) -> str:
    """The section as Markdown: the plain sentences, then every table."""
    says = "\n".join(f"- {s}" for s in sentences(study))
    return "## The family\n\n" + (says + "\n\n" if says else "") + "\n\n".join(to_markdown(t) for t in tables(study)) + "\n"
