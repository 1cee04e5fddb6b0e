"""`phasekv repair DIR`: which compressed design has no weak phase at nearly the cost of compression.

Reads the lookup evaluations of a directory laid out as a study (`DIR/eval/lookup-<padding>/<alias>/`), compares
the models under both paddings (`phasekv compare`: costs measured once, side by side), and checks every model
against the repair's goals, with the measured numbers and by how much each goal is missed:

    cache    cache bytes at the context <= 1/4 of the reference's: the smallest full-attention model of the
             backbone that meets the accuracy goals (the demo's Full attention · 1 KV), the model a user would
             otherwise deploy; the ratio to full attention with the same KV heads is reported beside it
    flat     under both paddings, flat by equivalence (`phasekv.eval.stats.flatness`): the gap's 95% upper bound
             below the margin delta (3.5 points: above every upper bound full attention showed); the periodicity
             test and the detected period are reported, never a veto below the margin
    mean     mean accuracy >= the reference's - 5 points, under both paddings
    train    training step <= 1.5x the unrepaired model's (measured side by side, in one process)
    decode   decode step <= 1.5x the unrepaired model's
    seeds    a design (the name without its seed) is judged by its seeds: it is "repaired" only when it was trained
             at >= 8 seeds and EVERY seed meets every goal; the fraction of its seeds meeting every goal is reported
             with an exact 95% (Clopper-Pearson) interval, and its worst seed (largest gap) is named

Outputs: DIR/repair/{prefix,in-sequence}/ (two `phasekv compare` outputs), DIR/repair/goals.json (schema
`phasekv.repair/2`, read by the report) and DIR/repair/frontier.png (gap against step cost, both paddings).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from phasekv.config import ModelConfig
from phasekv.errors import ConfigError, DataError
from phasekv.eval.figure import DPI
from phasekv.eval.run import json_default
from phasekv.eval.stats import FLAT, FLAT_MARGIN, NOT_FLAT, clopper_pearson, flat_rule, flatness
from phasekv.io import write_figure, write_json
from phasekv.mitigate.compare import compare
from phasekv.mitigate.cost import Bench
from phasekv.model.cli import cache_bytes

SCHEMA = "phasekv.repair/2"
RECORD_SCHEMA = "phasekv.repair-seeds/1"  # `phasekv repair --record`: designs' seed distributions, kept for the demo
PADDINGS = ("prefix", "in-sequence")


@dataclass(frozen=True)
class Goals:
    """The repair's acceptance thresholds."""

    max_cache: float = 0.25  # cache bytes / the reference full-attention model's (the model the repair replaces)
    max_cost: float = 1.5  # training and decode step / the unrepaired model's
    max_mean_drop: float = 5.0  # points below the full-attention reference's mean
    margin: float = FLAT_MARGIN  # delta (points): flat when the gap's 95% upper bound is below it (`flatness`)
    seeds: int = 8  # seeds a design must be trained at; it is repaired only when every one of them meets every goal


RECIPE = ("steps", "batch_size", "seq_len", "lr", "warmup")  # training settings that make a recipe, with the data


def design_name(label: str) -> str:
    """A design is a model's label without its seed (`· seed 43`): its seeds are replicates of one design. The
    label keeps what else tells designs apart: a phase ensemble's k, a training recipe (`recipe_tag`)."""
    return re.sub(r" · seed \d+", "", label)


def recipe(run_dir: Path) -> dict:
    """The training recipe of a run directory (config.json): steps, batch, lr, ... and every data setting."""
    try:
        train = json.loads((Path(run_dir) / "config.json").read_text()).get("train", {})
    except (OSError, json.JSONDecodeError):
        return {}
    return train_recipe(train)


def train_recipe(train: dict) -> dict:
    """The recipe of a training config (`TrainConfig.to_dict()`, a run's config.json "train")."""
    data = train.get("data") or {}
    return ({k: train.get(k) for k in RECIPE} | {"data": data.get("data")}
            | {f"recall {k}": v for k, v in (data.get("recall") or {}).items()})


