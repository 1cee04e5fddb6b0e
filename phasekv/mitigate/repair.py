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
This module is the rule; the records it fills are `phasekv.mitigate.results`, their words
`phasekv.mitigate.repair_text`, the figure `phasekv.mitigate.repair_figure`.
"""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

from phasekv.config import ModelConfig
from phasekv.errors import ConfigError, DataError
from phasekv.eval.run import json_default
from phasekv.eval.stats import FLAT, NOT_FLAT, clopper_pearson, flat_rule, flatness
from phasekv.io import write_json
from phasekv.mitigate.compare import compare
from phasekv.mitigate.cost import Bench
from phasekv.mitigate.repair_figure import plot_frontier
from phasekv.mitigate.repair_text import rule_text, verdict_text
from phasekv.mitigate.results import (
    PADDINGS,
    Check,
    CompareRow,
    Goals,
    Lookup,
    ModelResult,
    RepairResult,
    SeedRecord,
    Seeds,
    Worst,
)
from phasekv.mitigate.results import RECORD_SCHEMA as RECORD_SCHEMA  # re-exported: read beside the rule
from phasekv.mitigate.results import SCHEMA as SCHEMA
from phasekv.model.cli import cache_bytes

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


def _check(goal: str, value, limit, ok: bool, miss: str) -> Check:
    return Check(goal, value, limit, bool(ok), "" if ok else miss)


def flat_miss(padding: str, n: Lookup, margin: float) -> str:
    """Why a padding's profile is not flat: its gap shown above the margin, or an interval too wide to tell."""
    lo, hi = n.gap_ci
    gap = f"{padding} gap {n.gap:.1f} [{lo:.1f}, {hi:.1f}]"
    if flatness(n.gap_ci, margin) == NOT_FLAT:
        return f"{gap} above δ = {margin:g}"
    return f"{gap} not shown below δ = {margin:g} (the interval reaches {hi:.1f}: more prompts can tell)"


def cache_check(cfg: ModelConfig, ref_cfg: ModelConfig, context: int, goals: Goals) -> Check:
    """The cache goal: cache bytes at the context against the reference model's."""
    cache = cache_vs(cfg, ref_cfg, context)
    return _check("cache", cache, goals.max_cache, cache <= goals.max_cache,
                  f"cache {cache:.4f} of {ref_cfg.name}'s > {goals.max_cache:g} "
                  f"(by {100 * (cache / goals.max_cache - 1):.2f}%)")


def check_model(numbers: dict[str, Lookup], ref: dict[str, Lookup], train: float | None, decode: float | None,
                goals: Goals) -> list[Check]:
    """Every goal of one model but the cache: numbers and ref (padding -> its and the reference's lookup), its
    training and decode step relative to the unrepaired model's."""
    out = []
    for kind, rel in (("train", train), ("decode", decode)):
        out.append(_check(kind, rel, goals.max_cost, rel is not None and rel <= goals.max_cost,
                          "not measured" if rel is None else f"{kind} {rel:.2f}x > {goals.max_cost:g}x"))
    for padding in PADDINGS:
        r, f = numbers.get(padding), ref.get(padding)
        if r is None or f is None:
            out.append(_check(f"{padding}: evaluated", None, None, False, f"{padding}: not evaluated"))
            continue
        out.append(_check(f"{padding}: flat", r.gap_ci[1], goals.margin, flatness(r.gap_ci, goals.margin) == FLAT,
                          flat_miss(padding, r, goals.margin)))
        drop = f.mean - r.mean
        out.append(_check(f"{padding}: mean", r.mean, f.mean - goals.max_mean_drop, drop <= goals.max_mean_drop,
                          f"{padding} mean {r.mean:.1f}, {drop:.1f} below full"))
    return out


def judge(arch: str, paddings: dict[str, Lookup], train_rel: float | None, decode_rel: float | None,
          ref: dict[str, Lookup], ref_name: str, context: int, goals: Goals, **identity) -> ModelResult:
    """One model (its architecture, lookup numbers and step costs) checked against every goal: its cache against
    the reference model (`cache_ref`, the goal's) and against full attention with the same KV heads (`cache_rel`),
    the checks, the misses and whether it meets every goal; `identity`: its label, design, seed, role, recipe."""
    cfg = ModelConfig.from_name(arch)
    cache = cache_check(cfg, ModelConfig.from_name(ref_name), context, goals)
    others = check_model(paddings, ref, train_rel, decode_rel, goals)
    misses = [c.miss for c in (cache, *others) if not c.ok]
    return ModelResult(arch=arch, paddings=paddings, train_rel=train_rel, decode_rel=decode_rel, cache_ref=cache.value,
                       cache_rel=cache_same_kv(cfg, context), checks=[cache, *others], misses=misses, meets=not misses,
                       meets_but_cache=all(c.ok for c in others), **identity)


