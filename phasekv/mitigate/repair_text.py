"""The repair's results in words (`phasekv.mitigate.results`): the seed rule, each design's seed distribution, its
worst seed, the fresh seeds and the verdict, each sentence formatted here once for the verdict, the command line's
tables and the report."""

from __future__ import annotations

from phasekv.eval.stats import flat_rule
from phasekv.mitigate.results import Goals, Seeds, Worst


def seed_count(n: int) -> str:
    return f"{n} seed" + ("s" if n != 1 else "")


def rule_text(seeds: int) -> str:
    """The seed rule in words (`Goals.seeds`); at one seed (the demo) with what `attach_record` adds."""
    if seeds == 1:
        return ("at one seed, a design is repaired when it meets every goal and, where a seed record measured its "
                "design and recipe at more seeds, every one of those meets every goal too")
    return (f"a design is repaired only when it was trained at >= {seed_count(seeds)} and every one of its "
            "seeds meets every goal")


def worst_text(w: Worst) -> str:
    """'45: prefix gap 79.4 [76.4, 82.3], period 6 (p = 0.0001)'."""
    p = "untestable" if w.p is None else f"{w.p:.4f}"
    return (f"{w.seed}: {w.padding} gap {w.gap:.1f} [{w.gap_ci[0]:.1f}, {w.gap_ci[1]:.1f}], period {w.period} "
            f"(p = {p})")


def distribution_text(d: Seeds, named: bool = True) -> str:
    """'W12/S6 · 2 KV: 7 of 8 seeds meet every goal (95% exact interval 47-100%); worst seed 45: prefix gap 79.4
    [76.4, 82.3], period 6 (p = 0.0001)'."""
    lo, hi = d.rate_ci
    verb = "meets" if len(d.seeds) == 1 else "meet"
    text = ((f"{d.design}: " if named else "") + f"{len(d.meeting_seeds)} of {seed_count(len(d.seeds))} {verb} every "
            f"goal (95% exact interval {100 * lo:.0f}-{100 * hi:.0f}%)")
    if d.meeting_but_cache is not None and d.meeting_but_cache != d.meeting_seeds:
        text += f", {len(d.meeting_but_cache)} every goal but the cache"
    if d.worst is not None:
        text += f"; worst seed {worst_text(d.worst)}"
    if named and d.cache_ref is not None:
        text += f"; cache {d.cache_ref:.3f} of the reference's ({d.cache_rel:.3f} of full attention with its KV heads)"
    if not d.enough_seeds:
        text += " (too few seeds to be judged)"
    return text


def verdict_text(repaired: list[str], designs: list[Seeds], goals: Goals) -> str:
    """The rule, the repaired designs, and every candidate design's seed distribution."""
    head = (f"rule: {rule_text(goals.seeds)}; {flat_rule(goals.margin)}. "
            + (f"repaired: {', '.join(repaired)}" if repaired else "no design is repaired"))
    return "; ".join([head, *(distribution_text(d) + measured_text(d) for d in designs if d.role == "design")])


def measured_text(d: Seeds) -> str:
    """' · measured outside this run at 8 seeds (SOURCE): 7 of 8 seeds meet every goal ...' when a seed record of
    the same design and recipe was attached (`attach_record`), else ''."""
    r = d.measured
    if r is None:
        return ""
    return f" · measured outside this run ({r.source}): " + distribution_text(r, named=False) + fresh_text(r)


def fresh_text(d: Seeds) -> str:
    """'; at the fresh seeds 50-53 (first used after the design was fixed): 4 of 4 meet every goal but the cache, 0
    every goal' for a record's design with `fresh_seeds` (seeds first trained after it was fixed as the winner)."""
    f = fresh_counts(d)
    if f is None:
        return ""
    seeds, but_cache, every = f
    return (f"; at the fresh seeds {seeds} (first used after the design was fixed): "
            f"{but_cache} meet every goal but the cache, {every} every goal")


def fresh_counts(d: Seeds) -> tuple[str, str, int] | None:
    """A record design's fresh seeds (`fresh_seeds`) as ('50-53', '4 of 4' meeting every goal but the cache, how
    many meet every goal), or None without them."""
    fresh = d.fresh_seeds or []
    ms = [m for m in d.per_seed or [] if m.seed in fresh]
    if not ms:
        return None
    seeds = f"{min(fresh)}-{max(fresh)}" if fresh == list(range(min(fresh), max(fresh) + 1)) else ", ".join(map(str, fresh))
    return seeds, f"{sum(m.meets_but_cache for m in ms)} of {len(ms)}", sum(m.meets for m in ms)