def recipe_tag(mine: dict, base: dict) -> str:
    """' (trained with recall gap_prob 0.5)': where a run's recipe differs from the unrepaired model's."""
    diff = [f"{k} {v}" for k, v in mine.items() if base and k in base and base[k] != v]
    return f" (trained with {', '.join(diff)})" if diff else ""


def cache_same_kv(cfg: ModelConfig, context: int) -> float:
    """Cache bytes at `context` relative to full attention with the same backbone and KV heads."""
    return cache_bytes(cfg, context) / cache_bytes(cfg.full_attention(), context)


def cache_vs(cfg: ModelConfig, reference: ModelConfig, context: int) -> float:
    """Cache bytes at `context` relative to the reference model's (the full-attention model the design replaces)."""
    return cache_bytes(cfg, context) / cache_bytes(reference, context)


def _check(goal: str, value, limit, ok: bool, miss: str) -> dict:
    return {"goal": goal, "value": value, "limit": limit, "ok": bool(ok), "miss": "" if ok else miss}


def flat_miss(padding: str, n: dict, margin: float) -> str:
    """Why a padding's profile is not flat: its gap shown above the margin, or an interval too wide to tell."""
    lo, hi = n["gap_ci"]
    gap = f"{padding} gap {n['gap']:.1f} [{lo:.1f}, {hi:.1f}]"
    if flatness(n["gap_ci"], margin) == NOT_FLAT:
        return f"{gap} above δ = {margin:g}"
    return f"{gap} not shown below δ = {margin:g} (the interval reaches {hi:.1f}: more prompts can tell)"


def check_model(numbers: dict[str, dict], ref: dict[str, dict], train: float | None, decode: float | None,
                cfg: ModelConfig, ref_cfg: ModelConfig, context: int, goals: Goals) -> list[dict]:
    """Every goal of one model: numbers and ref (padding -> its and the reference's lookup numbers: mean, gap,
    gap_ci), its training and decode step relative to the unrepaired model's, its and the reference's config."""
    out = []
    cache = cache_vs(cfg, ref_cfg, context)
    out.append(_check("cache", cache, goals.max_cache, cache <= goals.max_cache,
                      f"cache {cache:.4f} of {ref_cfg.name}'s > {goals.max_cache:g} "
                      f"(by {100 * (cache / goals.max_cache - 1):.2f}%)"))
    for kind, rel in (("train", train), ("decode", decode)):
        out.append(_check(kind, rel, goals.max_cost, rel is not None and rel <= goals.max_cost,
                          "not measured" if rel is None else f"{kind} {rel:.2f}x > {goals.max_cost:g}x"))
    for padding in PADDINGS:
        r, f = numbers.get(padding), ref.get(padding)
        if r is None or f is None:
            out.append(_check(f"{padding}: evaluated", None, None, False, f"{padding}: not evaluated"))
            continue
        out.append(_check(f"{padding}: flat", r["gap_ci"][1], goals.margin,
                          flatness(r["gap_ci"], goals.margin) == FLAT, flat_miss(padding, r, goals.margin)))
        drop = f["mean"] - r["mean"]
        out.append(_check(f"{padding}: mean", r["mean"], f["mean"] - goals.max_mean_drop, drop <= goals.max_mean_drop,
                          f"{padding} mean {r['mean']:.1f}, {drop:.1f} below full"))
    return out