def evaluate(summaries: dict[str, dict], unrepaired: str, context: int = 32768, goals: Goals = Goals(),
             runs: Path | None = None) -> RepairResult:
    """The goals table from the compare summaries of both paddings (padding -> phasekv.compare/1 summary; the
    costs are read from the prefix one). `runs`: the training run directories by alias (an evaluation's
    directory name), whose recipes tell apart one model name trained two ways."""
    rows = {p: {r.label: r for r in map(CompareRow.from_dict, s["models"])} for p, s in summaries.items()}
    pre = rows["prefix"]
    ref_label = summaries["prefix"]["reference"]
    if ref_label is None:
        raise DataError("repair: no full-attention model among the evaluations (the goals are relative to it)")
    if unrepaired not in pre:
        raise ConfigError(f"repair: --unrepaired {unrepaired!r} is not among the evaluated models: {', '.join(pre)}")
    ref = {p: rows[p][ref_label].lookup() for p in PADDINGS if ref_label in rows[p]}
    ref_name = pre[ref_label].model
    recipes = {label: recipe(runs / Path(row.eval_dir).name) if runs else {} for label, row in pre.items()}
    models = [judge(arch, {p: rows[p][label].lookup() for p in PADDINGS if label in rows[p]}, *rel, ref,
                    ref_name, context, goals, label=name, design=design_name(name), seed=seed, recipe=recipes[label],
                    role="unrepaired" if label == unrepaired else "design")
              for label, name, arch, seed, rel in _candidates(pre, unrepaired, recipes)]
    designs = {}
    for m in models:
        designs.setdefault(m.design, []).append(m)
    per_design = [seed_distribution(d, ms, goals) for d, ms in designs.items()]
    repaired = [d.design for d in per_design if d.meets]
    ref_flat = {p: flatness(n.gap_ci, goals.margin) for p, n in ref.items()}
    warning = "".join(f"; warning: the reference {ref_label} is not flat by the rule under {p} padding (gap "
                      f"{ref[p].gap:.1f} [{ref[p].gap_ci[0]:.1f}, {ref[p].gap_ci[1]:.1f}])"
                      for p, f in ref_flat.items() if f != FLAT)
    return RepairResult(goals=goals, rule=flat_rule(goals.margin), context=context, reference=ref_label,
                        reference_model=ref_name, unrepaired=unrepaired, reference_numbers=ref, reference_flat=ref_flat,
                        models=models, designs=per_design, repaired=repaired,
                        verdict=verdict_text(repaired, per_design, goals) + warning)


def _candidates(pre: dict[str, CompareRow], unrepaired: str, recipes: dict[str, dict]):
    """(label, name, architecture, seed, (train, decode) step relative to the unrepaired model's) of each
    compressed model of a comparison (label -> row): its name says its phase ensemble and how its recipe differs."""
    unrep = pre[unrepaired]
    for label, row in pre.items():
        cfg = ModelConfig.from_name(row.model)
        if not cfg.compressed:
            continue
        k = row.ensemble_k or 1
        name = cfg.name + (f" · phase ensemble {k}" if k > 1 else "") + recipe_tag(recipes[label], recipes[unrepaired])
        rel = tuple(None if None in (mine, base) else mine / base for mine, base in (
            (row.train_cost_rel, unrep.train_cost_rel), (row.decode_cost_rel, unrep.decode_cost_rel)))
        yield label, name, design_name(cfg.name), cfg.seed, rel


def seed_distribution(design: str, models: list[ModelResult], goals: Goals) -> Seeds:
    """One design judged by its seeds: how many meet every goal (with an exact 95% interval on the fraction), its
    worst seed (the largest gap upper bound under either padding, with that padding's gap, period and p), its
    cache (against the reference model and against full attention with the same KV heads), and the rule's
    verdict: `meets` only when it has >= goals.seeds seeds and every one of them meets every goal."""
    seeds = sorted(m.seed for m in models)
    meeting = sorted(m.seed for m in models if m.meets)
    lo, hi = clopper_pearson(len(meeting), len(seeds))
    role = "unrepaired" if all(m.role == "unrepaired" for m in models) else "design"
    return Seeds(design=design, role=role, arch=models[0].arch, recipe=models[0].recipe, cache_ref=models[0].cache_ref,
                 cache_rel=models[0].cache_rel, seeds=seeds, meeting_seeds=meeting,
                 meeting_but_cache=sorted(m.seed for m in models if m.meets_but_cache),
                 failing_seeds=sorted(set(seeds) - set(meeting)), rate=len(meeting) / len(seeds), rate_ci=[lo, hi],
                 worst=worst_seed(models), enough_seeds=len(seeds) >= goals.seeds,
                 meets=len(seeds) >= goals.seeds and len(meeting) == len(seeds))


