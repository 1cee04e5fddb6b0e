"""`phasekv audit`: a one-command phase audit of any checkpoint, fit to gate a model release in CI.

It runs the position-matched lookup test (models with a phasekv config) or the needle test (any causal LM)
at a length that fits the hardware, then the periodicity tests, and gives a verdict: the gap with its
interval, whether the residue profile is periodic with the stride (or another period), the weakest
residues and phases, and a figure. Every compression ratio of the model is tested (a DeepSeek-V4 config's
CSA and HCA ratios, `phasekv.eval.ratios`), each named with its layer types.

Exit codes (audit.json's "verdict"): 0 pass (the model retrieves, its mean accuracy's 95% interval above
twice chance and above chance + delta, and every profile is flat by equivalence: its gap's 95% upper bound below --margin, delta,
`phasekv.eval.stats.flatness`), 3 fail (it retrieves and a gap is not shown below the margin: above it, or an
interval too wide to tell, which more prompts can resolve), 4 inconclusive (it does not retrieve well enough for
the gap to mean anything). The periodicity test is reported, never a veto below the margin. A ratio whose position design
cannot fit the prompts' target positions (`phasekv.eval.ratios.plan_period`: a grid period of 32 in the 90-token
lookup) is not tested: audit.json's "untested" and the printed verdict say so and why, and the verdict rests on
the ratios that were tested.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from phasekv.errors import ConfigError
from phasekv.eval.figure import GREY, Figure, Guide, Panel, Trace, to_png
from phasekv.eval.harness import Scored, summarize_scored
from phasekv.eval.models import EvalModel, model_ratios
from phasekv.eval.protocols import for_model, protocol, retrieval_protocols
from phasekv.eval.ratios import RatioPlan, plan_ratios, ratio_tests
from phasekv.eval.report import chance, length_warning
from phasekv.eval.run import json_default, run_retrieval
from phasekv.eval.stats import FLAT, FLAT_MARGIN, NOT_FLAT, flat_rule, flatness, phase_profile, retrieves
from phasekv.io import write_json

ALPHA = 0.01  # level of the period-S test in the verdict
PASS, FAIL, INCONCLUSIVE = 0, 3, 4  # exit codes
VERDICTS = {PASS: "pass", FAIL: "fail", INCONCLUSIVE: "inconclusive"}  # audit.json's "verdict"


def verdict(summary: dict, stride: int | None, margin: float) -> dict:
    """Flat or not by equivalence (the gap's upper bound against the margin), the period verdict, the weakest
    residues and phases of an evaluation summary."""
    groups = summary["groups"]
    acc = np.array([g["acc"] for g in groups])
    M = len(groups)
    weakest = [groups[i] for i in np.argsort(acc, kind="stable")[:3]]
    d = int(summary["detected_period"])
    p = summary.get("periodicity", {}).get("p_value")
    flat = flatness(summary["gap_ci"], margin)
    out = {"gap": summary["gap"], "gap_ci": summary["gap_ci"], "margin": margin, "flat": flat, "pass": flat == FLAT,
           "mean": summary["mean"], "mean_ci": summary["mean_ci"], "worst": summary["worst"], "best": summary["best"],
           "stride": stride, "modulus": M, "detected_period": d, "period_p_value": p,
           "fold_consistency": summary.get("fold_consistency"),
           "weakest_residues": [{k: g[k] for k in ("residue", "acc", "lo", "hi")} for g in weakest]}
    if stride and M % stride == 0:
        phase = phase_profile(acc, stride)  # (S,)
        order = np.argsort(phase, kind="stable")
        out["phase_profile"] = phase.tolist()
        out["weakest_phases"] = [{"phase": int(i), "acc": float(phase[i])} for i in order[:3]]
    if d == 1:
        out["periodic"], out["period_text"] = "none", "no residue dependence detected (period 1)"
    elif stride and d == stride:
        out["periodic"], out["period_text"] = "stride", f"periodic with the stride S={stride}"
    elif stride and stride % d == 0:
        out["periodic"], out["period_text"] = "divisor", f"periodic with period {d}, a divisor of the stride S={stride}"
    else:
        out["periodic"] = "other"
        out["period_text"] = f"periodic with period {d}" + (f", not the stride S={stride}" if stride else "")
    if p is not None:
        sig = "significant" if p < ALPHA else "not significant"
        out["period_text"] += f"; power at period {stride}: p = {p:.4f} ({sig} at {ALPHA})"
    return out


def run_audit(em: EvalModel, out: Path, stride: int | None = None, margin: float = FLAT_MARGIN, task: str = "auto",
              per_group: int | None = None, modulus: int | None = None, context: int | None = None,
              records: int | None = None, demos: int | None = None, filler: int | None = None, seed: int = 0,
              batch_size: int = 32, interval: str | None = None, progress: bool = True,
              padding: str | None = None) -> dict:
    """Evaluate (once per modulus the model's ratios need), test periodicity, write OUT/audit.json and
    OUT/audit.png; returns the verdict (with `verdict` and `exit_code`). task: a retrieval protocol
    (`phasekv.eval.protocols`), or auto: the one for the model's kind. `stride` replaces the model's ratios;
    `padding` the protocol's own padding."""
    if margin <= 0:
        raise ConfigError(f"--margin {margin:g} must be > 0 (points)")
    names = [p.name for p in retrieval_protocols()]
    if task != "auto" and task not in names:
        raise ConfigError(f"--task must be auto, {', '.join(names[:-1])} or {names[-1]}, got {task!r}")
    proto = for_model(em) if task == "auto" else protocol(task)
    cfg = proto.fit(em, per_group=per_group, modulus=modulus, context=context, records=records, demos=demos,
                    filler=filler, seed=seed, padding=padding)
    if stride is not None and (stride < 1 or (modulus is not None and cfg.modulus % stride)):
        raise ConfigError(f"--stride {stride} must divide the modulus {cfg.modulus} (pass --modulus)")
    ratios = {stride: ["--stride"]} if stride else model_ratios(em)  # a ratio M misses gets its own modulus
    out, runs = Path(out), []
    plans = plan_ratios(ratios, cfg)
    for i, plan in enumerate(p for p in plans if p.modulus is not None):
        sub = out / (proto.name if i == 0 else f"{proto.name}-mod{plan.modulus}")
        s = min([r for r in plan.ratios if r < plan.modulus], default=None)  # the evaluation's own period test
        runs.append((plan, run_retrieval(proto.name, em, plan.config(cfg), sub, batch_size=batch_size,
                                         interval=interval or proto.interval, stride=s, progress=progress), sub))
    return _write_audit(runs, margin, [p for p in plans if p.modulus is None], em.name, proto.name, out)


def audit_scored(s: Scored, out: Path, margin: float = FLAT_MARGIN, stride: int | None = None) -> dict:
    """The audit of a task lm-eval scored (`phasekv.eval.harness.read_samples`): its evaluation in OUT/PROTOCOL/
    as `phasekv eval` writes it, then the verdict, OUT/audit.json and OUT/audit.png as `run_audit` writes them.
    The task's residues are fixed at export: the ratios that divide its modulus are tested, the others are
    listed as untested (export the tasks with a --modulus they divide). `stride` replaces the model's ratios."""
    if margin <= 0:
        raise ConfigError(f"--margin {margin:g} must be > 0 (points)")
    cfg, out = s.config, Path(out)
    M = cfg.modulus
    ratios = {stride: ["--stride"]} if stride else model_ratios(s.model)
    tested = {r: t for r, t in ratios.items() if M % r == 0}
    period = min([r for r in tested if r < M], default=None)  # the evaluation's own period test
    plan = RatioPlan(period, M, None, cfg.keep_n, "period" if period else "gap" if tested else None,
                     f"residues mod {M}, the exported task's own", ratios=tested)
    untested = [RatioPlan(r, None, None, False, None, f"the exported task's residues mod {M} cannot test "
                          f"period {r}: export the tasks with --modulus a multiple of {r}", ratios={r: t})
                for r, t in ratios.items() if M % r]
    proto = s.meta["task"]
    summary = summarize_scored(s, out / proto, period)
    return _write_audit([(plan, summary, out / proto)], margin, untested, s.model.name, proto, out)


def _write_audit(runs: list[tuple[RatioPlan, dict, Path]], margin: float, untested: list[RatioPlan], model: str,
                 task: str, out: Path) -> dict:
    """The verdict of an audit's evaluations (`audit_verdict`), written to OUT/audit.json and OUT/audit.png."""
    v = audit_verdict(runs, margin, untested)
    v.update(model=model, task=task, evaluation=str(runs[0][2]))
    to_png(audit_figure(runs[0][1], v), out / "audit.png")
    write_json(out / "audit.json", v, default=json_default)
    return v


def audit_verdict(runs: list[tuple[RatioPlan, dict, Path]], margin: float, untested: list[RatioPlan] = ()) -> dict:
    """The verdict of an audit's evaluations (plan, summary, directory), the first one the headline: its
    gap, period and weakest residues (`verdict`), every ratio's test, the ratios the prompts cannot test
    (`untested`, with why; the verdict rests on the others), whether the model retrieves (`stats.retrieves`: the
    mean's 95% interval above twice chance and above chance + the margin), and the verdict word and exit code."""
    (plan, summary, _), gaps = runs[0], [s["gap"] for _, s, _ in runs]
    v = verdict(summary, min(plan.ratios, default=None), margin)
    v["chance"] = chance(summary)  # guessing among the value words
    v["retrieves"] = retrieves(v["mean_ci"], v["chance"], margin)
    v["near_chance"] = not v["retrieves"]
    v["ratios"] = [{**t, "evaluation": str(d), "gap": s["gap"], "gap_ci": s["gap_ci"], "per_group": p.per_group,
                    "n_rule": p.note, "design_notice": s.get("design_notice")}
                   for p, s, d in runs for t in ratio_tests(s, p.ratios)]
    v["untested"] = [{"ratio": r, "layer_types": types, "note": p.note}
                     for p in untested for r, types in p.ratios.items()]
    flat = all(flatness(s["gap_ci"], margin) == FLAT for _, s, _ in runs)
    code = INCONCLUSIVE if not v["retrieves"] else PASS if flat else FAIL
    v.update({"pass": code == PASS, "largest_gap": max(gaps), "rule": flat_rule(margin), "protocol": summary["protocol"],
              "prompt_length": summary["prompt_length"], "n_prompts": sum(s["n_prompts"] for _, s, _ in runs),
              "beyond_training_length": summary.get("beyond_training_length"),  # the verdict's rules stay as they are
              "verdict": VERDICTS[code], "exit_code": code})
    return v


def audit_figure(summary: dict, v: dict) -> Figure:
    """Left: accuracy by residue with its band, the weakest residues circled. Right: the profile folded mod S."""
    g = summary["groups"]
    r, acc = [x["residue"] for x in g], [x["acc"] for x in g]
    S, M = v["stride"], len(g)
    word = v["verdict"].upper()
    weak = v["weakest_residues"]
    left = Panel([Trace("band", r, [x["lo"] for x in g], [x["hi"] for x in g], alpha=0.25),
                  Trace("line", r, acc, marker="circle", size=3),
                  Trace("points", [w["residue"] for w in weak], [w["acc"] for w in weak], color="#d62728",
                        marker="circle-open", size=7)],
                 title=f"{v['model']} · {v['task']} · gap {v['gap']:.1f} [{v['gap_ci'][0]:.1f}, {v['gap_ci'][1]:.1f}] "
                       f"vs δ {v['margin']:g}: {word}",
                 xlabel=f"target position mod {M}", ylabel="accuracy (%)", ylim=(-3, 103), width=1.6,
                 guides=[Guide(x=b - 0.5) for b in range(S, M, S)] if S and S < M else [])
    panels = [left]
    if S and M % S == 0 and S < M:
        folds = [Trace("line", list(range(S)), acc[k * S: (k + 1) * S], color=GREY, width=0.7, alpha=0.7)
                 for k in range(M // S)]
        mean = Trace("line", list(range(S)), v["phase_profile"], name="mean over periods", width=2, marker="circle")
        panels.append(Panel([*folds, mean], title=f"folded mod {S}: detected period {v['detected_period']}",
                            xlabel=f"phase (position mod S={S})", ylim=(-3, 103), legend=True))
    return Figure(panels, size=(10, 3.2))


def print_verdict(v: dict, console) -> None:
    color = {"pass": "green", "fail": "red", "inconclusive": "yellow"}[v["verdict"]]
    console.print(f"[bold]{v['model']}[/] · {v['task']} ({v['protocol']} padding, {v['n_prompts']:,} prompts of "
                  f"{v['prompt_length']:,} tokens)")
    console.print(f"mean {v['mean']:.1f} [{v['mean_ci'][0]:.1f}, {v['mean_ci'][1]:.1f}] · worst {v['worst']:.1f} · "
                  f"best {v['best']:.1f}")
    why = {FLAT: "flat", NOT_FLAT: "above the margin"}.get(v["flat"], "not shown below the margin (the interval is "
                                                                       "too wide: more prompts, --per-group, can tell)")
    console.print(f"gap {v['gap']:.1f} points, 95% [{v['gap_ci'][0]:.1f}, {v['gap_ci'][1]:.1f}]: {why}; "
                  f"[bold {color}]{v['verdict'].upper()}[/] (exit {v['exit_code']})")
    console.print(f"rule: {v['rule']}")
    console.print(f"period: {v['period_text']}")
    if v.get("beyond_training_length"):
        console.print(f"[yellow]warning:[/] {length_warning(v['beyond_training_length'])}")
    for t in v["ratios"]:
        p = "" if t["period_p_value"] is None else f", power at period {t['ratio']}: p = {t['period_p_value']:.4f}"
        console.print(f"ratio {t['ratio']} ({', '.join(t['layer_types'])}): residues mod {t['modulus']}, gap "
                      f"{t['gap']:.1f}; folded mod {t['ratio']}: weakest phase {t['weakest_phase']}, phase gap "
                      f"{t['phase_gap']:.1f}{p}")
    for t in v.get("untested", []):
        console.print(f"[yellow]ratio {t['ratio']} ({', '.join(t['layer_types'])}): not tested:[/] {t['note']} "
                      "(more target positions: raise --records or --filler)")
    if v["near_chance"]:
        chance = "unknown" if v["chance"] is None else f"{v['chance']:.1f}% (one of the value words at random)"
        console.print(f"[yellow]inconclusive:[/] mean accuracy is too near chance ({chance}; its interval must lie "
                      f"above twice chance and above chance + δ = {v['margin']:g} points): the model does not retrieve "
                      "well enough for the gap to say anything about phase robustness")
    weak = ", ".join(f"{w['residue']} ({w['acc']:.1f} [{w['lo']:.1f}, {w['hi']:.1f}])" for w in v["weakest_residues"])
    console.print(f"weakest residues mod {v['modulus']}: {weak}")
    if "weakest_phases" in v:
        console.print("weakest phases mod {}: {}".format(
            v["stride"], ", ".join(f"{w['phase']} ({w['acc']:.1f})" for w in v["weakest_phases"])))