def evaluate(summaries: dict[str, dict], unrepaired: str, context: int = 32768, goals: Goals = Goals(),
             runs: Path | None = None) -> dict:
    """The goals table from the compare summaries of both paddings (padding -> phasekv.compare/1 summary; the
    costs are read from the prefix one). `runs`: the training run directories by alias (an evaluation's
    directory name), whose recipes tell apart one model name trained two ways."""
    rows = {p: {r["label"]: r for r in s["models"]} for p, s in summaries.items()}
    pre = rows["prefix"]
    ref_label = summaries["prefix"]["reference"]
    if ref_label is None:
        raise DataError("repair: no full-attention model among the evaluations (the goals are relative to it)")
    if unrepaired not in pre:
        raise ConfigError(f"repair: --unrepaired {unrepaired!r} is not among the evaluated models: {', '.join(pre)}")
    ref = {p: _padding_numbers(rows[p][ref_label]) for p in PADDINGS if ref_label in rows[p]}
    ref_name = pre[ref_label]["model"]
    recipes = {label: recipe(runs / Path(row["eval_dir"]).name) if runs else {} for label, row in pre.items()}
    unrep = pre[unrepaired]
    models, designs = [], {}
    for label, row in pre.items():
        cfg = ModelConfig.from_name(row["model"])
        if not cfg.compressed:
            continue
        k = row.get("ensemble_k") or 1
        name = cfg.name + (f" · phase ensemble {k}" if k > 1 else "") + recipe_tag(recipes[label], recipes[unrepaired])
        rel = {kind: None if row.get(f"{kind}_cost_rel") is None or unrep.get(f"{kind}_cost_rel") is None
               else row[f"{kind}_cost_rel"] / unrep[f"{kind}_cost_rel"] for kind in ("train", "decode")}
        m = judge({"label": name, "design": design_name(name), "seed": cfg.seed,
                   "role": "unrepaired" if label == unrepaired else "design", "arch": design_name(cfg.name),
                   "recipe": recipes[label], "train_rel": rel["train"], "decode_rel": rel["decode"],
                   "paddings": {p: _padding_numbers(rows[p][label]) for p in PADDINGS if label in rows[p]}},
                  ref, ref_name, context, goals)
        models.append(m)
        designs.setdefault(m["design"], []).append(m)
    per_design = [seed_distribution(d, ms, goals) for d, ms in designs.items()]
    repaired = [d["design"] for d in per_design if d["meets"]]
    ref_flat = {p: flatness(n["gap_ci"], goals.margin) for p, n in ref.items()}
    warning = "".join(f"; warning: the reference {ref_label} is not flat by the rule under {p} padding (gap "
                      f"{ref[p]['gap']:.1f} [{ref[p]['gap_ci'][0]:.1f}, {ref[p]['gap_ci'][1]:.1f}])"
                      for p, f in ref_flat.items() if f != FLAT)
    return {"schema": SCHEMA, "goals": asdict(goals), "rule": flat_rule(goals.margin), "context": context,
            "reference": ref_label, "reference_model": ref_name, "unrepaired": unrepaired, "reference_numbers": ref,
            "reference_flat": ref_flat, "models": models, "designs": per_design, "repaired": repaired,
            "verdict": verdict_text(repaired, per_design, goals) + warning}


def judge(m: dict, ref: dict[str, dict], ref_name: str, context: int, goals: Goals) -> dict:
    """One model (its "arch", "paddings" numbers, "train_rel" and "decode_rel") checked against every goal: adds
    its cache against the reference model ("cache_ref", the goal's) and against full attention with the same KV
    heads ("cache_rel"), the checks, the misses and whether it meets every goal."""
    cfg = ModelConfig.from_name(m["arch"])
    checks = check_model(m["paddings"], ref, m["train_rel"], m["decode_rel"], cfg, ModelConfig.from_name(ref_name),
                         context, goals)
    misses = [c["miss"] for c in checks if not c["ok"]]
    return m | {"cache_ref": checks[0]["value"], "cache_rel": cache_same_kv(cfg, context), "checks": checks,
                "misses": misses, "meets": not misses, "meets_but_cache": all(c["ok"] for c in checks[1:])}


def _padding_numbers(r: dict) -> dict:
    return {k: r.get(k) for k in ("mean", "mean_ci", "gap", "gap_ci", "gap_raw", "detected_period", "periodicity_p",
                                  "worst", "worst_residue")}