def worst_seed(models: list[ModelResult]) -> Worst | None:
    """The seed and padding with the largest gap upper bound (the first of equals), None without numbers."""
    found = [(m, p, n) for m in models for p, n in m.paddings.items()]
    if not found:
        return None
    m, padding, n = max(found, key=lambda x: x[2].gap_ci[1])
    return Worst(m.seed, padding, n.gap, n.gap_ci, n.detected_period, n.periodicity_p, n.mean)


def seed_record(result: RepairResult, source: str) -> SeedRecord:
    """What `--record` keeps of a seed study: the rule, the reference and every candidate design's seed
    distribution with its per-seed numbers, keyed by architecture and training recipe (`attach_record`), each with
    the run that measured it; then the designs of an earlier record this run did not measure (`keep`)."""
    designs = [replace(d, source=source, per_seed=sorted((m.seed_result() for m in result.models
                                                           if m.design == d.design), key=lambda m: m.seed))
               for d in result.designs if d.role == "design"]
    return SeedRecord(source=source, rule=rule_text(result.goals.seeds), flat_rule=flat_rule(result.goals.margin),
                      goals=result.goals, reference=result.reference, reference_model=result.reference_model,
                      reference_numbers=result.reference_numbers, designs=designs + (result.kept or []))


def keep(result: RepairResult, record: SeedRecord) -> None:
    """Add to `result` ("kept") the designs of an earlier seed record that it did not measure (same architecture
    and recipe), judged again by its goals against its reference from their per-seed numbers (lookup numbers
    under both paddings; step costs relative to the unrepaired model in the run that measured them), so a record
    grows run by run and every design in it is judged by one rule."""
    mine = {(d.arch, _key(d.recipe)) for d in result.designs}
    result.kept = []
    for d in (d for d in record.designs if (d.arch, _key(d.recipe)) not in mine):
        models = [judge(d.arch, s.paddings, s.train_rel, s.decode_rel, result.reference_numbers, result.reference_model,
                        result.context, result.goals, seed=s.seed, design=d.design, role="design", recipe=d.recipe)
                  for s in d.per_seed]
        result.kept.append(replace(seed_distribution(d.design, models, result.goals), source=d.source or record.source,
                                   per_seed=[m.seed_result() for m in models], fresh_seeds=d.fresh_seeds or None))


def _key(recipe: dict) -> str:
    return json.dumps(recipe, sort_keys=True)


def attach_record(result: RepairResult, record: SeedRecord) -> None:
    """Give every design of `result` that a seed record measured (same architecture, same training recipe) its
    `measured` distribution, and restate the verdict with it: a one-seed run (the demo) then says at how many
    seeds its design was measured to meet every goal, and a design the record does not find repaired (the record's
    rule over its seeds) is not called repaired on this run's fewer seeds."""
    for d in result.designs:
        found = [r for r in record.designs if r.arch == d.arch and r.recipe == d.recipe]
        if found:
            d.measured = replace(found[0], source=found[0].source or record.source)
    refuted = {d.design for d in result.designs if d.measured is not None and not d.measured.meets}
    result.repaired = [n for n in result.repaired if n not in refuted]
    result.verdict = verdict_text(result.repaired, result.designs, result.goals)


def run_repair(root: Path, unrepaired: str, reference: str | None = None, context: int = 32768,
               bench: Bench | None = None, goals: Goals = Goals(), progress: bool = True,
               record: dict | None = None, previous: dict | None = None) -> RepairResult:
    """Compare the directory's lookup evaluations under both paddings, check the goals, write DIR/repair/;
    `record`: a seed record (`seed_record`, as its JSON file holds it) whose measurements of the same designs the
    verdict cites; `previous`: a seed record whose other designs the result keeps (`keep`: for `--record`, and in
    the frontier plot)."""
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
        attach_record(result, SeedRecord.from_dict(record))
    if previous is not None:
        keep(result, SeedRecord.from_dict(previous))
    write_json(root / "repair" / "goals.json", result.to_dict(), default=json_default)
    plot_frontier(result, root / "repair" / "frontier.png")
    return result
