"""The tables of docs/results/seeds.md, from the runs themselves (Markdown on stdout).

    python sweeps/seeds_tables.py probes runs/seeds/results.jsonl demo  # sweeps/seed_probe.py's rows (of one plan)
    python sweeps/seeds_tables.py demo runs/demo-seeds                  # each model and claim at each seed
    python sweeps/seeds_tables.py needle runs/needle-70 runs/needle-71  # the needle's chains at each seed

"Learns" is the rule of sweeps/seeds.md: full attention's prefix mean >= 90 and flat under both paddings; a
compressed model above the retrieval floor (prefix padding). "Periodic": detected period = S and p < 0.05 (prefix).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from phasekv.config.names import parse_name, seed_of, unseeded
from phasekv.eval.stats import FLAT, clopper_pearson, flatness, retrieves
from phasekv.report.tables import LEARNED_MEAN


def _compressed(model: str) -> bool:
    return parse_name(model).get("window", 1) > 0  # the name alone: any preset's model


def learns(model: str, paddings: dict[str, dict]) -> bool:
    """The rule of sweeps/seeds.md on a model's lookup summaries (padding -> summary or probe row)."""
    pre = paddings.get("prefix")
    if pre is None:
        return False
    if not _compressed(model):
        return pre["mean"] >= LEARNED_MEAN and all(flatness(s["gap_ci"]) == FLAT for s in paddings.values())
    return retrieves(pre["mean_ci"], 100 / 16)  # chance: one of the prompt's 16 records


def periodic(model: str, pre: dict) -> str:
    """'yes' when a compressed model's prefix profile has its stride's period (detected, p < 0.05); '' otherwise."""
    if not _compressed(model):
        return ""
    p = pre.get("p", (pre.get("periodicity") or {}).get("p_value"))
    return "yes" if pre["detected_period"] == parse_name(model)["stride"] and p is not None and p < 0.05 else "no"


def _gap(s: dict) -> str:
    return f"{s['mean']:.1f} | {s['gap']:.1f} [{s['gap_ci'][0]:.1f}, {s['gap_ci'][1]:.1f}] | {s['detected_period']}"


def rate(k: int, n: int) -> str:
    lo, hi = clopper_pearson(k, n)
    return f"{k} of {n} (exact 95%: {100 * lo:.0f}-{100 * hi:.0f}%)"