def seed_distribution(design: str, models: list[dict], goals: Goals) -> dict:
    """One design judged by its seeds: how many meet every goal (with an exact 95% interval on the fraction), its
    worst seed (the largest gap upper bound under either padding, with that padding's gap, period and p), its
    cache (against the reference model and against full attention with the same KV heads), and the rule's
    verdict: `meets` only when it has >= goals.seeds seeds and every one of them meets every goal."""
    seeds = sorted(m["seed"] for m in models)
    meeting = sorted(m["seed"] for m in models if m["meets"])
    flat = sorted(m["seed"] for m in models if m["meets_but_cache"])
    lo, hi = clopper_pearson(len(meeting), len(seeds))
    worst = None
    for m in models:
        for padding, n in m["paddings"].items():
            if worst is None or n["gap_ci"][1] > worst["gap_ci"][1]:
                worst = {"seed": m["seed"], "padding": padding, "gap": n["gap"], "gap_ci": n["gap_ci"],
                         "period": n["detected_period"], "p": n["periodicity_p"], "mean": n["mean"]}
    role = "unrepaired" if all(m["role"] == "unrepaired" for m in models) else "design"
    return {"design": design, "role": role, "arch": models[0]["arch"], "recipe": models[0]["recipe"],
            "cache_ref": models[0]["cache_ref"], "cache_rel": models[0]["cache_rel"], "seeds": seeds, "meeting_seeds": meeting,
            "meeting_but_cache": flat, "failing_seeds": sorted(set(seeds) - set(meeting)), "rate": len(meeting) / len(seeds),
            "rate_ci": [lo, hi], "worst": worst, "enough_seeds": len(seeds) >= goals.seeds,
            "meets": len(seeds) >= goals.seeds and len(meeting) == len(seeds)}


def seed_count(n: int) -> str:
    return f"{n} seed" + ("s" if n != 1 else "")


def rule_text(seeds: int) -> str:
    """The seed rule in words (`Goals.seeds`); at one seed (the demo) with what `attach_record` adds."""
    if seeds == 1:
        return ("at one seed, a design is repaired when it meets every goal and, where a seed record measured its "
                "design and recipe at more seeds, every one of those meets every goal too")
    return (f"a design is repaired only when it was trained at >= {seed_count(seeds)} and every one of its "
            "seeds meets every goal")


def distribution_text(d: dict, named: bool = True) -> str:
    """'W12/S6 · 2 KV: 7 of 8 seeds meet every goal (95% exact interval 47-100%); worst seed 45: prefix gap 79.4
    [76.4, 82.3], period 6 (p = 0.0001)'."""
    lo, hi = d["rate_ci"]
    text = ((f"{d['design']}: " if named else "") + f"{len(d['meeting_seeds'])} of {seed_count(len(d['seeds']))} {'meets' if len(d['seeds']) == 1 else 'meet'} every goal "
            f"(95% exact interval {100 * lo:.0f}-{100 * hi:.0f}%)")
    flat = d.get("meeting_but_cache")  # absent from records written before it was kept
    if flat is not None and flat != d["meeting_seeds"]:
        text += f", {len(flat)} every goal but the cache"
    w = d["worst"]
    if w is not None:
        p = "untestable" if w["p"] is None else f"{w['p']:.4f}"
        text += (f"; worst seed {w['seed']}: {w['padding']} gap {w['gap']:.1f} [{w['gap_ci'][0]:.1f}, "
                 f"{w['gap_ci'][1]:.1f}], period {w['period']} (p = {p})")
    if named and d.get("cache_ref") is not None:
        text += f"; cache {d['cache_ref']:.3f} of the reference's ({d['cache_rel']:.3f} of full attention with its KV heads)"
    if not d["enough_seeds"]:
        text += " (too few seeds to be judged)"
    return text


def verdict_text(repaired: list[str], designs: list[dict], goals: Goals) -> str:
    """The rule, the repaired designs, and every candidate design's seed distribution."""
    head = (f"rule: {rule_text(goals.seeds)}; {flat_rule(goals.margin)}. "
            + (f"repaired: {', '.join(repaired)}" if repaired else "no design is repaired"))
    return "; ".join([head, *(distribution_text(d) + measured_text(d) for d in designs if d["role"] == "design")])


