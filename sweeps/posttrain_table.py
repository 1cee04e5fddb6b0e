"""The seed table of `phasekv posttrain` runs (docs/results/posttrain.md): one row per run directory, then how many
reached flat with an exact (Clopper-Pearson) 95% interval and their steps to flat.

    python sweeps/posttrain_table.py runs/posttrain/w8s4/seed*    # OUT directories of phasekv posttrain
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

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


def main(dirs: list[str]) -> None:
    rows = [row(Path(d)) for d in dirs if (Path(d) / "posttrain.json").is_file()]
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


if __name__ == "__main__":
    main(sys.argv[1:])
