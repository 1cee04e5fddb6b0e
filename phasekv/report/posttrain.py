"""C11, post-training: "post-training raises the mean and narrows the gap, and the period stays the stride".

Post-training in miniature, fixed before it was measured at the seeds of docs/results/posttrain.md: a trained model
continued on a distribution other than its pretraining's (its recall with half the records adjacent where it saw
them spaced out) for a quarter of its own steps at a third of its peak rate (`phasekv.mitigate.posttrain.MINIATURE`,
`MINIATURE_LR`: the repair's recipe, at a post-training rate), never on the evaluation's prompts. A study directory holds each post-trained model in `posttrain/<base alias>/` (`Layout.posttrain`): its run
and its lookup under both paddings, read beside the base's own lookup.

The verdict reads each pair (one seed of one design) under prefix padding, the published table's: the mean is
raised and the gap narrowed with the 95% intervals apart, and the post-trained model is still periodic with its
stride (`checks.periodic`). A pair whose base or post-trained model did not learn the lookup, or whose base shows
no period to keep, is reported and not read. C11 holds at k of the n pairs read; reproduced only when k = n.
"""

from __future__ import annotations

from phasekv.config import ModelConfig
from phasekv.eval.stats import clopper_pearson
from phasekv.mitigate.posttrain import MINIATURE, MINIATURE_LR
from phasekv.report import published as pub
from phasekv.report.checks import learned, periodic
from phasekv.report.layout import POSTTRAIN, SUMMARY, Layout
from phasekv.report.load import Study, read_json
from phasekv.report.verdict import NOT_REPRODUCED, PADDING, REPRODUCED, UNTESTABLE, Verdict, ci, text

UNTIL_FLAT = ("The same recipe at the full rate, until flat: `phasekv posttrain` (docs: Results, Post-training; the demo "
              "does not run it, for time).")


def pairs(study: Study) -> list[dict]:
    """Every post-trained model of the study beside its base: {"name", "seed", "stride", "steps", "base": {padding:
    summary}, "post": {padding: summary}} (a padding missing on either side is left out)."""
    lay, out = Layout(study.root), []
    for alias in lay.aliases(lay.root / POSTTRAIN):
        run = read_json(lay.posttrain(alias) / SUMMARY)  # the stage's own summary: the base's name, the steps
        cfg = ModelConfig.from_name(run["model"])
        base = {p: st[alias].summary for p, st in study.lookup.items() if alias in st}
        post = {p: read_json(lay.posttrain_lookup(alias, p) / SUMMARY) for p in base
                if (lay.posttrain_lookup(alias, p) / SUMMARY).is_file()}
        out.append({"name": cfg.name, "seed": cfg.seed, "stride": cfg.stride, "steps": run.get("steps"),
                    "base": base, "post": post})
    return out


def read_pair(p: dict) -> dict:
    """One pair side by side (means and gaps with intervals, periods) and what it shows, or why it is not read."""
    b, a = p["base"].get(PADDING), p["post"].get(PADDING)
    row = {"seed": p["seed"], "model": p["name"], "steps": p["steps"]}
    if b is None or a is None:
        return row | {"read": False, "why": f"no {PADDING} lookup of the {'base' if b is None else 'post-trained model'}"}
    for side, s in (("base", b), ("post", a)):
        row[side] = {"mean": ci(s, "mean"), "gap": ci(s, "gap"), "detected_period": s.get("detected_period"),
                     "p_value": (s.get("periodicity") or {}).get("p_value")}
    if not (learned(b) and learned(a)):
        return row | {"read": False, "why": f"did not learn the lookup (means {text(b, 'mean')} and {text(a, 'mean')})"}
    if not periodic(b, p["stride"]):
        return row | {"read": False, "why": f"the base shows no period {p['stride']} to keep (detected "
                                            f"{b.get('detected_period')})"}
    raised = b["mean_ci"][1] < a["mean_ci"][0]
    narrowed = a["gap_ci"][1] < b["gap_ci"][0]
    kept = periodic(a, p["stride"])
    return row | {"read": True, "raised": raised, "narrowed": narrowed, "kept": kept, "holds": raised and narrowed and kept}


def _line(r: dict) -> str:
    """'W8/S4 · 1 KV · seed 100: mean 58.3 [57.4, 59.2] → 67.1 [...], gap 88.4 [...] → 80.9 [...], period 4 → 4'."""
    if not r["read"]:
        return f"{r['model']}: not read ({r['why']})"
    b, a = r["base"], r["post"]

    def v(x):
        return f"{x['value']} [{x['ci'][0]}, {x['ci'][1]}]"
    misses = [w for w, ok in (("mean not raised", r["raised"]), ("gap not narrower", r["narrowed"]),
                              ("period not kept", r["kept"])) if not ok]
    return (f"{r['model']}: mean {v(b['mean'])} → {v(a['mean'])}, gap {v(b['gap'])} → {v(a['gap'])}, period "
            f"{b['detected_period']} → {a['detected_period']}" + (f" ({', '.join(misses)})" if misses else ""))


def c11(found: list[dict]) -> Verdict:
    """Post-training in miniature raises the mean, narrows the gap and keeps the period, at every pair read."""
    published = {f"needle gap, {b} → {a}": f"{pub.NEEDLE_GAP[b]} → {pub.NEEDLE_GAP[a]}" for b, a in pub.POSTTRAINED}
    published |= {f"needle gap, {m} (post-trained)": pub.NEEDLE_GAP[m] for m in pub.POSTTRAINED_ONLY}
    rows = [read_pair(p) for p in found]
    read = [r for r in rows if r["read"]]
    if not read:
        why = "; ".join(_line(r) for r in rows) or "no post-trained model (the plan post-trains W8/S4 · 1 KV)"
        return Verdict("C11", UNTESTABLE, f"needs a post-trained model beside its base that both learned the lookup: "
                                          f"{why}.", {"pairs": rows, "published": published})
    held = [r for r in read if r["holds"]]
    lo, hi = clopper_pearson(len(held), len(read))
    failing = [r["model"] for r in read if not r["holds"]]
    reason = (f"continued for {MINIATURE:g} of their steps at {MINIATURE_LR:.2g} of their peak rate, half the records "
              f"adjacent: holds at {len(held)} of "
              f"{len(read)} models and seeds (95% exact interval {100 * lo:.0f}-{100 * hi:.0f}%)"
              + (f", failing: {', '.join(failing)}" if failing else "") + "; " + "; ".join(_line(r) for r in rows)
              + f". {UNTIL_FLAT}")
    verdict = REPRODUCED if len(held) == len(read) else NOT_REPRODUCED
    return Verdict("C11", verdict, reason, {"pairs": rows, "holds": len(held), "read": len(read),
                                            "interval": [lo, hi], "failing_seeds": failing, "published": published})