def measured_text(d: dict) -> str:
    """' · measured outside this run at 8 seeds (SOURCE): 7 of 8 seeds meet every goal ...' when a seed record of
    the same design and recipe was attached (`attach_record`), else ''."""
    r = d.get("measured")
    if r is None:
        return ""
    return f" · measured outside this run ({r['source']}): " + distribution_text(r, named=False) + fresh_text(r)


def fresh_text(d: dict) -> str:
    """'; at the fresh seeds 50-53 (first used after the design was fixed): 4 of 4 meet every goal but the cache, 0
    every goal' for a record's design with `fresh_seeds` (seeds first trained after it was fixed as the winner)."""
    f = fresh_counts(d)
    if f is None:
        return ""
    seeds, but_cache, every = f
    return (f"; at the fresh seeds {seeds} (first used after the design was fixed): "
            f"{but_cache} meet every goal but the cache, {every} every goal")


def fresh_counts(d: dict) -> tuple[str, str, int] | None:
    """A record design's fresh seeds (`fresh_seeds`) as ('50-53', '4 of 4' meeting every goal but the cache, how
    many meet every goal), or None without them."""
    fresh = d.get("fresh_seeds") or []
    ms = [m for m in d.get("per_seed", []) if m["seed"] in fresh]
    if not ms:
        return None
    seeds = f"{min(fresh)}-{max(fresh)}" if fresh == list(range(min(fresh), max(fresh) + 1)) else ", ".join(map(str, fresh))
    return seeds, f"{sum(m['meets_but_cache'] for m in ms)} of {len(ms)}", sum(m["meets"] for m in ms)


PER_SEED = ("seed", "meets", "meets_but_cache", "misses", "cache_ref", "cache_rel", "train_rel", "decode_rel", "paddings")  # a record's


def seed_record(result: dict, source: str) -> dict:
    """What `--record` keeps of a seed study: the rule, the reference and every candidate design's seed
    distribution with its per-seed numbers, keyed by architecture and training recipe (`attach_record`), each with
    the run that measured it; then the designs of an earlier record this run did not measure (`keep`)."""
    designs = [d | {"source": source, "per_seed": sorted(({k: m[k] for k in PER_SEED} for m in result["models"]
                                                           if m["design"] == d["design"]), key=lambda m: m["seed"])}
               for d in result["designs"] if d["role"] == "design"]
    return {"schema": RECORD_SCHEMA, "source": source, "rule": rule_text(result["goals"]["seeds"]),
            "flat_rule": flat_rule(result["goals"]["margin"]), "goals": result["goals"],
            "reference": result["reference"], "reference_model": result["reference_model"],
            "reference_numbers": result["reference_numbers"], "designs": designs + result.get("kept", [])}


def keep(result: dict, record: dict) -> None:
    """Add to `result` ("kept") the designs of an earlier seed record that it did not measure (same architecture
    and recipe), judged again by its goals against its reference from their per-seed numbers (lookup numbers
    under both paddings; step costs relative to the unrepaired model in the run that measured them), so a record
    grows run by run and every design in it is judged by one rule."""
    _check_schema(record)
    goals, mine = Goals(**result["goals"]), {(d["arch"], _key(d["recipe"])) for d in result["designs"]}
    result["kept"] = []
    for d in (d for d in record["designs"] if (d["arch"], _key(d["recipe"])) not in mine):
        models = [judge({"seed": s["seed"], "design": d["design"], "role": "design", "arch": d["arch"],
                         "recipe": d["recipe"], "train_rel": s["train_rel"], "decode_rel": s["decode_rel"],
                         "paddings": s["paddings"]}, result["reference_numbers"], result["reference_model"],
                        result["context"], goals) for s in d["per_seed"]]
        result["kept"].append(seed_distribution(d["design"], models, goals) | {
            "source": d.get("source", record["source"]), "per_seed": [{k: m[k] for k in PER_SEED} for m in models]}
            | ({"fresh_seeds": d["fresh_seeds"]} if d.get("fresh_seeds") else {}))


