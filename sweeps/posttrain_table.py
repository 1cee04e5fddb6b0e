"""The seed table of `phasekv posttrain` runs (docs/results/posttrain.md): one row per run directory, then how many
reached flat with an exact (Clopper-Pearson) 95% interval and their steps to flat; `--figure PNG`: every run's gap
and mean under one layout against fine-tuning steps.

    python sweeps/posttrain_table.py runs/posttrain/w8s4/seed* [--figure curves.png --layout prefix]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from phasekv.eval.figure import PALETTE, Figure, Guide, Panel, Trace, to_png
from phasekv.eval.stats import clopper_pearson


def cell(n: dict | None) -> str:
    if n is None:
        return "not run"
    return (f"{n['mean']:.1f}, gap {n['gap']:.1f} [{n['gap_ci'][0]:.1f}, {n['gap_ci'][1]:.1f}], period "
            f"{n['detected_period']}")


def row(out: Path) -> tuple[str, dict]:
    rec = json.loads((out / "posttrain.json").read_text())
    before, after = rec["checks"][0]["layouts"], rec["checks"][-1]["layouts"]
    first = rec["steps_to_flat"]
    steps = "not flat by " + str(rec["checks"][-1]["step"]) if first is None else f"**{first}** ({rec['fraction']:.2f})"
    cells = [f"{cell(before.get(n))} → {cell(after.get(n))}" for n in rec["layouts"]]
    return f"| {rec['name']} | {steps} | " + " | ".join(cells) + " |", rec


def figure(recs: list[dict], layout: str) -> Figure:
    """One line per run: `layout`'s gap (95% band) and mean against fine-tuning steps; δ dashed."""
    gaps, means = [], []
    for i, rec in enumerate(recs):
        pts = [(c["step"], c["layouts"][layout]) for c in rec["checks"] if layout in c["layouts"]]
        x, color, name = [s for s, _ in pts], PALETTE[i % len(PALETTE)], rec["name"].split(" · ")[-1]
        dash = "solid" if i < len(PALETTE) else "dash"  # the palette's colours again, dashed
        gaps += [Trace("band", x, [n["gap_ci"][0] for _, n in pts], [n["gap_ci"][1] for _, n in pts], color=color,
                       alpha=0.12), Trace("line", x, [n["gap"] for _, n in pts], name=name, color=color, marker="circle",
                                         size=2.5, width=1.0, dash=dash)]
        means.append(Trace("line", x, [n["mean"] for _, n in pts], color=color, marker="circle", size=2.5, width=1.0,
                           dash=dash))
    margin = recs[0]["settings"]["margin"]
    return Figure([Panel(gaps, title=f"{layout} gap (95% band; δ = {margin:g} dashed)", xlabel="fine-tuning steps",
                         ylabel="points", ylim=(-2, 102), guides=[Guide(y=margin)], legend=True),
                   Panel(means, title=f"{layout} mean", xlabel="fine-tuning steps", ylabel="%", ylim=(-2, 102))],
                  title=f"{recs[0]['name'].split(' · seed')[0]} continued (phasekv posttrain)",
                  size=(10, 3.6))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--figure", type=Path)
    ap.add_argument("--layout", default="prefix")
    a = ap.parse_args()
    rows = [row(Path(d)) for d in a.dirs if (Path(d) / "posttrain.json").is_file()]
    if not rows:
        sys.exit("no posttrain.json under the directories given")
    names = rows[0][1]["layouts"]
    print("| model | steps to flat (of the base's) | " + " | ".join(f"{n}: base → last check" for n in names) + " |")
    print("|---" * (2 + len(names)) + "|")
    for line, _ in rows:
        print(line)
    flat = [r["steps_to_flat"] for _, r in rows if r["steps_to_flat"] is not None]
    lo, hi = clopper_pearson(len(flat), len(rows))
    print(f"\nflat at {len(flat)} of {len(rows)} (95% exact interval {100 * lo:.0f}-{100 * hi:.0f}%); steps to flat: "
          + (", ".join(map(str, sorted(flat))) or "none"))
    if a.figure:
        to_png(figure([r for _, r in rows], a.layout), a.figure)
        print(f"wrote {a.figure}")


if __name__ == "__main__":
    main()