def probes(path: str, plan: str | None = None) -> None:
    """sweeps/seed_probe.py's rows, those of one plan ("demo", "study") when `plan` is given."""
    rows = [json.loads(line) for line in Path(path).read_text().splitlines()]
    rows = [r for r in rows if plan is None or r["plan"] == plan]
    print("| model | recipe | seed | held-out (last) | left the plateau | prefix: mean | gap [95%] | period | "
          "in-sequence gap | learns |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        exit_step = next((s for s, h in r["heldout"] if h > 60), None)
        seeds = f"{r['seed']}" + (f" (data {r['data_seed']})" if r.get("data_seed") is not None else "")
        inseq = r.get("in-sequence")
        print(f"| {r['model']} | {r['tag']} | {seeds} | {r['heldout'][-1][1]:.1f}% | {exit_step or 'no'} | "
              f"{_gap(r['prefix'])} | {'' if inseq is None else _gap(inseq).split(' | ')[1]} | "
              f"{'yes' if learns(r['model'], {k: r[k] for k in ('prefix', 'in-sequence') if k in r}) else 'no'} |")


def demo(root: str) -> None:
    """Each model's lookup at each seed, the learned counts per design, and every claim's verdict at each seed."""
    root = Path(root)
    manifest = json.loads((root / "demo.json").read_text())
    by_design: dict[str, list[bool]] = {}
    print("| model | seed | held-out | prefix: mean | gap [95%] | period | in-sequence: mean | gap [95%] | period | "
          "learns | periodic with S |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for alias, m in manifest["models"].items():
        s = {p: json.loads((root / "eval" / f"lookup-{p}" / alias / "summary.json").read_text())
             for p in ("prefix", "in-sequence") if (root / "eval" / f"lookup-{p}" / alias / "summary.json").is_file()}
        if not s:
            continue
        ok = learns(m["name"], s)
        by_design.setdefault(unseeded(m["name"]), []).append(ok)
        done = json.loads((root / "runs" / alias / "done.json").read_text())
        print(f"| {unseeded(m['name'])} | {seed_of(m['name'])} | {100 * done['val_accuracy']:.1f}% | {_gap(s['prefix'])} | "
              f"{_gap(s['in-sequence']) if 'in-sequence' in s else ''} | {'yes' if ok else '**no**'} | {periodic(m['name'], s['prefix'])} |")
    print()
    for design, oks in by_design.items():
        print(f"- {design}: learns at {rate(sum(oks), len(oks))}")
    claims = json.loads((root / "report" / "claims.json").read_text())
    seeds = sorted({int(s) for c in claims for s in (c["evidence"].get("seeds") or {})})
    print()
    print("| claim | verdict | " + " | ".join(f"{s}" for s in seeds) + " |")
    print("|---|---|" + "---|" * len(seeds))
    mark = {"reproduced": "✓", "not reproduced": "✗", "not testable here": "–"}
    for c in claims:
        per = c["evidence"].get("seeds") or {}
        cells = [mark[per[str(s)]["verdict"]] if str(s) in per else "" for s in seeds]
        print(f"| {c['claim']} | {c['verdict']}: {c['reason'].split(';')[0].split('(exact')[0].strip()} | "
              + " | ".join(cells) + " |")


STAGES = ("demo", "base", "256", "1024")  # a needle chain's stages, in order (run directory suffixes)


def _held_out(run: Path) -> str:
    """A chain stage's last held-out accuracy (its training's own validation), or '–' when it did not run."""
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()] if run.exists() else []
    vals = [r["val_accuracy"] for r in rows if "val_accuracy" in r]
    return f"{100 * vals[-1]:.1f}" if vals else "–"


def _needle_role(r: dict) -> tuple[str, bool]:
    """What a control must show at the training length and whether it does: a compressed chain periodic with its
    stride (detected period = S, p < 0.05), full attention flat (the audit passes)."""
    if _compressed(r["model"]):
        p = r["period_p_value"]
        return "periodic with S", r["detected_period"] == r["stride"] and p is not None and p < 0.05
    return "flat", r["exit_code"] == 0


def needle(*roots: str) -> None:
    """Each chain at each seed (several `phasekv study --needle` directories): held-out accuracy after each stage,
    the audit at the training length, and the controls' rates over seeds."""
    print("| model | seed | held-out: demo / base / 256 / 1,024 | context | prompts | mean [95%] | gap [95%] | period | "
          "p at S | audit (exit) | shows |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    counts: dict[str, list[int]] = {}
    for root in map(Path, roots):
        for r in json.loads((root / "needle.json").read_text())["controls"]:
            p = "" if r["period_p_value"] is None else f"{r['period_p_value']:.4f}"
            train = r["context"] < 1024
            stages = " / ".join(_held_out(root / "runs" / f"{_alias(r['model'])}-{st}") for st in STAGES)
            role, shown = _needle_role(r)
            if train:
                counts.setdefault(f"{unseeded(r['model'])}: {role}", []).append(shown)
            print(f"| {unseeded(r['model'])} | {seed_of(r['model'])} | {stages if train else ''} | {r['context']:,} | "
                  f"{r['n_prompts']:,} | {r['mean']:.1f} [{r['mean_ci'][0]:.1f}, {r['mean_ci'][1]:.1f}] | {r['gap']:.1f} "
                  f"[{r['gap_ci'][0]:.1f}, {r['gap_ci'][1]:.1f}] | {r['detected_period']} | {p} | {r['verdict']} "
                  f"({r['exit_code']}) | {('yes' if shown else 'no') if train else ''} |")
    print()
    for what, shown in counts.items():
        print(f"- {what} at the training length: {rate(sum(shown), len(shown))}")


def _alias(model: str) -> str:
    from phasekv.config import ModelConfig

    return ModelConfig.from_name(model, preset="tiny").alias


if __name__ == "__main__":
    {"probes": probes, "demo": demo, "needle": needle}[sys.argv[1]](*sys.argv[2:])