def _key(recipe: dict) -> str:
    return json.dumps(recipe, sort_keys=True)


def _check_schema(record: dict) -> None:
    if record.get("schema") != RECORD_SCHEMA:
        raise DataError(f"repair: a seed record needs schema {RECORD_SCHEMA!r}, got {record.get('schema')!r}")


def attach_record(result: dict, record: dict) -> None:
    """Give every design of `result` that a seed record measured (same architecture, same training recipe) its
    `measured` distribution, and restate the verdict with it: a one-seed run (the demo) then says at how many
    seeds its design was measured to meet every goal, and a design the record does not find repaired (the record's
    rule over its seeds) is not called repaired on this run's fewer seeds."""
    _check_schema(record)
    for d in result["designs"]:
        found = [r for r in record["designs"] if r["arch"] == d["arch"] and r["recipe"] == d["recipe"]]
        if found:
            d["measured"] = {"source": record["source"]} | found[0]
    refuted = {d["design"] for d in result["designs"] if "measured" in d and not d["measured"]["meets"]}
    result["repaired"] = [n for n in result["repaired"] if n not in refuted]
    result["verdict"] = verdict_text(result["repaired"], result["designs"], Goals(**result["goals"]))


def run_repair(root: Path, unrepaired: str, reference: str | None = None, context: int = 32768,
               bench: Bench | None = None, goals: Goals = Goals(), progress: bool = True,
               record: dict | None = None, previous: dict | None = None) -> dict:
    """Compare the directory's lookup evaluations under both paddings, check the goals, write DIR/repair/;
    `record`: a seed record (`seed_record`) whose measurements of the same designs the verdict cites; `previous`:
    a seed record whose other designs the result keeps (`keep`: for `--record`, and in the frontier plot)."""
    root = Path(root)
    summaries = {}
    for padding in PADDINGS:
        evals = sorted(p.parent for p in (root / "eval" / f"lookup-{padding}").glob("*/summary.json"))
        if not evals:
            raise DataError(f"{root}/eval/lookup-{padding}: no lookup evaluations (phasekv eval lookup --padding "
                            f"{padding} --out {root}/eval/lookup-{padding}/ALIAS)")
        b = (bench or Bench(batch=64, seq_len=96)) if padding == "prefix" else Bench(reps=0)  # the same costs
        summaries[padding] = compare(evals, root / "repair" / padding, reference=reference, baseline=unrepaired,
                                     protocol=padding, context=context, bench=b, progress=progress,
                                     baseline_flag="--unrepaired")
    result = evaluate(summaries, summaries["prefix"]["baseline"], context, goals, runs=root / "runs")
    if record is not None:
        attach_record(result, record)
    if previous is not None:
        keep(result, previous)
    write_json(root / "repair" / "goals.json", result, default=json_default)
    plot_frontier(result, root / "repair" / "frontier.png")
    return result


def plot_frontier(result: dict, path: Path) -> None:
    """Left two panels: gap (95% interval) against step cost (the larger of training and decode, relative to the
    unrepaired model), one per padding; the goals: cost 1.5x (dashed), flat (shaded: below the margin). Right: the
    cache frontier (`cache_panel`), with the designs kept from an earlier record."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    g = result["goals"]
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.6), gridspec_kw={"width_ratios": [1, 1, 1.1]})
    axes[1].sharey(axes[0])
    kept = [m | {"design": d["design"], "role": "design"} for d in result.get("kept", []) for m in d["per_seed"]]
    designs = list(dict.fromkeys(m["design"] for m in [*result["models"], *kept]))
    for ax, padding in zip(axes, PADDINGS, strict=False):
        ax.axhspan(0, g["margin"], color="C2", alpha=0.2, lw=0)
        ax.axvline(g["max_cost"], ls="--", color="C3", lw=0.8)
        for m in result["models"]:
            n = m["paddings"].get(padding)
            costs = [c for c in (m["train_rel"], m["decode_rel"]) if c is not None]
            if n is None or not costs:
                continue
            x, color = max(costs), design_color(designs, m["design"])
            err = np.array([[n["gap"] - n["gap_ci"][0]], [n["gap_ci"][1] - n["gap"]]]).clip(0)
            ax.errorbar([x], [n["gap"]], yerr=err, fmt="o", color=color, mfc=color if m["meets"] else "white", ms=6,
                        capsize=2, lw=0.8)
            if m["seed"] != 42:
                ax.annotate(f"seed {m['seed']}", (x, n["gap"]), fontsize=6, xytext=(4, 3), textcoords="offset points")
        ax.set_title(f"lookup, {padding} padding (shaded: flat, below δ = {g['margin']:g})", fontsize=9)
        ax.set_xlabel(f"step cost, max(train, decode) / unrepaired (dashed: {g['max_cost']:g}x)")
    axes[0].set_ylabel("gap, best - worst phase (points, bias-corrected)")
    cache_panel(axes[2], [*result["models"], *kept], designs, g, result["reference"])
    handles = [plt.Line2D([], [], marker="o", ls="", color=design_color(designs, d), label=d) for d in designs]
    fig.legend(handles=handles, loc="lower center", ncol=2, fontsize=7, frameon=False, bbox_to_anchor=(0.5, -0.02 - 0.035 * ((len(designs) + 1) // 2)))
    fig.suptitle("The repair's frontier: weak-phase gap against cost (filled: every goal met at that seed) and against "
                 "cache (filled: every goal but the cache)", fontsize=10)
    write_figure(path, fig, dpi=DPI, bbox_inches="tight")
    plt.close(fig)


def cache_panel(ax, models: list[dict], designs: list[str], goals: dict, reference: str) -> None:
    """Cache against the model's worst gap: x the cache bytes relative to the reference model (log; a design's
    seeds spread a little apart), y the largest 95% upper bound of the gap under either padding, one point per
    design and seed (filled: every goal but the cache met); shaded: flat by equivalence (below the margin);
    dotted: the frontier's targets 1/8, 1/4, 1/2; dashed: the cache goal."""
    ax.axhspan(0, goals["margin"], color="C2", alpha=0.2, lw=0)
    for target in (1 / 2, 1 / 4, 1 / 8):
        ax.axvline(target, ls=":", color="grey", lw=0.8)
    ax.axvline(goals["max_cache"], ls="--", color="C3", lw=0.8)
    seen: dict[str, int] = {}
    for m in models:
        hi = [n["gap_ci"][1] for n in m["paddings"].values()]
        if not hi or m.get("cache_ref") is None:
            continue
        i = seen[m["design"]] = seen.get(m["design"], -1) + 1
        color = design_color(designs, m["design"])
        ax.plot([m["cache_ref"] * 1.012 ** i], [max(hi)], "o", color=color, ms=6,
                mfc=color if m.get("meets_but_cache", m["meets"]) else "white")
    ax.set_xscale("log", base=2)
    ax.set_xlim(0.1, 1.05)
    ax.set_yscale("symlog", linthresh=5)
    ax.set_ylim(-0.4, 100)  # a gap of 0 stays in view
    ax.set_xlabel(f"cache bytes / {reference}'s (log)")
    ax.set_ylabel("worst gap's 95% upper bound (points)")
    ax.set_title(f"cache frontier: shaded flat (< δ = {goals['margin']:g}); dotted 1/8, 1/4, 1/2; dashed the goal",
                 fontsize=9)


def design_color(designs: list[str], design: str):
    """One colour per design, distinct for up to 20 designs (tab20)."""
    import matplotlib

    return matplotlib.colormaps["tab20"](designs.index(design) % 20)
